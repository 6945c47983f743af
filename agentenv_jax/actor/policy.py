"""The env rank's jit-compiled CPU copy of the policy, fed the learner's flat parameter vector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.networks.distributions import ActionDistribution


class ActorPolicy:
    """Action sampling and value estimates on the CPU, one compiled call per vector step.

    The flat float32 parameters are unravelled inside the jitted function, so swapping in a new
    version is one host-to-device copy. Sampling keys are `fold_in(rank_key, step)`: no key state
    to carry, and reproducible for a given seed, rank and step.
    """

    def __init__(self, apply_fn: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]],
                 unravel: Callable[[jax.Array], Any], distribution: ActionDistribution,
                 rank_key: jax.Array):
        self._device = jax.devices("cpu")[0]
        self._key = jax.device_put(rank_key, self._device)
        self._params = None

        def act(flat_params, obs, key, step):
            head, value = apply_fn(unravel(flat_params), obs)
            action = distribution.sample(jax.random.fold_in(key, step), head)
            return action, distribution.log_prob(head, action), value

        def value(flat_params, obs):
            return apply_fn(unravel(flat_params), obs)[1]

        self._act = jax.jit(act)
        self._value = jax.jit(value)

    def set_params(self, flat_params: np.ndarray) -> None:
        self._params = jax.device_put(jnp.asarray(flat_params), self._device)

    def act(self, obs: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`obs [E, ...]` -> `(action [E, ...], log_prob [E], value [E])` as numpy arrays."""
        action, log_prob, value = self._act(self._params, obs, self._key, step)
        return np.asarray(action), np.asarray(log_prob), np.asarray(value)

    def value(self, obs: np.ndarray) -> np.ndarray:
        """`obs [N, ...]` -> `V(obs) [N]`."""
        return np.asarray(self._value(self._params, obs))
