"""agentenv_jax: distributed actor-critic reinforcement learning with JAX and MPI.

The Python API (`train`, `load_run`, `evaluate`, `load_config`, `sweep`, `load_sweep`) is
imported on first use, so that importing the package stays cheap (each MPI rank's supervisor
process imports it too).

The package is built in layers, each importing only itself and the layers below it (bottom
first; `docs/layers.md`, checked by `tests/test_layers.py`):

1. config: `config`, the schema of a run and its loading.
2. core: `algorithms`, `networks`, `envs`, `parallel`, `checkpoint`; pure updates, models,
   environments, device meshes, checkpoint files.
3. experience: `buffers`, `transport`, `metrics`; where experience lives, how it moves between
   ranks, what is counted.
4. loops: `actor`, `learner`; the env rank's and the learner's loops.
5. runtime: `runtime`; the driver of every run shape, the roles, the supervisor.
6. workflow: `workflow`; the API, the CLI, evaluation, sweeps, Slurm scripts and plots.
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
