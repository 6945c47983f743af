"""Soft Actor-Critic (Haarnoja et al., 2018) with a learned temperature, as pure functions.

One update takes a batch of flat replay transitions and makes one gradient step on each of the
twin critic, the squashed-Gaussian actor and the temperature, then moves the target critic by
Polyak averaging. Discounting, n-step returns and terminals are folded into the batch's `discount`
by the caller; prioritized replay passes its importance weights as `weight` and gets per-row TD
errors back for new priorities. As in PPO, sharding is the caller's business: `constrain_rows`
pins every row-indexed array to the mesh's batch axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from agentenv_jax.networks.sac_networks import sample_squashed_action

Params = Any
Batch = dict[str, jax.Array]
ActorApply = Callable[[Params, jax.Array], jax.Array]  # (params, obs) -> head [..., 2, d]
CriticApply = Callable[[Params, jax.Array, jax.Array], jax.Array]  # -> q [..., 2]


@flax.struct.dataclass
class SACTrainState:
    """Everything the SAC learner updates: one pytree, so a checkpoint is one call."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params  # Polyak average of `critic_params`
    log_alpha: jax.Array  # float32 scalar, log of the entropy temperature
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState
    update_count: jax.Array  # int32 scalar, completed updates
    key: jax.Array  # PRNG key for the policy noise drawn inside the update


@dataclasses.dataclass(frozen=True)
class SACHyperparams:
    """The static settings the update closes over. Learning rates live in the optimizers and
    the discount in the batch."""

    tau: float  # Polyak step: target <- target + tau * (online - target) after every update
    target_entropy: float  # the entropy the temperature steers toward; -action_dim is usual


def soft_target(
    next_q1: jax.Array,
    next_q2: jax.Array,
    next_log_prob: jax.Array,
    alpha: float | jax.Array,
    reward: jax.Array,
    discount: jax.Array,
) -> jax.Array:
    """The soft Bellman target `r + discount * (min(Q1', Q2') - alpha * log pi(a'|s'))`.

    All arrays are `[B]` float32; `next_q*` are the target critics at `(s', a' ~ pi(s'))` and
    `discount` is `gamma^n * (1 - terminated)`. Taking the smaller critic counters the
    overestimation that maximizing over a noisy Q builds up (Fujimoto et al., 2018).
    """
    return reward + discount * (jnp.minimum(next_q1, next_q2) - alpha * next_log_prob)


def critic_loss(q1: jax.Array, q2: jax.Array, target: jax.Array, weights: jax.Array) -> jax.Array:
    """`0.5 * mean_b(w_b * ((Q1_b - y_b)^2 + (Q2_b - y_b)^2))`: both critics regress on `y`.

    Args:
      q1, q2: `[B]` the two critics at the batch's `(s, a)`.
      target: `[B]` the soft target, treated as a constant.
      weights: `[B]` importance-sampling weights (ones for uniform replay).
    """
    return 0.5 * jnp.mean(weights * ((q1 - target) ** 2 + (q2 - target) ** 2))


def actor_loss(q_min: jax.Array, log_prob: jax.Array, alpha: float | jax.Array) -> jax.Array:
    """`mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a))` over `[B]` reparameterized actions."""
    return jnp.mean(alpha * log_prob - q_min)


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """`-log_alpha * mean(log pi + target_entropy)` over `[B]` (log-probs held constant).

    Its gradient in `log_alpha` is `entropy - target_entropy`, so descent lowers the temperature
    while the policy is more random than the target and raises it otherwise. Optimizing
    `log_alpha` rather than `alpha` keeps the temperature positive without a projection.
    """
    return -log_alpha * jnp.mean(log_prob + target_entropy)


def polyak_update(target: Params, online: Params, tau: float) -> Params:
    """`target + tau * (online - target)` leaf by leaf."""
    return jax.tree.map(lambda t, o: t + tau * (o - t), target, online)


def init_sac_state(
    actor_params: Params,
    critic_params: Params,
    actor_opt: optax.GradientTransformation,
    critic_opt: optax.GradientTransformation,
    alpha_opt: optax.GradientTransformation,
    initial_alpha: float,
    key: jax.Array,
) -> SACTrainState:
    """The state before the first update: target critics equal the critics, `alpha` given."""
    log_alpha = jnp.asarray(math.log(initial_alpha), jnp.float32)
    return SACTrainState(
        actor_params=actor_params,
        critic_params=critic_params,
        # Copies, not the same buffers: a learner that donates its state must not donate one
        # buffer twice.
        target_critic_params=jax.tree.map(jnp.array, critic_params),
        log_alpha=log_alpha,
        actor_opt_state=actor_opt.init(actor_params),
        critic_opt_state=critic_opt.init(critic_params),
        alpha_opt_state=alpha_opt.init(log_alpha),
        update_count=jnp.zeros((), jnp.int32),
        key=key,
    )


