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


class TextObservationEnv(gym.Env):
    """An env whose observation space the framework does not support (text)."""

    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "hello", {}

    def step(self, action):
        return "hello", 0.0, True, False, {}


def text_observation_env() -> gym.Env:
    return TextObservationEnv()


class CueEnv(gym.Env):
    """Each step shows a cue `c` in {0, 1, 2}; 8 steps per episode. The cue is observed as
    `obs = "discrete"` (Discrete(3)) or `"nested"` (`Tuple(Discrete(3) cue, Dict(parity:
    Discrete(2), time: Box[1]))`, parity and time carrying no reward information). Rewards:
    * `action = "discrete"` (Discrete(3)): 1 for choosing `c`; random play scores 8/3.
    * `"multi_discrete"` (MultiDiscrete([3, 4])): 1 for `a[0] == c`, 0.5 more for
      `a[1] == (c + 1) % 4`; random play scores 8/3 + 1, the best 12.
    * `"multi_binary"` (MultiBinary(3)): 1/3 per bit equal to `one_hot(c)`; random 4, best 8.
    A policy must read the cue through the flattened observation to beat random play."""

    def __init__(self, obs: str = "nested", action: str = "multi_discrete"):
        cue = gym.spaces.Discrete(3)
        self.observation_space = {
            "discrete": cue,
            "nested": gym.spaces.Tuple(
                (
                    cue,
                    gym.spaces.Dict(
                        {
                            "time": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
                            "parity": gym.spaces.Discrete(2),
                        }
                    ),
                )
            ),
        }[obs]
        self.action_space = {
            "discrete": gym.spaces.Discrete(3),
            "multi_discrete": gym.spaces.MultiDiscrete([3, 4]),
            "multi_binary": gym.spaces.MultiBinary(3),
        }[action]
        self._obs_kind, self._action_kind = obs, action
        self._cue, self._t = 0, 0

    def _observe(self):
        if self._obs_kind == "discrete":
            return self._cue
        time = np.array([self._t / 8], np.float32)
        return (self._cue, {"time": time, "parity": self._t % 2})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cue, self._t = int(self.np_random.integers(3)), 0
        return self._observe(), {}

    def step(self, action):
        if self._action_kind == "discrete":
            reward = float(int(action) == self._cue)
        elif self._action_kind == "multi_discrete":
            reward = float(action[0] == self._cue) + 0.5 * float(action[1] == (self._cue + 1) % 4)
        else:
            reward = float(np.mean(np.asarray(action) == np.eye(3)[self._cue]))
        self._t += 1
        self._cue = int(self.np_random.integers(3))
        return self._observe(), reward, False, self._t >= 8, {}


def cue_env(obs: str = "nested", action: str = "multi_discrete") -> gym.Env:
    return CueEnv(obs, action)


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


def rank_offset_pendulum(offset_per_rank: float = 10.0) -> gym.Env:
    """Pendulum whose first observation (cos theta, in [-1, 1]) is shifted by `offset_per_rank`
    times the MPI rank of the process stepping it: env ranks see different observations, so
    statistics each rank gathered alone would differ from the global ones."""
    from agentenv_jax.transport.launcher import launcher_rank

    shift = np.zeros(3, dtype=np.float32)
    shift[0] = offset_per_rank * int(launcher_rank() or 0)
    env = gym.make("Pendulum-v1")
    space = gym.spaces.Box(env.observation_space.low + shift, env.observation_space.high + shift)
    return gym.wrappers.TransformObservation(env, lambda obs: obs + shift, space)
