"""The flax actor-critic: separate policy and value MLPs, or one CNN torso shared by both heads
(`networks.torsos`); a categorical (Discrete, MultiDiscrete) or Gaussian (Box) policy head.

flax.linen is used (rather than nnx) because the framework moves parameters as plain pytrees:
`ravel_pytree` flattens them for MPI and orbax saves them as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.envs.spaces import ActionKind
from agentenv_jax.networks.initializers import (
    constant,
    init_on_host,
    orthogonal,
    param_shapes,
    zeros,
)
from agentenv_jax.networks.torsos import cnn_torso, image_batch

_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu}


def _dense(width: int, scale: float) -> nn.Dense:
    # Orthogonal init with small policy-output scale: the standard PPO recipe (Andrychowicz et
    # al., 2021) that starts with a near-uniform policy.
    return nn.Dense(width, kernel_init=orthogonal(scale), bias_init=zeros)


class MLP(nn.Module):
    hidden: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = _ACTIVATIONS[self.activation](_dense(width, float(np.sqrt(2)))(x))
        return x


class ActorCritic(nn.Module):
    """Maps observations `[..., *obs_shape]` to `(head, value)`.

    `head` is logits `[..., n]` for discrete actions (`[..., sum(nvec)]` for MultiDiscrete), or
    `[..., 2, d]` (mean, log-std) for continuous ones; `value` is `[...]` float32. With
    `image_obs`, observations are pixel values 0..255 (uint8 or not) and are scaled to [0, 1].
    """

    action_kind: ActionKind
    action_size: int  # outputs of the policy head (see `EnvSpaces.action_size`)
    actor_hidden: Sequence[int] = (64, 64)
    critic_hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    obs_ndim: int = 1  # rank of one observation; leading axes beyond it are batch axes
    torso: str = "mlp"  # "mlp" (actor_hidden/critic_hidden), or a CNN of `torso_choice.CNN_TORSOS`
    image_obs: bool = False
    # Multi-agent centralised critics: the policy sees the first `actor_obs_dim` entries of a
    # (flat) observation, the critic all of them (None: both see all).
    actor_obs_dim: int | None = None

    def _policy_head(self, features: jax.Array) -> jax.Array:
        out = _dense(self.action_size, 0.01)(features)
        if self.action_kind == "continuous":
            log_std = self.param("log_std", constant(self.log_std_init), (self.action_size,))
            out = jnp.stack([out, jnp.broadcast_to(log_std, out.shape)], axis=-2)
        return out

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        if self.torso != "mlp":
            # One torso for both heads: the standard pixel actor-critic, and half the convs.
            pixels, batch_shape = image_batch(obs, self.obs_ndim)
            features = cnn_torso(self.torso)(pixels)
            features = features.reshape(batch_shape + features.shape[-1:])
            return self._policy_head(features), _dense(1, 1.0)(features)[..., 0]
        batch_shape = obs.shape[: obs.ndim - self.obs_ndim]
        x = obs.reshape(batch_shape + (-1,)).astype(jnp.float32)
        if self.image_obs:
            x = x / 255.0
        actor_x = x if self.actor_obs_dim is None else x[..., : self.actor_obs_dim]
        actor = MLP(self.actor_hidden, self.activation, name="actor_torso")(actor_x)
        out = self._policy_head(actor)
        critic = MLP(self.critic_hidden, self.activation, name="critic_torso")(x)
        value = _dense(1, 1.0)(critic)[..., 0]
        return out, value


def make_actor_critic(
    action_kind: ActionKind,
    action_size: int,
    obs_ndim: int,
    actor_hidden: Sequence[int],
    critic_hidden: Sequence[int],
    activation: str,
    log_std_init: float,
    *,
    torso: str = "mlp",
    image_obs: bool = False,
    actor_obs_dim: int | None = None,
) -> tuple[ActorCritic, Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]]:
    """The module and its pure `apply_fn(params, obs) -> (head, value)`; with `actor_obs_dim`
    the policy sees only the first `actor_obs_dim` observation entries (`ActorCritic`)."""
    module = ActorCritic(
        action_kind,
        action_size,
        tuple(actor_hidden),
        tuple(critic_hidden),
        activation,
        log_std_init,
        obs_ndim,
        torso,
        image_obs,
        actor_obs_dim,
    )

    return module, apply_fn_of(module)


def _one_observation(obs_shape: Sequence[int]) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((1, *obs_shape), jnp.float32)


def init_params(module: ActorCritic, obs_shape: Sequence[int], key: jax.Array) -> Any:
    """Initial parameters (numpy arrays, drawn on the host: `networks.initializers`); the same
    key gives the same parameters on every rank. `key` must be concrete (not traced)."""
    return init_on_host(module, key, [_one_observation(obs_shape)])


def actor_critic_param_shapes(module: ActorCritic, obs_shape: Sequence[int]) -> Any:
    """The `jax.ShapeDtypeStruct` of each parameter `init_params` returns."""
    return param_shapes(module, [_one_observation(obs_shape)])


def apply_fn_of(module: nn.Module) -> Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]:
    """`(params, obs) -> (policy head, value)` of a flax actor-critic module."""

    def apply_fn(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return module.apply({"params": params}, obs)

    return apply_fn
