"""Agent programs trained through an OpenAI-compatible endpoint: what a run's calls record and
how they become training sequences."""
