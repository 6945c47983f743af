"""Learning curves over seeds and time breakdowns: what is computed, and the PNG `agentenv plot`
writes."""

from __future__ import annotations

import itertools
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

import agentenv_jax as ae
from agentenv_jax.workflow.plotting import curves, draw_runs, series, time_breakdown

from conftest import REPO, agentenv_command, run_command

pytestmark = pytest.mark.slow  # every test here starts a process or trains


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of one config and a run of another (a lower learning rate)."""
    folder = tmp_path_factory.mktemp("runs")
    made = []
    for name, seed, steps, lr in (
        ("s0", 0, 1280, 1e-3),
        ("s1", 1, 1280, 1e-3),
        ("lr", 0, 1024, 3e-4),
    ):
        made.append(
            ae.train(
                "cartpole_ppo",
                run={"total_env_steps": steps, "run_dir": str(folder), "name": name, "seed": seed},
                algorithm={"learning_rate": lr, "num_epochs": 2},
                overrides=["run.progress=false"],
            )
        )
    return made


def test_seeds_of_one_config_make_one_curve_with_a_band(runs):
    s0, s1, other = runs
    seeds, single = curves(runs, "steps", "episode_return_mean")
    assert (seeds.runs, single.runs) == (2, 1) and "2 seeds" in seeds.label
    np.testing.assert_array_equal(seeds.x, [256, 512, 768, 1024, 1280])
    by_seed = np.stack([series(run, "steps", "episode_return_mean")[1] for run in (s0, s1)])
    assert not np.array_equal(by_seed[0], by_seed[1])  # the seeds differ: the band is real
    np.testing.assert_allclose(seeds.mean, by_seed.mean(0))
    np.testing.assert_allclose(seeds.low, by_seed.min(0))
    np.testing.assert_allclose(seeds.high, by_seed.max(0))
    np.testing.assert_array_equal(single.x, [256, 512, 768, 1024])
    times, _ = series(s0, "time", "episode_return_mean")
    assert np.all(np.diff(times) > 0)
    breakdown = time_breakdown(s0)
    assert {"time/learner_update_s", "time/actor_env_step_s"} <= set(breakdown)
    assert all(v >= 0 for v in breakdown.values())


def test_plot_writes_pngs_for_one_run_and_for_a_group(runs, tmp_path):
    one = tmp_path / "one.png"
    proc = run_command(
        agentenv_command("plot", str(runs[0].run_dir), "-o", str(one)), timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert plt.imread(one).shape[:2] == (400, 1000)  # 2 panels of 5 x 4 inches at 100 dpi
    group = tmp_path / "group.png"
    proc = run_command(
        agentenv_command(
            "plot",
            *(str(run.run_dir) for run in runs),
            "--x",
            "time",
            "--metric",
            "episode_return_mean",
            "--metric",
            "loss/value",
            "-o",
            str(group),
        ),
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    image = plt.imread(group)
    assert image.shape[:2] == (400, 1500)  # 3 panels
    assert image[..., :3].std() > 0.05  # not a blank page


@pytest.mark.parametrize("count", [1, 3], ids=["one-run", "two-groups"])
def test_the_time_breakdown_legend_is_beside_the_bars_and_nothing_is_cut(runs, count):
    """The stacked bars fill their panel: a legend inside it covered some (it did). It lies
    beside them, and the legend and tick labels stay inside the figure."""
    figure = draw_runs(runs[:count], metrics=["episode_return_mean"])
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        axis = figure.axes[-1]
        legend = axis.get_legend().get_window_extent(renderer)
        bars = [patch.get_window_extent(renderer) for patch in axis.patches]
        assert bars and not [bar for bar in bars if legend.overlaps(bar)]
        page = figure.bbox
        shown = [legend] + [t.get_window_extent(renderer) for t in axis.get_xticklabels()]
        for box in shown:
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0, (box, page)
            assert box.y1 <= page.y1, (box, page)
        labels = axis.get_xticklabels()  # one per group, side by side
        assert not any(
            a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))
            for a, b in itertools.pairwise(labels)
        )
    finally:
        plt.close(figure)


def test_plot_without_matplotlib_is_one_line_and_exit_2(runs, tmp_path):
    # `import matplotlib` fails as it does where the `plot` extra is not installed.
    script = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from agentenv_jax.workflow.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = run_command(
        [sys.executable, "-c", script, "plot", str(runs[0].run_dir), "-o", str(tmp_path / "x.png")],
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "agentenv: error: agentenv plot needs matplotlib (import of matplotlib halted; "
        "None in sys.modules): pip install 'agentenv_jax[plot]'"
    ]
    assert not (tmp_path / "x.png").exists()
