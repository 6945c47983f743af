"""Orbax checkpoints of the learner: train state, counters, normalizers and the config."""

from agentenv_jax.checkpoint.store import CheckpointError, CheckpointStore

__all__ = ["CheckpointError", "CheckpointStore"]
