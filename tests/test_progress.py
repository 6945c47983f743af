"""The progress line: its ETA is the rest of the budget at the rate since the first update; turning
it off leaves the rest of a run's output."""

from __future__ import annotations

import io
import json

import pytest

from agentenv_jax.metrics.logger import ProgressLine, format_duration

from conftest import agentenv_command, run_command, settings


def test_durations_read_as_minutes_or_hours():
    assert [format_duration(s) for s in (0, 59.6, 61, 3599, 3600, 10 * 86400)] == [
        "0:00",
        "1:00",
        "1:01",
        "59:59",
        "1:00:00",
        "99:00:00",
    ]


def test_eta_is_the_steps_left_at_the_rate_since_the_first_update():
    """The first update also paid for compiling: the rate (and so the ETA) starts after it."""
    times = iter([100.0, 110.0])
    stream = io.StringIO()
    line = ProgressLine(100_000, True, 5.0, stream, clock=lambda: next(times))
    extra = {"episode_return_mean": 20.0, "policy_lag_mean": 0.0, "steps_per_s": 25.6}
    line.update({"update": 1, "env_steps": 256} | extra, force=True)
    line.update({"update": 40, "env_steps": 10_256} | extra, force=True)
    first, second = stream.getvalue().splitlines()
    assert first.endswith("| eta --")
    assert second.endswith("| eta 1:30")  # 89,744 steps left at 1,000 steps/s


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["cartpole_ppo", "cartpole_ppo_jax"])
def test_progress_false_turns_off_only_the_progress_line(tmp_path, experiment):
    """`run.progress=false` leaves the run folder and the closing summary as they are."""
    proc = run_command(
        agentenv_command(
            "train",
            experiment,
            *settings("run.progress=false", "run.total_env_steps=1024", f"run.run_dir={tmp_path}"),
        ),
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    shown = proc.stdout + proc.stderr
    assert f" run        {run_dir}" in shown and "(reconciles)" in shown
    assert f"env steps {summary['env_steps']:,}" in shown
    assert "| eta " not in shown  # no progress line
