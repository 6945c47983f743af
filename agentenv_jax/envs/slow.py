"""A CartPole whose every step takes a fixed extra time: a stand-in for a costly simulator, to
measure what env ranks buy (`benchmarks/env_rank_scaling.py`).

    env.id: agentenv_jax.envs.slow:slow_cartpole
    env.kwargs: {step_s: 0.001}

The delay sleeps (as an env waiting on I/O or another process would), so env ranks that step
slow envs need no core each while they wait.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class SlowStep(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Sleeps `step_s` seconds in every `step` of the wrapped env. It records its arguments, as
    Gymnasium's own wrappers do, so that `env.spec` can make it again (`check_env` does)."""

    def __init__(self, env: gym.Env, step_s: float):
        if step_s < 0:
            raise ValueError(f"step_s = {step_s!r} is not allowed: expected seconds >= 0")
        gym.utils.RecordConstructorArgs.__init__(self, step_s=step_s)
        super().__init__(env)
        self._step_s = step_s

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        time.sleep(self._step_s)
        return self.env.step(action)


def slow_cartpole(step_s: float = 0.001) -> gym.Env:
    """CartPole-v1 taking `step_s` extra seconds per step."""
    return SlowStep(gym.make("CartPole-v1"), step_s)
