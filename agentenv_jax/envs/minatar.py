"""MinAtar's games (Young & Tian, 2019) as image envs: `pip install 'agentenv_jax[minatar]'`.

MinAtar observes a 10x10 grid with one boolean channel per object kind. The framework's image
path expects uint8 frames, so each channel becomes 0 or 255: a CNN torso sees them scaled to
[0, 1], as it would see an Atari frame. Registered as `agentenv_jax/MinAtar-<Game>-v1` (the
minimal action set, sticky actions with probability 0.1 as in the paper).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


class _Uint8Frames(gym.ObservationWrapper):
    """Boolean object channels [10, 10, C] as uint8 frames of 0 and 255."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, np.uint8) * np.uint8(255)


class _SeededReset(gym.Wrapper):
    """Seeds `np_random` on `reset(seed=...)`, as `gymnasium.Env.reset` does. MinAtar's reset
    seeds only its game's own RandomState and never calls it, so the env's `np_random` ignored
    the seed, against Gymnasium's contract (which `check_env` checks)."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict]:
        gym.Env.reset(self.unwrapped, seed=seed)  # the `super().reset(seed=seed)` MinAtar skips
        return self.env.reset(seed=seed, options=options)


def make_minatar(game: str = "breakout", **kwargs: Any) -> gym.Env:
    """The MinAtar game `game` with uint8 frames; `kwargs` go to MinAtar's environment
    (`sticky_action_prob`, `difficulty_ramping`, ...)."""
    if game not in GAMES:
        raise ValueError(f"game = {game!r} is not a MinAtar game: expected one of {GAMES}")
    try:
        from minatar.gym import BaseEnv
    except ImportError as err:
        raise ImportError(
            f"MinAtar is not installed ({err}): pip install 'agentenv_jax[minatar]'"
        ) from None
    return _Uint8Frames(_SeededReset(BaseEnv(game, use_minimal_action_set=True, **kwargs)))


def register_minatar() -> None:
    """Register `agentenv_jax/MinAtar-<Game>-v1` for every game (MinAtar is imported only
    when one is made)."""
    for game in GAMES:
        env_id = f"agentenv_jax/MinAtar-{game.title().replace('_', '')}-v1"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=make_minatar, kwargs={"game": game})
