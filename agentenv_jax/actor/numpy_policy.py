"""The env rank's policy in plain numpy (`topology.env_rank_inference: numpy`), and the sampling
noise every env-rank policy draws. Nothing here imports JAX: an env rank acting with it runs
without JAX in its address space (`runtime.policies`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from agentenv_jax.networks.numpy_policy import actor_critic_forward, sample_with_log_prob


def sampling_noise(rng: np.random.Generator, kind: str, num: int, action_size: int) -> np.ndarray:
    """`[num, action_size]` float32 noise for `num` actions: Gumbel for categorical heads,
    standard normal for Gaussian ones (the same stream whichever policy path draws it)."""
    if kind == "gumbel":
        return rng.gumbel(size=(num, action_size)).astype(np.float32)
    return rng.standard_normal((num, action_size), dtype=np.float32)


class NumpyActorPolicy:
    """`ActorPolicy`'s interface for an MLP actor-critic, evaluated in numpy: for small
    networks a vector step's forward pass costs less than a jitted call's dispatch
    (`networks.numpy_policy`). Same parameters, same noise stream, same actions."""

    def __init__(
        self,
        unravel: Callable[[np.ndarray], Any],
        action_kind: str,
        action_nvec: tuple[int, ...],
        action_size: int,
        action_shape: tuple[int, ...],
        seed_sequence: list[int],
        obs_ndim: int,
        activation: str,
        image_obs: bool,
    ):
        self._rng = np.random.default_rng(seed_sequence)
        self._unravel = unravel
        self._kind, self._nvec = action_kind, action_nvec
        self._noise_kind = "normal" if action_kind == "continuous" else "gumbel"
        self._action_size, self._action_shape = action_size, action_shape
        self._forward_args = (obs_ndim, activation, image_obs)
        self._params: Any = None
        self._num_params = 0

    @property
    def num_params(self) -> int:
        return self._num_params

    def set_params(self, flat_params: np.ndarray) -> None:
        self._num_params = int(flat_params.size)
        # A copy: the message buffer the parameters arrived in is reused for the next version.
        self._params = self._unravel(np.array(flat_params, np.float32))

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`obs [E, ...]` -> `(action [E, ...], log_prob [E], value [E])`."""
        head, value = actor_critic_forward(self._params, obs, *self._forward_args)
        noise = sampling_noise(self._rng, self._noise_kind, obs.shape[0], self._action_size)
        action, log_prob = sample_with_log_prob(self._kind, self._nvec, head, noise)
        action = action.reshape((obs.shape[0], *self._action_shape))
        return action, log_prob, value.astype(np.float32)

    def value(self, obs: np.ndarray) -> np.ndarray:
        """`obs [N, ...]` -> `V(obs) [N]`."""
        return actor_critic_forward(self._params, obs, *self._forward_args)[1].astype(np.float32)
