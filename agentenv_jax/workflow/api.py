"""The Python API for notebooks and scripts: train a run, load one from disk, evaluate it.

    import agentenv_jax as ae

    run = ae.train("cartpole_ppo", run={"total_env_steps": 20_000, "seed": 1})
    run.summary["episode_return_mean"], run.metrics()[-1]["episode_return_mean"]
    ae.evaluate(run.run_dir, episodes=10).mean
    same = ae.load_run(run.run_dir)

`train` takes a config (an `ExperimentConfig`, a YAML path, a shipped experiment's name, or
None for the defaults), then overrides: whole sections as keyword arguments (`run={...}`), and
dotted `key=value` strings (`overrides=["algorithm.learning_rate=3e-4"]`), checked as the CLI
checks them. It trains as `agentenv train` does: over MPI when this process was started by a
launcher, else in this process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    read_config_file,
)
from agentenv_jax.config.schema import ExperimentConfig


@dataclasses.dataclass(frozen=True)
class Run:
    """A run folder as the API sees it: its config, summary and per-update records, and the
    trained policy's parameters (loaded from the newest checkpoint when first asked for)."""

    run_dir: Path
    config: ExperimentConfig
    summary: dict[str, Any]  # summary.json (empty while a run has not finished)
    records: list[dict[str, Any]]  # metrics.jsonl, one per update
    timings: list[dict[str, Any]]  # timings.jsonl, one per update

    @functools.cached_property
    def params(self) -> Any:
        """The policy's parameters (host pytree) from the newest checkpoint: the actor-critic's
        for PPO and IMPALA, the actor's for SAC."""
        from agentenv_jax.checkpoint.run_folder import policy_params

        return policy_params(self.run_dir, self.config)

    def metrics(self) -> Any:
        """Every update's record joined with its timings: a pandas DataFrame indexed by
        `update` when pandas is installed, else a list of dicts."""
        by_update = {t["update"]: t for t in self.timings}
        rows = [{**by_update.get(r["update"], {}), **r} for r in self.records]
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows).set_index("update")

    def evaluate(self, episodes: int = 10, **options: Any) -> Any:
        """`agentenv_jax.evaluate` of this run (see `evaluation.evaluate`)."""
        from agentenv_jax.workflow.evaluation import evaluate

        return evaluate(self.run_dir, episodes, **options)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(run_dir: str | Path) -> Run:
    """A run folder from disk (finished, interrupted or still running)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder: it has no config.yaml")
    summary_path = run_dir / "summary.json"
    return Run(
        run_dir=run_dir,
        config=load_config(run_dir / "config.yaml"),
        summary=json.loads(summary_path.read_text()) if summary_path.is_file() else {},
        records=_read_jsonl(run_dir / "metrics.jsonl"),
        timings=_read_jsonl(run_dir / "timings.jsonl"),
    )


def resolve_config(
    config: ExperimentConfig | str | Path | None = None,
    overrides: Sequence[str] = (),
    **sections: Mapping[str, Any],
) -> ExperimentConfig:
    """The config `train` would run: `config`, its sections updated key by key from `sections`,
    then the dotted `overrides`; `ConfigError` naming what is wrong."""
    if isinstance(config, ExperimentConfig):
        raw = config_to_dict(config)
    elif config is None:
        raw = {}
    else:
        raw = read_config_file(config)
    for name, values in sections.items():
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"{name} = {values!r} is not allowed: expected a mapping of the section's "
                "fields, e.g. run={'seed': 1}"
            )
        current = raw.get(name)
        raw[name] = {**(current if isinstance(current, Mapping) else {}), **values}
    return config_from_dict(apply_overrides(raw, overrides))


def train(
    config: ExperimentConfig | str | Path | None = None,
    /,
    *,
    ranks: int = 1,
    overrides: Sequence[str] = (),
    **sections: Mapping[str, Any],
) -> Run | None:
    """Train a run (see the module docstring) and return it, its parameters included. Under a
    launcher every rank calls this; the learner gets the run, env ranks get None. With
    `ranks > 1` (from a process without a launcher: a notebook, a script) the run is an
    `mpiexec -n ranks` job that this process follows, showing its progress."""
    from agentenv_jax.runtime.launch import train as run_training
    from agentenv_jax.transport.launcher import launched_by_mpi

    resolved = resolve_config(config, overrides, **sections)
    if ranks != 1:
        if launched_by_mpi():
            raise ConfigError(
                f"ranks = {ranks!r} is not allowed under a launcher: this process already is "
                "one rank of a job (start the job with mpiexec -n instead)"
            )
        from agentenv_jax.runtime.mpi_job import run_mpi_job

        return load_run(run_mpi_job(resolved, ranks))
    result = run_training(resolved)
    if result.run_dir is None:  # an env rank: the learner wrote the folder
        return None
    run = load_run(result.run_dir)
    run.__dict__["params"] = result.params  # what the learner holds: no checkpoint read
    return run