def make_sac_update(
    actor_apply: ActorApply,
    critic_apply: CriticApply,
    actor_opt: optax.GradientTransformation,
    critic_opt: optax.GradientTransformation,
    alpha_opt: optax.GradientTransformation,
    hp: SACHyperparams,
    constrain_rows: Callable[[jax.Array], jax.Array] = lambda x: x,
) -> Callable[[SACTrainState, Batch], tuple[SACTrainState, dict[str, jax.Array], jax.Array]]:
    """Return `update(state, batch) -> (state, metrics, td_errors)`, one SAC update.

    `batch` holds flat float32 transitions: `obs [B, ...]`, `action [B, d]` in `[-1, 1]`,
    `reward [B]`, `next_obs [B, ...]`, `discount [B]` (`gamma^n * (1 - terminated)`) and
    `weight [B]` (importance-sampling weights; ones for uniform replay). `td_errors [B]` is
    `|mean(Q1, Q2) - target|` before the critic step, for new replay priorities. The steps follow
    Haarnoja et al. (2018b): critic on the soft target with the current temperature; actor
    against the just-updated critic; temperature on the actor step's log-probs; target critic.
    The importance weights scale only the critic's regression, the loss whose sampling the
    priorities skew; the actor and temperature losses are plain batch means.
    """

    def critic_loss_fn(
        critic_params: Params, batch: Batch, target: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        q = critic_apply(critic_params, batch["obs"], batch["action"])
        return critic_loss(q[:, 0], q[:, 1], target, batch["weight"]), q

    def actor_loss_fn(
        actor_params: Params,
        critic_params: Params,
        obs: jax.Array,
        noise: jax.Array,
        alpha: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        action, log_prob = sample_squashed_action(actor_apply(actor_params, obs), noise)
        q_min = jnp.min(critic_apply(critic_params, obs, action), axis=-1)
        return actor_loss(q_min, log_prob, alpha), log_prob

    critic_grad_fn = jax.value_and_grad(critic_loss_fn, has_aux=True)
    actor_grad_fn = jax.value_and_grad(actor_loss_fn, has_aux=True)
    temperature_grad_fn = jax.value_and_grad(temperature_loss)

    def update(
        state: SACTrainState, batch: Batch
    ) -> tuple[SACTrainState, dict[str, jax.Array], jax.Array]:
        batch = {k: constrain_rows(v) for k, v in batch.items()}
        key, next_key, policy_key = jax.random.split(state.key, 3)
        # The learner is not dispatch-bound, so unlike the actors it draws its noise in-graph.
        action_shape = batch["action"].shape
        next_noise = constrain_rows(jax.random.normal(next_key, action_shape, jnp.float32))
        policy_noise = constrain_rows(jax.random.normal(policy_key, action_shape, jnp.float32))
        alpha = jnp.exp(state.log_alpha)

        next_action, next_log_prob = sample_squashed_action(
            actor_apply(state.actor_params, batch["next_obs"]), next_noise
        )
        next_q = critic_apply(state.target_critic_params, batch["next_obs"], next_action)
        target = jax.lax.stop_gradient(
            soft_target(
                next_q[:, 0],
                next_q[:, 1],
                next_log_prob,
                alpha,
                batch["reward"],
                batch["discount"],
            )
        )

        (c_loss, q), c_grads = critic_grad_fn(state.critic_params, batch, target)
        c_updates, critic_opt_state = critic_opt.update(
            c_grads, state.critic_opt_state, state.critic_params
        )
        critic_params = optax.apply_updates(state.critic_params, c_updates)
        td_errors = constrain_rows(jnp.abs(jnp.mean(q, axis=-1) - target))

        (a_loss, log_prob), a_grads = actor_grad_fn(
            state.actor_params, critic_params, batch["obs"], policy_noise, alpha
        )
        a_updates, actor_opt_state = actor_opt.update(
            a_grads, state.actor_opt_state, state.actor_params
        )
        actor_params = optax.apply_updates(state.actor_params, a_updates)

        t_loss, alpha_grad = temperature_grad_fn(
            state.log_alpha, jax.lax.stop_gradient(log_prob), hp.target_entropy
        )
        alpha_updates, alpha_opt_state = alpha_opt.update(
            alpha_grad, state.alpha_opt_state, state.log_alpha
        )
        log_alpha = optax.apply_updates(state.log_alpha, alpha_updates)

        new_state = SACTrainState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=polyak_update(state.target_critic_params, critic_params, hp.tau),
            log_alpha=log_alpha,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            alpha_opt_state=alpha_opt_state,
            update_count=state.update_count + 1,
            key=key,
        )
        metrics = {
            "loss/critic": c_loss,
            "loss/actor": a_loss,
            "loss/temperature": t_loss,
            "alpha": alpha,  # the temperature this update used
            "entropy": -jnp.mean(log_prob),  # single-sample estimate, squashed actions
            "q_mean": jnp.mean(q),
            "target_mean": jnp.mean(target),
            "td_error_mean": jnp.mean(td_errors),
            "grad_norm/critic": optax.tree.norm(c_grads),
            "grad_norm/actor": optax.tree.norm(a_grads),
        }
        return new_state, metrics, td_errors

    return update
