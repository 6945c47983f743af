"""Small env factories used by the tests through `env.id: envs_for_tests:<factory>`."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def broken_env() -> gym.Env:
    """A factory that fails the way a missing simulator asset would."""
    raise RuntimeError("simulator asset 'robot.xml' not found")


class SceneCartPole(gym.Wrapper):
    """CartPole that loads its scene on the first reset, as simulators with assets do: a bad
    `scene` passes construction and fails only when the env first runs."""

    def __init__(self, scene: str):
        super().__init__(gym.make("CartPole-v1"))
        self._scene = scene

    def reset(self, **kwargs):
        if self._scene != "default":
            raise ValueError(f"scene {self._scene!r} not found")
        return self.env.reset(**kwargs)


def scene_cartpole(scene: str = "default") -> gym.Env:
    return SceneCartPole(scene)


def not_an_env(**kwargs) -> str:
    """An entry point that returns something other than a `gymnasium.Env`."""
    return "not an env"


class DictObservationEnv(gym.Env):
    """An env whose observation space the framework does not support yet."""

    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"position": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"position": np.zeros(2, np.float32)}, 0.0, True, False, {}


def dict_observation_env() -> gym.Env:
    return DictObservationEnv()


def cartpole(**kwargs) -> gym.Env:
    """CartPole through an entry point rather than its registered id."""
    return gym.make("CartPole-v1", **kwargs)


class CrashingCartPole(gym.Wrapper):
    """CartPole whose simulator fails after a number of steps (a mid-run crash)."""

    def __init__(self, crash_after: int):
        super().__init__(gym.make("CartPole-v1"))
        self._steps_left = crash_after

    def step(self, action):
        self._steps_left -= 1
        if self._steps_left < 0:
            raise RuntimeError("simulator diverged")
        return self.env.step(action)


def crashing_cartpole(crash_after: int = 300) -> gym.Env:
    return CrashingCartPole(crash_after)


class CounterEnv(gym.Env):
    """Observations `[env id, t]`, reward `t` for the step taken at `t`: any stored transition
    can be checked for consistency (`next_obs = [id, t + 1]`, `reward = t`). The env id is the
    seed of its first reset, which the framework makes unique across env ranks."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self._id = -1.0
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._id = float(seed)
        self._t = 0
        return np.array([self._id, 0.0], np.float32), {}

    def step(self, action):
        reward = float(self._t)
        self._t += 1
        return np.array([self._id, self._t], np.float32), reward, False, self._t >= 50, {}


def counter_env() -> gym.Env:
    return CounterEnv()


class NaNRewardCartPole(gym.Wrapper):
    """CartPole whose rewards turn NaN after a number of steps (a diverging simulator)."""

    def __init__(self, nan_after: int):
        super().__init__(gym.make("CartPole-v1"))
        self._steps_left = nan_after

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps_left -= 1
        return obs, (np.nan if self._steps_left < 0 else reward), terminated, truncated, info


def nan_reward_cartpole(nan_after: int = 2000) -> gym.Env:
    return NaNRewardCartPole(nan_after)
