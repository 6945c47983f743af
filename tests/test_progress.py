"""The progress line: its ETA is the rest of the budget at the rate since the first update."""

from __future__ import annotations

import io

from agentenv_jax.metrics.logger import ProgressLine, format_duration


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
