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


def compute_vtrace(
    log_rhos: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    episode_ends: jax.Array,
    gamma: float | jax.Array,
    clip_rho_threshold: float = 1.0,
    clip_c_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """V-trace targets and policy-gradient advantages (Espeholt et al., 2018).

    `v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) rho_t delta_t` within the
    episode, computed backwards as `v_s - V(x_s) = rho_s delta_s + gamma c_s (v_{s+1} - V(x_{s+1}))`
    with `delta_t = r_t + gamma V(x_{t+1}) - V(x_t)`, `rho_t = min(rho_bar, pi/mu)` and
    `c_t = min(c_bar, pi/mu)`. The recursion restarts wherever an episode ended.

    Args:
      log_rhos: `[T, B]` log pi(a_t|x_t) - log mu(a_t|x_t) (target over behaviour policy).
      rewards: `[T, B]`.
      values: `[T, B]` V(x_t) under the current value function.
      next_values: `[T, B]` V(x_{t+1}) already zeroed at terminal states and set to the final
        observation's value at truncations (see `next_state_values`).
      episode_ends: `[T, B]` bool, the episode ended (terminated or truncated) at step t.
      gamma: discount factor.
      clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold: rho_bar, c_bar, and the clip
        of the importance weight in the policy-gradient advantage.

    Returns:
      `(vs, pg_advantages)`, both `[T, B]`: value targets, and
      `rho_pg_t * (r_t + gamma v_{t+1} - V(x_t))` for the policy gradient, where `v_{t+1}` is
      `next_values_t` at an episode end or after the last step.
    """
    rhos = jnp.exp(log_rhos)
    clipped_rhos = jnp.minimum(clip_rho_threshold, rhos)
    cs = jnp.minimum(clip_c_threshold, rhos)
    continues = 1.0 - episode_ends.astype(values.dtype)
    deltas = clipped_rhos * (rewards + gamma * next_values - values)

    def backward(carry: jax.Array, inputs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        delta, cont, c = inputs
        correction = delta + gamma * cont * c * carry
        return correction, correction

    _, corrections = jax.lax.scan(
        backward, jnp.zeros_like(values[0]), (deltas, continues, cs), reverse=True
    )
    vs = values + corrections
    following = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    vs_next = jnp.where(episode_ends, next_values, following)
    pg_rhos = jnp.minimum(clip_pg_rho_threshold, rhos)
    pg_advantages = pg_rhos * (rewards + gamma * vs_next - values)
    return vs, pg_advantages
