"""Orbax checkpoints of the learner: train state, counters, normalizers and the config.

`CheckpointStore` and `CheckpointError` are imported on first use: the store brings in JAX and
orbax, which a process that only reads a run folder (a rank refusing a bad config, a
supervisor) does without.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CheckpointError", "CheckpointStore"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agentenv_jax.checkpoint import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
