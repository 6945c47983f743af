"""The slow CartPole of the env-rank scaling benchmark: each step sleeps its extra time."""

from __future__ import annotations

import pytest

from agentenv_jax.envs import slow


def test_each_step_sleeps_its_extra_time(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(slow.time, "sleep", slept.append)
    env = slow.slow_cartpole(step_s=0.01)
    env.reset(seed=0)
    for _ in range(5):
        env.step(0)
    assert slept == [0.01] * 5
    with pytest.raises(ValueError, match="step_s = -1 is not allowed"):
        slow.slow_cartpole(step_s=-1)
