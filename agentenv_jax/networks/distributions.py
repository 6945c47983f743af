"""Action distributions as pure functions of the policy head's output.

Discrete actions use a categorical over logits `[..., n]`; MultiDiscrete actions `[..., k]` a
product of k independent categoricals whose logits lie side by side in `[..., sum(nvec)]`
(log-prob and entropy are sums over the k); Box actions use a diagonal Gaussian whose head output
is `[..., 2, d]` (mean, log-std). Sampled Gaussian actions are not squashed: the actor clips them
to the action bounds only when stepping the env, so log-probabilities stay exact.

Sampling takes its noise as an argument (Gumbel noise `[..., n]` for the categorical, standard
normal `[..., d]` for the Gaussian) rather than a PRNG key: env ranks draw it with numpy, because
XLA's threefry costs ~100 us per call on CPU at these sizes — as much as the network itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.envs.spaces import ActionKind


class ActionDistribution(NamedTuple):
    """The three operations PPO needs, for one kind of action space."""

    sample: Callable[[jax.Array, jax.Array], jax.Array]  # (head, noise) -> action
    log_prob: Callable[[jax.Array, jax.Array], jax.Array]  # (head, action) -> [...] float32
    entropy: Callable[[jax.Array], jax.Array]  # (head) -> [...] float32
    mode: Callable[[jax.Array], jax.Array]  # (head) -> the most likely action, for evaluation
    noise: str  # "gumbel" or "normal": what `sample` expects, shaped like one action's logits/mean


def _categorical_sample(logits: jax.Array, gumbel_noise: jax.Array) -> jax.Array:
    # The Gumbel-max trick: argmax(logits + Gumbel(0, 1)) ~ Categorical(softmax(logits)).
    return jnp.argmax(logits + gumbel_noise, axis=-1).astype(jnp.int32)


def _categorical_log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_p, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _categorical_entropy(logits: jax.Array) -> jax.Array:
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def _categorical_mode(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _gaussian_sample(head: jax.Array, normal_noise: jax.Array) -> jax.Array:
    mean, log_std = head[..., 0, :], head[..., 1, :]
    return mean + jnp.exp(log_std) * normal_noise


def _gaussian_log_prob(head: jax.Array, action: jax.Array) -> jax.Array:
    mean, log_std = head[..., 0, :], head[..., 1, :]
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)


def _gaussian_entropy(head: jax.Array) -> jax.Array:
    log_std = head[..., 1, :]
    return jnp.sum(log_std + 0.5 * math.log(2 * math.pi * math.e), axis=-1)


def _gaussian_mode(head: jax.Array) -> jax.Array:
    return head[..., 0, :]


CATEGORICAL = ActionDistribution(
    _categorical_sample, _categorical_log_prob, _categorical_entropy, _categorical_mode, "gumbel"
)
DIAGONAL_GAUSSIAN = ActionDistribution(
    _gaussian_sample, _gaussian_log_prob, _gaussian_entropy, _gaussian_mode, "normal"
)


def multi_categorical(nvec: Sequence[int]) -> ActionDistribution:
    """Independent categoricals with `nvec[i]` choices each: head `[..., sum(nvec)]` (the logits
    of sub-action 0, then 1, ...), Gumbel noise of the same shape, actions `[..., k]` int32."""
    bounds = [int(b) for b in np.cumsum(nvec)[:-1]]

    def split(x: jax.Array) -> list[jax.Array]:
        return jnp.split(x, bounds, axis=-1)

    def sample(logits: jax.Array, gumbel_noise: jax.Array) -> jax.Array:
        parts = zip(split(logits), split(gumbel_noise), strict=True)
        return jnp.stack([_categorical_sample(lg, g) for lg, g in parts], axis=-1)

    def log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
        parts = split(logits)
        return sum(_categorical_log_prob(lg, action[..., i]) for i, lg in enumerate(parts))

    def entropy(logits: jax.Array) -> jax.Array:
        return sum(_categorical_entropy(lg) for lg in split(logits))

    def mode(logits: jax.Array) -> jax.Array:
        return jnp.stack([_categorical_mode(lg) for lg in split(logits)], axis=-1)

    return ActionDistribution(sample, log_prob, entropy, mode, "gumbel")


def action_distribution(kind: ActionKind, nvec: Sequence[int] = ()) -> ActionDistribution:
    """The distribution for an action kind; "multi_discrete" needs the sub-action counts."""
    if kind == "multi_discrete":
        if not nvec:
            raise ValueError("action kind 'multi_discrete' needs nvec, the sub-action counts")
        return multi_categorical(nvec)
    return {"discrete": CATEGORICAL, "continuous": DIAGONAL_GAUSSIAN}[kind]
