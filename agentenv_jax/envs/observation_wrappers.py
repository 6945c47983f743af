"""The observation wrappers the env factory puts around every env: flattening and frame stacking.

Each env rank (and `agentenv eval`) makes its envs through `envs.factory.resolve_env_factory`,
which applies `wrap_observations`, so every process sees the same observation space.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from agentenv_jax.envs.spaces import is_image_space, observation_space_as_sent


class FlattenToFloat(gym.ObservationWrapper):
    """Discrete (one-hot), MultiDiscrete, MultiBinary, Dict (keys sorted) and Tuple observations
    as one float32 vector `[D]`, by Gymnasium's `flatten` (`observation_space_as_sent`)."""

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        self.observation_space = observation_space_as_sent(env_id, env.observation_space)

    def observation(self, observation: Any) -> np.ndarray:
        return gym.spaces.flatten(self.env.observation_space, observation).astype(np.float32)


def _frames_to_channels(stacked: np.ndarray, image: bool) -> np.ndarray:
    """`[k, H, W, C]` -> `[H, W, k*C]` and `[k, H, W]` -> `[H, W, k]` for images (oldest frame's
    channels first); any other `[k, ...]` -> `[k*D]`."""
    if not image:
        return stacked.reshape(-1)
    if stacked.ndim == 3:
        return np.moveaxis(stacked, 0, -1)
    k, h, w, c = stacked.shape
    return np.moveaxis(stacked, 0, 2).reshape(h, w, k * c)


class StackOnChannels(gym.ObservationWrapper):
    """The `[k, ...]` stack of Gymnasium's `FrameStackObservation` laid out for the network:
    images on the channel axis (a CNN sees `(H, W, k*C)`), vectors concatenated (`[k*D]`)."""

    def __init__(self, env: gym.wrappers.FrameStackObservation, image: bool):
        super().__init__(env)
        self._image = image
        stacked = env.observation_space
        self.observation_space = gym.spaces.Box(
            _frames_to_channels(stacked.low, image),
            _frames_to_channels(stacked.high, image),
            dtype=stacked.dtype,
        )

    def observation(self, observation: Any) -> np.ndarray:
        return np.ascontiguousarray(_frames_to_channels(np.asarray(observation), self._image))


def wrap_observations(env: gym.Env, env_id: str, frame_stack: int) -> gym.Env:
    """`env` with its observations as they travel: non-Box spaces flattened to float32, and the
    last `frame_stack` observations stacked (the first repeated after a reset)."""
    if not isinstance(env.observation_space, gym.spaces.Box):
        env = FlattenToFloat(env, env_id)
    if frame_stack > 1:
        image = is_image_space(env.observation_space)
        env = StackOnChannels(gym.wrappers.FrameStackObservation(env, frame_stack), image)
    return env


def needs_wrapping(space: gym.Space, frame_stack: int) -> bool:
    """Whether `wrap_observations` would change an env with this observation space."""
    return frame_stack > 1 or not isinstance(space, gym.spaces.Box)
