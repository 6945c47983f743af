"""A sweep's results tables, read from its trials' run folders.

`trials.csv` has one row per trial: its parameters and seed, whether it finished, the metric
at its end, steps/s, wall time and compile time (from the run's `summary.json`). A trial that
was stopped and resumed ran in several sessions, and each session's `summary.json` replaces the
one before: the sweep keeps each earlier session's wall time in `sessions/TRIAL.jsonl` when it
resumes the trial, so the trial's `wall_s` is its sessions' summed and its `steps_per_s` its env
steps over that time (its compile time stays its last session's). `configs.csv`
has one row per config, over its finished seeds: the interquartile mean of the metric with a
95% stratified-bootstrap confidence interval (rliable), mean steps/s, wall and compile time,
sorted best first. `results.md` holds both as Markdown tables.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.workflow.sweeps.spec import SweepSpec, Trial

BOOTSTRAP_REPS = 2000
_TIMING_COLUMNS = ("env_steps", "steps_per_s", "wall_s", "compile_s", "compile_cache_hits")


def require_statistics() -> None:
    """rliable is what the config table needs; without it, say so before any trial runs."""
    try:
        import rliable.library  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"a sweep's results table needs rliable ({err}): pip install 'agentenv_jax[sweep]'"
        ) from None


def trial_folder(spec: SweepSpec, trial: Trial) -> Path:
    return spec.folder / "trials" / trial.name


def trial_status(folder: Path) -> str:
    """finished, interrupted (stopped early, resumable), incomplete (started, killed or
    failed before it ended) or pending (not started)."""
    summary = folder / "summary.json"
    if summary.is_file():
        return "interrupted" if json.loads(summary.read_text()).get("interrupted") else "finished"
    return "incomplete" if folder.exists() else "pending"


def sessions_file(spec: SweepSpec, trial: Trial) -> Path:
    """The trial's earlier sessions, one JSON line each (`keep_newest_session`)."""
    return spec.folder / "sessions" / f"{trial.name}.jsonl"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none if it is missing); a torn last line (a process
    killed mid-write) is left out."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def newest_session(folder: Path) -> dict[str, Any] | None:
    """The run's newest session, as `keep_newest_session` keeps it: `started`, the time of its
    start event in events.jsonl (which names it), and `wall_s`, from its summary.json. A session
    that ended without writing one (killed outright) counts from its start event to its last
    event (a checkpoint), marked `estimated`: summary.json is then an earlier session's, older
    than the start. None before the run's first start."""
    events = _read_jsonl(folder / "events.jsonl")
    starts = [i for i, event in enumerate(events) if event.get("event") == "start"]
    if not starts:
        return None
    session = events[starts[-1] :]
    started = float(session[0]["time"])
    summary = folder / "summary.json"
    if summary.is_file() and summary.stat().st_mtime >= started:
        wall_s = float(json.loads(summary.read_text())["wall_s"])
        return {"started": started, "wall_s": wall_s, "estimated": False}
    return {"started": started, "wall_s": float(session[-1]["time"]) - started, "estimated": True}


def keep_newest_session(spec: SweepSpec, trial: Trial) -> None:
    """Before the trial resumes, add its newest session to `sessions_file` (the resumed
    session's summary.json replaces that session's), unless it is there already (a resume that
    failed before it started)."""
    session = newest_session(trial_folder(spec, trial))
    path = sessions_file(spec, trial)
    if session is None or session["started"] in {s["started"] for s in _read_jsonl(path)}:
        return
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(session) + "\n")


def whole_trial_timing(
    summary: dict[str, Any], earlier: Sequence[dict[str, Any]]
) -> dict[str, float]:
    """`wall_s` and `steps_per_s` of a whole trial: its last session's `summary` (summary.json)
    with its `earlier` sessions (each with `wall_s`). The wall times add up; the rate is the
    trial's env steps over them, so steps trained again after a session died past its last
    checkpoint count as time lost. With no earlier session, the summary's own figures."""
    if not earlier:
        return {"wall_s": summary["wall_s"], "steps_per_s": summary["steps_per_s"]}
    wall_s = float(summary["wall_s"]) + sum(float(s["wall_s"]) for s in earlier)
    return {"wall_s": wall_s, "steps_per_s": summary["env_steps"] / max(wall_s, 1e-9)}


def _metric(folder: Path, summary: dict[str, Any], metric: str) -> float:
    """The metric at the trial's end: its summary's value, else its last record's."""
    if metric in summary:
        return float(summary[metric])
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    if metric not in last:
        raise ConfigError(
            f"metric = {metric!r} is neither in {folder / 'summary.json'} nor in the last "
            f"record of metrics.jsonl; keys: {', '.join(sorted({*summary, *last}))}"
        )
    return float(last[metric])


