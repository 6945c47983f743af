"""Return and advantage estimators over time-major rollouts (pure functions of arrays)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def next_state_values(
    values: jax.Array,
    last_value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    bootstrap_value: jax.Array,
) -> jax.Array:
    """The value of the state that follows each step of a rollout.

    Args:
      values: `[T, B]` float, V(s_t) under the behaviour policy.
      last_value: `[B]` float, V(s_T) for the observation after the last step.
      terminated: `[T, B]` bool, the episode reached a terminal state at step t (its value is 0).
      truncated: `[T, B]` bool, the episode was cut by a time limit at step t; the true next state
        was not terminal, so its value is `bootstrap_value`.
      bootstrap_value: `[T, B]` float, V(final observation) where `truncated`, anything elsewhere.

    Returns:
      `[T, B]` float: V(s_{t+1}) where the episode continues, 0 where it terminated, and the
      bootstrap value where it was truncated.
    """
    following = jnp.concatenate([values[1:], last_value[None]], axis=0)
    following = jnp.where(truncated, bootstrap_value, following)
    return jnp.where(terminated, 0.0, following)


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    episode_ends: jax.Array,
    gamma: float | jax.Array,
    gae_lambda: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Generalized Advantage Estimation (Schulman et al., 2016) over a time-major rollout.

    `A_t = delta_t + gamma * lambda * (1 - end_t) * A_{t+1}`, with
    `delta_t = r_t + gamma * next_values_t - values_t`; the recursion restarts wherever an episode
    ended at step t (terminated or truncated), and `A_T = 0` after the last step.

    Args:
      rewards: `[T, B]` float.
      values: `[T, B]` float, V(s_t).
      next_values: `[T, B]` float, V(s_{t+1}) already zeroed at terminal states
        (see `next_state_values`).
      episode_ends: `[T, B]` bool, the episode ended (terminated or truncated) at step t.
      gamma: discount factor.
      gae_lambda: GAE lambda.

    Returns:
      `(advantages, returns)`, both `[T, B]` float32; `returns = advantages + values` are the
      value targets (lambda-returns).
    """
    deltas = rewards + gamma * next_values - values
    continues = 1.0 - episode_ends.astype(deltas.dtype)

    def backward(carry: jax.Array, inputs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
        delta, cont = inputs
        advantage = delta + gamma * gae_lambda * cont * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, continues), reverse=True
    )
    return advantages, advantages + values
