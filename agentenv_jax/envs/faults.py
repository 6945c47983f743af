"""Env faults: re-create an env that raises, and a wrapper that injects faults for testing.

`RecreateOnFault` wraps each env of a sync/async vector env. When the inner env raises in `step`,
it is closed and made anew, and the step is reported as a truncation with
`info["env_fault"]` set: the env rank marks that step invalid (it has no real outcome), drops
the partial episode from the episode statistics, and counts the fault. A fault in `reset` is
retried on a fresh env. `env.on_fault: fail` skips the wrapper, so the first fault stops the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

FAULT_KEY = "env_fault"
MAX_RESET_ATTEMPTS = 3


class RecreateOnFault(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Makes the env anew after it raises; the faulted step comes back as a flagged truncation.

    `env` is the first env, `make_env` makes each replacement (`around(make_env)` does both).
    The constructor arguments are recorded, so Gymnasium can re-create the wrapper from the
    env's spec (as `gymnasium.utils.env_checker.check_env` does).
    """

    def __init__(self, env: gym.Env, make_env: Callable[[], gym.Env]):
        gym.utils.RecordConstructorArgs.__init__(self, make_env=make_env)
        super().__init__(env)
        self._make_env = make_env

    @classmethod
    def around(cls, make_env: Callable[[], gym.Env]) -> RecreateOnFault:
        return cls(make_env(), make_env)

    def _recreate(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - a broken env may fail to close too; it is dropped
            pass
        self.env = self._make_env()

    def reset(self, **kwargs: Any):
        for attempt in range(MAX_RESET_ATTEMPTS):
            try:
                return self.env.reset(**kwargs)
            except Exception:
                if attempt == MAX_RESET_ATTEMPTS - 1:
                    raise
                self._recreate()
        raise AssertionError("unreachable")

    def step(self, action: Any):
        try:
            return self.env.step(action)
        except Exception as err:  # noqa: BLE001 - any simulator error is a fault to survive
            # The replacement starts from a seed drawn from the broken env's generator, so a
            # run that repeats its faults repeats what follows them too.
            seed = int(self.env.np_random.integers(2**31))
            self._recreate()
            obs, info = self.reset(seed=seed)
            info = {**info, FAULT_KEY: f"{type(err).__name__}: {err}"}
            return obs, 0.0, False, True, info


def fault_mask(info: dict[str, Any], num_envs: int) -> np.ndarray:
    """Which envs of a vector step faulted (SAME_STEP vector envs put it in `final_info`)."""
    final_info = info.get("final_info", {})
    mask = final_info.get("_" + FAULT_KEY)
    return np.zeros(num_envs, bool) if mask is None else np.asarray(mask, bool)


class FaultInjectingEnv(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """A flaky simulator for tests: each episode raises `RuntimeError` in `step` with
    probability `rate`, at a step drawn uniformly from its first `horizon` steps.

    The rate is per episode, so a run with `rate: 0.01` loses about 1% of its episodes whatever
    their length. A reset with a seed restarts the stream at `(seed, reset seed)`; until then
    each instance made in a process draws from its own, `(seed, instance number)`. So a
    repeated run repeats its faults exactly, and a seeded reset decides the faults that follow
    as it decides the episode (as `gymnasium.utils.env_checker.check_env` expects).
    """

    _instances = 0

    def __init__(self, env: gym.Env, rate: float, seed: int = 0, horizon: int = 200):
        gym.utils.RecordConstructorArgs.__init__(self, rate=rate, seed=seed, horizon=horizon)
        super().__init__(env)
        self._rate = rate
        self._horizon = horizon
        self._seed = seed
        self._rng = np.random.default_rng([seed, FaultInjectingEnv._instances])
        FaultInjectingEnv._instances += 1
        self._steps_to_fault = -1

    def reset(self, **kwargs: Any):
        if kwargs.get("seed") is not None:
            # A seeded reset also decides the faults that follow, as it decides the episodes.
            self._rng = np.random.default_rng([self._seed, kwargs["seed"]])
        faults = self._rng.random() < self._rate
        self._steps_to_fault = int(self._rng.integers(1, self._horizon + 1)) if faults else -1
        return self.env.reset(**kwargs)

    def step(self, action: Any):
        self._steps_to_fault -= 1
        if self._steps_to_fault == 0:
            raise RuntimeError("injected env fault")
        return self.env.step(action)


def faulty_env(
    env_id: str = "CartPole-v1",
    rate: float = 0.01,
    seed: int = 0,
    horizon: int = 200,
    **kwargs: Any,
) -> gym.Env:
    """Entry point `agentenv_jax.envs.faults:faulty_env`: a registered env whose episodes fail
    at `rate` (e.g. `env.kwargs: {env_id: CartPole-v1, rate: 0.01}`); other kwargs go to it."""
    return FaultInjectingEnv(gym.make(env_id, **kwargs), rate, seed, horizon)