def trial_row(spec: SweepSpec, trial: Trial) -> dict[str, Any]:
    folder = trial_folder(spec, trial)
    status = trial_status(folder)
    row: dict[str, Any] = {"trial": trial.name, "config": trial.config_index}
    row |= {key: value for key, value in trial.params}
    row |= {"seed": trial.seed, "status": status, spec.metric: None}
    row |= dict.fromkeys(_TIMING_COLUMNS)
    if status == "finished":
        summary = json.loads((folder / "summary.json").read_text())
        row[spec.metric] = _metric(folder, summary, spec.metric)
        row |= {key: summary.get(key) for key in _TIMING_COLUMNS}
        # The newest session is the summary's own; the kept ones are those before it.
        newest = newest_session(folder)
        earlier = [
            s
            for s in _read_jsonl(sessions_file(spec, trial))
            if newest is None or s["started"] < newest["started"]
        ]
        if earlier:
            row |= whole_trial_timing(summary, earlier)
    return row


def interquartile_means(
    scores: dict[int, list[float]],
) -> dict[int, tuple[float, float, float]]:
    """Per config: (IQM, CI low, CI high) of its seeds' scores, by rliable's stratified
    bootstrap with a fixed random state (the same runs give the same table)."""
    import numpy as np
    from rliable import library, metrics

    score_arrays = {c: np.asarray(v, dtype=np.float64)[:, None] for c, v in scores.items() if v}
    if not score_arrays:
        return {}
    with warnings.catch_warnings():
        # rliable hands arch a RandomState, which arch 7 accepts with a FutureWarning.
        warnings.simplefilter("ignore", FutureWarning)
        points, intervals = library.get_interval_estimates(
            score_arrays,
            lambda s: np.array([metrics.aggregate_iqm(s)]),
            reps=BOOTSTRAP_REPS,
            random_state=np.random.RandomState(0),
        )
    return {
        c: (float(points[c][0]), float(intervals[c][0, 0]), float(intervals[c][1, 0]))
        for c in score_arrays
    }


def _mean(values: Sequence[Any]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None


def config_rows(spec: SweepSpec, trials: Sequence[Trial], rows: Sequence[dict]) -> list[dict]:
    """One row per config over its finished trials, best first (configs with no finished
    trial last)."""
    by_config: dict[int, list[dict]] = {}
    params: dict[int, tuple[tuple[str, Any], ...]] = {}
    for trial, row in zip(trials, rows, strict=True):
        by_config.setdefault(trial.config_index, []).append(row)
        params[trial.config_index] = trial.params
    finished = {
        c: [r[spec.metric] for r in group if r["status"] == "finished"]
        for c, group in by_config.items()
    }
    estimates = interquartile_means(finished)
    table = []
    for config, group in by_config.items():
        done = [r for r in group if r["status"] == "finished"]
        iqm, low, high = estimates.get(config, (None, None, None))
        row: dict[str, Any] = {"config": config, **dict(params[config])}
        row |= {
            "seeds": f"{len(done)}/{len(group)}",
            f"{spec.metric}_iqm": iqm,
            "ci_low": low,
            "ci_high": high,
            f"{spec.metric}_mean": _mean([r[spec.metric] for r in done]),
        }
        row |= {f"{k}_mean": _mean([r[k] for r in done]) for k in _TIMING_COLUMNS[1:4]}
        table.append(row)
    sign = -1.0 if spec.goal == "max" else 1.0
    return sorted(
        table,
        key=lambda r: (r[f"{spec.metric}_iqm"] is None, sign * (r[f"{spec.metric}_iqm"] or 0.0)),
    )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, list | tuple):
        return json.dumps(value)
    return str(value)


def _csv(rows: Sequence[dict]) -> str:
    """Full precision (for analysis); lists as JSON; None as an empty cell."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(
        {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in row.items()}
        for row in rows
    )
    return out.getvalue()


def _markdown(rows: Sequence[dict]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    # Array tasks of one sweep rewrite the tables as each finishes: a reader never sees half.
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_results(spec: SweepSpec, trials: Sequence[Trial]) -> tuple[list[dict], list[dict]]:
    """Write trials.csv, configs.csv and results.md into the sweep folder from what its trials
    have left so far; return (trial rows, config rows)."""
    rows = [trial_row(spec, trial) for trial in trials]
    configs = config_rows(spec, trials, rows)
    folder = spec.folder
    _write_atomically(folder / "trials.csv", _csv(rows))
    _write_atomically(folder / "configs.csv", _csv(configs))
    done = sum(r["status"] == "finished" for r in rows)
    _write_atomically(
        folder / "results.md",
        f"# Sweep {spec.name}\n\n{done} of {len(rows)} trials finished; `{spec.metric}` at the "
        f"end of each run, goal {spec.goal}. Configs: interquartile mean over seeds with a 95% "
        f"stratified-bootstrap confidence interval (rliable, {BOOTSTRAP_REPS} resamples), best "
        f"first.\n\n## Configs\n\n{_markdown(configs)}\n## Trials\n\n{_markdown(rows)}",
    )
    return rows, configs
