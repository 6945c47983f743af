"""Hyperparameter sweeps: a sweep file, its trials, running them, and the results tables."""
