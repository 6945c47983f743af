"""SAC's flax networks: a tanh-squashed Gaussian actor and a twin Q critic, with pure samplers.

The actor's head has the same layout as the PPO Gaussian head, `[..., 2, d]` (mean, log-std of the
pre-squash Gaussian); actions are `tanh` of a sample, so they lie in `[-1, 1]` and the caller
rescales them to the env's bounds. As in `distributions.py`, sampling takes standard normal noise
as an argument instead of a PRNG key, so env ranks can draw it with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from agentenv_jax.networks.actor_critic import MLP
from agentenv_jax.networks.initializers import init_on_host, orthogonal, param_shapes, zeros

Params = Any

LOG_STD_MIN = -20.0
LOG_STD_MAX = 2.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _dense(width: int, scale: float, name: str | None = None) -> nn.Dense:
    # Orthogonal, like the PPO network whose `MLP` torso this module reuses.
    return nn.Dense(
        width,
        kernel_init=orthogonal(scale),
        bias_init=zeros,
        name=name,
    )


def _flatten_obs(obs: jax.Array, obs_ndim: int) -> jax.Array:
    batch_shape = obs.shape[: obs.ndim - obs_ndim]
    return obs.reshape(batch_shape + (-1,)).astype(jnp.float32)


class SquashedGaussianActor(nn.Module):
    """Maps observations `[..., *obs_shape]` to a head `[..., 2, d]` float32: the mean and the
    log-std (clipped to `[log_std_min, log_std_max]`) of the Gaussian before the tanh squash."""

    action_dim: int
    hidden: Sequence[int] = (256, 256)
    activation: str = "relu"
    obs_ndim: int = 1  # rank of one observation; leading axes beyond it are batch axes
    log_std_min: float = LOG_STD_MIN
    log_std_max: float = LOG_STD_MAX

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = MLP(self.hidden, self.activation, name="torso")(_flatten_obs(obs, self.obs_ndim))
        # A small output scale starts the policy at mean ~0, std ~1: close to uniform on [-1, 1]
        # after the squash, which is what the entropy bonus wants early on anyway.
        mean = _dense(self.action_dim, 0.01, name="mean")(x)
        log_std = _dense(self.action_dim, 0.01, name="log_std")(x)
        log_std = jnp.clip(log_std, self.log_std_min, self.log_std_max)
        return jnp.stack([mean, log_std], axis=-2)


class TwinQCritic(nn.Module):
    """Maps `(obs [..., *obs_shape], action [..., d])` to `[..., 2]` float32: two Q-values from
    two MLPs that share nothing, so their errors are as independent as the data allows (the
    clipped double-Q trick relies on it)."""

    hidden: Sequence[int] = (256, 256)
    activation: str = "relu"
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([_flatten_obs(obs, self.obs_ndim), action.astype(jnp.float32)], axis=-1)
        qs = []
        for i in range(2):
            torso = MLP(self.hidden, self.activation, name=f"q{i}_torso")(x)
            qs.append(_dense(1, 1.0, name=f"q{i}_out")(torso)[..., 0])
        return jnp.stack(qs, axis=-1)


class SACNetworks(NamedTuple):
    """The two modules, their pure apply functions, `init(key) -> (actor_params,
    critic_params)` (the same key gives the same parameters on every rank), and the shapes of
    both (`jax.ShapeDtypeStruct` trees, without drawing anything)."""

    actor: SquashedGaussianActor
    critic: TwinQCritic
    actor_apply: Callable[[Params, jax.Array], jax.Array]  # (params, obs) -> head [..., 2, d]
    critic_apply: Callable[[Params, jax.Array, jax.Array], jax.Array]  # -> q [..., 2]
    init: Callable[[jax.Array], tuple[Params, Params]]
    param_shapes: tuple[Params, Params]


def make_sac_networks(
    obs_shape: Sequence[int],
    action_dim: int,
    actor_hidden: Sequence[int],
    critic_hidden: Sequence[int],
    activation: str,
) -> SACNetworks:
    """Build the actor and twin critic for observations of `obs_shape` and actions `[d]`."""
    obs_ndim = len(obs_shape)
    actor = SquashedGaussianActor(action_dim, tuple(actor_hidden), activation, obs_ndim)
    critic = TwinQCritic(tuple(critic_hidden), activation, obs_ndim)

    def actor_apply(params: Params, obs: jax.Array) -> jax.Array:
        return actor.apply({"params": params}, obs)

    def critic_apply(params: Params, obs: jax.Array, action: jax.Array) -> jax.Array:
        return critic.apply({"params": params}, obs, action)

    obs = jax.ShapeDtypeStruct((1, *obs_shape), jnp.float32)
    action = jax.ShapeDtypeStruct((1, action_dim), jnp.float32)

    def init(key: jax.Array) -> tuple[Params, Params]:
        """Actor and critic parameters (numpy arrays, drawn on the host: `init_on_host`);
        `key` must be concrete."""
        actor_key, critic_key = jax.random.split(key)
        critic_params = init_on_host(critic, critic_key, [obs, action])
        return init_on_host(actor, actor_key, [obs]), critic_params

    shapes = (param_shapes(actor, [obs]), param_shapes(critic, [obs, action]))
    return SACNetworks(actor, critic, actor_apply, critic_apply, init, shapes)


def tanh_log_det_jacobian(u: jax.Array) -> jax.Array:
    """`log(1 - tanh(u)^2)` elementwise, finite for every finite `u`.

    The naive form is `-inf` once `tanh(u)` rounds to 1 (|u| > ~9 in float32); the identity
    `1 - tanh(u)^2 = 4 e^{-2u} / (1 + e^{-2u})^2` gives `2 (log 2 - u - softplus(-2u))`.
    """
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


def sample_squashed_action(
    actor_head: jax.Array, normal_noise: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """A reparameterized sample `a = tanh(mean + std * noise)` and its log-density.

    Args:
      actor_head: `[..., 2, d]` (mean, log-std) from `SquashedGaussianActor`.
      normal_noise: `[..., d]` standard normal noise.

    Returns:
      `action [..., d]` in `[-1, 1]`, and `log_prob [...]` float32, the log-density of `a` on
      `(-1, 1)^d`: the Gaussian's log-density at `u` minus `sum log(1 - tanh(u)^2)`.
    """
    mean, log_std = actor_head[..., 0, :], actor_head[..., 1, :]
    u = mean + jnp.exp(log_std) * normal_noise
    # The Gaussian's log-density at u, written in terms of the noise: (u - mean) / std is the
    # noise itself, which avoids dividing by a std as small as e^-20.
    gaussian_log_prob = -0.5 * normal_noise**2 - log_std - _HALF_LOG_2PI
    log_prob = jnp.sum(gaussian_log_prob - tanh_log_det_jacobian(u), axis=-1)
    return jnp.tanh(u), log_prob


def deterministic_action(actor_head: jax.Array) -> jax.Array:
    """`tanh(mean)`, `[..., d]` in `[-1, 1]`: the action used for evaluation."""
    return jnp.tanh(actor_head[..., 0, :])


def unit_to_bounds(action: Any, low: Any, high: Any) -> Any:
    """Actions in `[-1, 1]` mapped onto a Box's `[low, high]` (numpy or JAX arrays alike)."""
    return low + (action + 1.0) * 0.5 * (high - low)
