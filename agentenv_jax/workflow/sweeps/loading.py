"""A sweep as the Python API sees it: its tables, its trials' runs, and running one.

import agentenv_jax as ae

sweep = ae.sweep("cartpole_ppo_lr", parallel=2)      # or ae.load_sweep("runs/cartpole_ppo_lr")
sweep.configs                                        # configs.csv (a DataFrame with pandas)
sweep.scores()                                       # {config: final metric per seed}
[run.summary["episode_return_mean"] for run in sweep.runs(config=0)]
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import read_yaml_mapping


def _number(text: str) -> Any:
    """A CSV cell back as what it was written from: None, a number, a list, or the text."""
    if text == "":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, int | float | list) else text


def _read_table(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _frame(rows: list[dict[str, Any]]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        return rows
    return pd.DataFrame(rows)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A sweep folder: `trials` and `configs` are its tables (pandas DataFrames when pandas
    is installed, else lists of dicts), `metric` the column they are ranked by."""

    folder: Path
    metric: str
    trial_rows: list[dict[str, Any]]
    config_rows: list[dict[str, Any]]

    @property
    def trials(self) -> Any:
        return _frame(self.trial_rows)

    @property
    def configs(self) -> Any:
        return _frame(self.config_rows)

    def runs(self, config: int | None = None) -> list[Any]:
        """The finished trials' runs (`agentenv_jax.Run`), of one config if given."""
        from agentenv_jax.workflow.api import load_run

        return [
            load_run(self.folder / "trials" / row["trial"])
            for row in self.trial_rows
            if row["status"] == "finished" and config in (None, row["config"])
        ]

    def scores(self) -> dict[int, list[float]]:
        """Per config, its finished trials' final metric (one value per seed): what rliable's
        `get_interval_estimates` and `probability_of_improvement` take, as `[seeds, 1]` arrays."""
        scores: dict[int, list[float]] = {}
        for row in self.trial_rows:
            if row["status"] == "finished":
                scores.setdefault(row["config"], []).append(float(row[self.metric]))
        return scores


def load_sweep(folder: str | Path) -> Sweep:
    """A sweep folder's tables (as written when its trials last ended, or by `--table`)."""
    folder = Path(folder)
    record = folder / "sweep.yaml"
    if not record.is_file() or not (folder / "trials.csv").is_file():
        raise ConfigError(
            f"{str(folder)!r} is not a sweep folder with results: expected sweep.yaml and "
            "trials.csv (written by agentenv sweep)"
        )
    # The strict reader: the record may be edited or copied in, so an alias bomb is refused.
    recorded = read_yaml_mapping(record, "sweep record", "expected the sweep's identity")
    if "metric" not in recorded:
        raise ConfigError(f"sweep record {str(record)!r} has no metric (written by agentenv sweep)")
    metric = recorded["metric"]
    return Sweep(
        folder, metric, _read_table(folder / "trials.csv"), _read_table(folder / "configs.csv")
    )


def sweep(
    sweep_file: str | Path, /, *, parallel: int | None = None, overrides: Sequence[str] = ()
) -> Sweep:
    """Run a sweep file (or shipped sweep) as `agentenv sweep` does, from this process, and
    return it; a sweep that already ran continues where it was. `ConfigError` if a trial
    failed or the sweep was stopped."""
    from agentenv_jax.workflow.sweeps.runner import SweepRunner, prepare
    from agentenv_jax.workflow.sweeps.spec import read_sweep

    spec = read_sweep(sweep_file, overrides, parallel)
    trials = prepare(spec)
    status = SweepRunner(spec, trials, lambda line: print(line, flush=True)).run()
    if status != 0:
        raise ConfigError(
            f"sweep {spec.name!r} did not finish (status {status}); see {spec.folder / 'logs'}"
        )
    return load_sweep(spec.folder)
