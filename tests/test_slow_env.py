"""The slow CartPole of the env-rank scaling benchmark: each step takes its extra time."""

from __future__ import annotations

import time

import pytest

from agentenv_jax.envs.slow import slow_cartpole


def test_each_step_sleeps_its_extra_time():
    env = slow_cartpole(step_s=0.01)
    env.reset(seed=0)
    started = time.perf_counter()
    for _ in range(5):
        env.step(0)
    assert time.perf_counter() - started >= 0.05
    with pytest.raises(ValueError, match="step_s = -1 is not allowed"):
        slow_cartpole(step_s=-1)
