"""Learning curves and time breakdowns of runs, drawn with matplotlib (the `plot` extra).

Runs that share a config but for `run.seed` (and where they were written) form a group: its
curve is the mean over its seeds, on the x values all of them reached, with a band from the
lowest to the highest seed. `curves` and `time_breakdown` compute what is drawn; `draw_runs`
lays it out in a figure and `plot_runs` saves that as a PNG.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import config_to_dict
from agentenv_jax.workflow.api import Run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

XAxis = Literal["steps", "time"]
# Run settings that do not make runs different experiments.
_NOT_THE_EXPERIMENT = ("seed", "name", "run_dir", "progress", "progress_interval_s")
# The per-update time breakdown: learner first, then the env ranks' mean.
TIME_KEYS = (
    "time/learner_wait_s",
    "time/learner_update_s",
    "time/actor_env_step_s",
    "time/actor_inference_s",
    "time/actor_transport_wait_s",
    "time/actor_serving_s",
)


@dataclasses.dataclass(frozen=True)
class Curve:
    """One group's curve: `x [N]`, and the mean, lowest and highest value over its runs."""

    label: str
    runs: int
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def experiment_key(run: Run) -> str:
    """What a run's group is keyed by: its config without seed and location."""
    config = config_to_dict(run.config)
    config["run"] = {k: v for k, v in config["run"].items() if k not in _NOT_THE_EXPERIMENT}
    return repr(config)


def group_runs(runs: Sequence[Run]) -> list[list[Run]]:
    """Runs grouped by experiment, in the order their groups first appear."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(experiment_key(run), []).append(run)
    return list(groups.values())


def series(run: Run, x: XAxis, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)` of one run's records that have `metric`. Time is wall-clock seconds summed over
    the run's sessions (each resumed session's clock starts at 0)."""
    walls = {t["update"]: t.get("wall_s") for t in run.timings}
    xs, ys, offset, last_wall = [], [], 0.0, 0.0
    for record in run.records:
        wall = walls.get(record["update"]) or 0.0
        if wall < last_wall:  # a resumed session began
            offset += last_wall
        last_wall = wall
        value = record.get(metric)
        if value is None:
            continue
        xs.append(record["env_steps"] if x == "steps" else offset + wall)
        ys.append(float(value))
    return np.asarray(xs, np.float64), np.asarray(ys, np.float64)


def _label(group: list[Run]) -> str:
    config = group[0].config
    name = f"{config.env.id} {config.algorithm.name}"
    if len(group) == 1:
        return f"{name} ({group[0].run_dir.name})"
    return f"{name} ({len(group)} seeds)"


def curves(runs: Sequence[Run], x: XAxis = "steps", metric: str = "episode_return_mean"):
    """One `Curve` per group of `runs` (see the module docstring)."""
    result = []
    for group in group_runs(runs):
        per_run = [series(run, x, metric) for run in group]
        per_run = [(xs, ys) for xs, ys in per_run if len(xs)]
        if not per_run:
            continue
        if len(per_run) == 1:
            xs, ys = per_run[0]
            result.append(Curve(_label(group), 1, xs, ys, ys, ys))
            continue
        # The x values of the run with most points, up to where every run has data.
        reach = min(xs[-1] for xs, _ in per_run)
        grid = max((xs for xs, _ in per_run), key=len)
        grid = grid[grid <= reach]
        values = np.stack([np.interp(grid, xs, ys) for xs, ys in per_run])
        result.append(
            Curve(
                _label(group),
                len(per_run),
                grid,
                values.mean(0),
                values.min(0),
                values.max(0),
            )
        )
    return result


def time_breakdown(run: Run) -> dict[str, float]:
    """Median seconds per update of each part of `TIME_KEYS` the run recorded (the median,
    so that the first update's compilation does not dominate)."""
    totals: dict[str, list[float]] = {}
    for timing in run.timings:
        for key in TIME_KEYS:
            if timing.get(key) is not None:
                totals.setdefault(key, []).append(float(timing[key]))
    return {key: float(np.median(values)) for key, values in totals.items()}


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed), or a `ConfigError` naming the
    extra to install."""
    try:
        import matplotlib
    except ImportError as err:
        # A missing extra is a setup mistake like a bad config: one line, not a traceback.
        raise ConfigError(
            f"agentenv plot needs matplotlib ({err}): pip install 'agentenv_jax[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_runs(
    runs: Sequence[Run],
    x: XAxis = "steps",
    metrics: Sequence[str] = ("episode_return_mean",),
    dpi: int = 100,
) -> Figure:
    """The figure `plot_runs` saves (a matplotlib `Figure`; the caller closes it): each
    metric's curves (one panel per metric) and the time breakdown per group (a stacked bar of
    the first run of each group), `5 * panels` by 4 inches at `dpi`."""
    plt = _pyplot()
    panels = len(metrics) + 1
    # Constrained layout makes room for what lies outside the axes (the bar chart's legend,
    # wrapped tick labels) inside the fixed figure size, so nothing is cut off.
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), dpi=dpi, layout="constrained")
    for axis, metric in zip(axes, metrics, strict=False):
        for curve in curves(runs, x, metric):
            # A run folder's name makes a long label: wrapped, the legend stays in its panel.
            label = textwrap.fill(curve.label, 45, break_on_hyphens=False)
            line = axis.plot(curve.x, curve.mean, label=label)[0]
            if curve.runs > 1:
                axis.fill_between(curve.x, curve.low, curve.high, alpha=0.2, color=line.get_color())
        axis.set_xlabel("env steps" if x == "steps" else "wall-clock seconds")
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    axis = axes[-1]
    groups = group_runs(runs)
    bottoms = np.zeros(len(groups))
    for key in TIME_KEYS:
        heights = np.array([time_breakdown(group[0]).get(key, 0.0) for group in groups])
        if heights.any():
            axis.bar(range(len(groups)), heights, bottom=bottoms, label=key.removeprefix("time/"))
            bottoms += heights
    # About 50 characters of small type fit under the panel: wrap each bar's label to its share.
    labels = [textwrap.fill(_label(g), max(12, 50 // len(groups))) for g in groups]
    axis.set_xticks(range(len(groups)), labels, fontsize="small")
    axis.set_ylabel("seconds per update (median)")
    # The bars fill the panel, so any legend inside it covers some: it goes to their right,
    # listed top to bottom as the parts are stacked.
    handles, names = axis.get_legend_handles_labels()
    axis.legend(
        handles[::-1],
        names[::-1],
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
    )
    return figure


def plot_runs(
    runs: Sequence[Run],
    output: str | Path,
    x: XAxis = "steps",
    metrics: Sequence[str] = ("episode_return_mean",),
    dpi: int = 100,
) -> Path:
    """Draw `runs` into a PNG at `output`, as `draw_runs` lays them out; returns its path."""
    plt = _pyplot()
    figure = draw_runs(runs, x, metrics, dpi)
    try:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(output)
    finally:
        plt.close(figure)
    return output
