"""agentenv_jax: distributed actor-critic reinforcement learning with JAX and MPI.

The Python API (`train`, `load_run`, `evaluate`, `load_config`, `sweep`, `load_sweep`) is
imported on first use, so that importing the package stays cheap (each MPI rank's supervisor
process imports it too).
"""

from __future__ import annotations

from typing import Any

_API = {
    "Run": "agentenv_jax.workflow.api",
    "load_run": "agentenv_jax.workflow.api",
    "train": "agentenv_jax.workflow.api",
    "evaluate": "agentenv_jax.workflow.evaluation",
    "load_config": "agentenv_jax.config.loading",
    "sweep": "agentenv_jax.workflow.sweeps.loading",
    "load_sweep": "agentenv_jax.workflow.sweeps.loading",
    "Sweep": "agentenv_jax.workflow.sweeps.loading",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'agentenv_jax' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
