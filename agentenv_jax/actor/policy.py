"""The env rank's CPU copy of the policy, fed the learner's flat parameter vector, jit-compiled
(the numpy one for small MLPs is `actor.numpy_policy`, which imports no JAX)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.actor.numpy_policy import sampling_noise
from agentenv_jax.networks.distributions import ActionDistribution


class ActorPolicy:
    """Action sampling and value estimates on the CPU, one compiled call per vector step.

    The flat float32 parameters are unravelled inside the jitted function, so swapping in a new
    version is one host-to-device copy. Sampling noise comes from a numpy generator seeded per
    rank (see `networks.distributions`), and the call returns one packed array
    `[E, prod(action_shape) + 2]` (action, log-prob, value), so each step costs one dispatch and one
    device-to-host copy.
    """

    def __init__(
        self,
        apply_fn: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]],
        unravel: Callable[[jax.Array], Any],
        distribution: ActionDistribution,
        action_size: int,
        action_shape: tuple[int, ...],
        seed_sequence: list[int] | None,
        device: jax.Device | None = None,
    ):
        # The env rank's CPU, or a learner device (central inference, `learner.inference_server`).
        self._device = device or jax.devices("cpu")[0]
        self._distribution = distribution
        self._action_size = action_size
        # None: every call brings its noise (`act_with`; the central server's rows).
        self._own_noise = None if seed_sequence is None else self.noise_source(seed_sequence)
        self._action_shape = action_shape
        self._params = None

        def act(flat_params, obs, noise):
            head, value = apply_fn(unravel(flat_params), obs)
            action = distribution.sample(head, noise)
            log_prob = distribution.log_prob(head, action)
            flat_action = action.reshape(action.shape[0], -1).astype(jnp.float32)
            return jnp.concatenate([flat_action, log_prob[:, None], value[:, None]], axis=1)

        def value(flat_params, obs):
            return apply_fn(unravel(flat_params), obs)[1]

        self._act = jax.jit(act)
        self._value = jax.jit(value)

    @property
    def num_params(self) -> int:
        return 0 if self._params is None else int(self._params.size)

    def set_params(self, flat_params: np.ndarray | jax.Array) -> None:
        self._params = flat_params_on(self._device, flat_params)

    def noise_source(self, seed_sequence: list[int]) -> Callable[[int], np.ndarray]:
        """`draw(num) -> [num, action_size]` noise from a generator seeded `seed_sequence`: an
        env rank's own stream (or the central server's copy of it)."""
        rng = np.random.default_rng(seed_sequence)
        kind, size = self._distribution.noise, self._action_size
        return lambda num: sampling_noise(rng, kind, num, size)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`obs [E, ...]` -> `(action [E, ...], log_prob [E], value [E])` as numpy arrays."""
        return self.act_with(obs, self._own_noise(obs.shape[0]))

    def act_with(
        self, obs: np.ndarray, noise: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`act` with the noise given: `[E, action_size]` rows of `noise_source` draws."""
        packed = np.asarray(self._act(self._params, obs, noise))
        action = packed[:, :-2].reshape((obs.shape[0], *self._action_shape))
        if self._distribution.noise == "gumbel":  # categorical: indices, exact in float32
            action = action.astype(np.int32)
        return action, packed[:, -2], packed[:, -1]

    def value(self, obs: np.ndarray) -> np.ndarray:
        """`obs [N, ...]` -> `V(obs) [N]`."""
        return np.asarray(self._value(self._params, obs))


def flat_params_on(device: jax.Device, flat_params: np.ndarray | jax.Array) -> jax.Array:
    """The flat parameter vector to act with: a copy on `device` of a host message (whose
    buffer the next version reuses), or a device array as it is (central inference)."""
    if isinstance(flat_params, jax.Array):
        return flat_params
    return jax.device_put(np.array(flat_params), device)


class SquashedGaussianPolicy:
    """The env rank's CPU copy of a SAC actor: `tanh`-squashed Gaussian actions in `[-1, 1]`.

    Like `ActorPolicy`, it takes the learner's flat parameters and host-drawn noise.
    """

    def __init__(
        self,
        actor_apply: Callable[[Any, jax.Array], jax.Array],
        unravel: Callable[[jax.Array], Any],
        action_dim: int,
        seed_sequence: list[int],
    ):
        from agentenv_jax.networks.sac_networks import sample_squashed_action

        self._device = jax.devices("cpu")[0]
        self._rng = np.random.default_rng(seed_sequence)
        self._action_dim = action_dim
        self._params = None

        def act(flat_params, obs, noise):
            return sample_squashed_action(actor_apply(unravel(flat_params), obs), noise)[0]

        self._act = jax.jit(act)

    @property
    def has_params(self) -> bool:
        return self._params is not None

    def set_params(self, flat_params: np.ndarray) -> None:
        self._params = jax.device_put(np.array(flat_params), self._device)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """`obs [E, ...]` -> actions `[E, d]` in `[-1, 1]`."""
        noise = self._rng.standard_normal((obs.shape[0], self._action_dim), dtype=np.float32)
        return np.asarray(self._act(self._params, obs, noise))

    def random_act(self, num: int) -> np.ndarray:
        """Uniform actions in `[-1, 1]`, for the steps before learning starts."""
        return self._rng.uniform(-1.0, 1.0, size=(num, self._action_dim)).astype(np.float32)
