"""IMPALA (Espeholt et al., 2018): one actor-critic gradient step per rollout, corrected for
policy lag with V-trace. Pure and jit-able, like `algorithms.ppo`.

The rollout is the same `[T, B]` layout PPO consumes, plus `last_obs [B, ...]`: targets
bootstrap from the *current* value of the observation after the last step. Truncated episodes
bootstrap from the behaviour policy's value of their final observation (`bootstrap_value`), which
env ranks computed when the truncation happened — a small approximation under policy lag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from agentenv_jax.algorithms.ppo import Batch, Params, TrainState, masked_mean, standardize
from agentenv_jax.algorithms.returns import compute_vtrace, next_state_values
from agentenv_jax.networks.distributions import ActionDistribution


@dataclasses.dataclass(frozen=True)
class IMPALAHyperparams:
    """Static settings of the update (see `IMPALAConfig` for their meaning)."""

    gamma: float
    clip_rho: float
    clip_c: float
    clip_pg_rho: float
    vf_coef: float
    ent_coef: float
    normalize_advantages: bool = False


def make_impala_loss(
    apply_fn: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]],
    distribution: ActionDistribution,
    hp: IMPALAHyperparams,
) -> Callable[[Params, Batch], tuple[jax.Array, dict[str, jax.Array]]]:
    """The V-trace actor-critic loss of one time-major rollout (see module docstring)."""

    def loss_fn(params: Params, rollout: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        head, values = apply_fn(params, rollout["obs"])
        _, last_value = apply_fn(params, rollout["last_obs"])
        log_prob = distribution.log_prob(head, rollout["action"])
        log_rhos = log_prob - rollout["log_prob"]
        terminated = rollout["terminated"].astype(bool)
        truncated = rollout["truncated"].astype(bool)
        valid = rollout["valid"].astype(jnp.float32)
        next_values = next_state_values(
            values, last_value, terminated, truncated, rollout["bootstrap_value"]
        )
        # Targets are constants of the loss: gradients flow only through log_prob and values.
        vs, pg_advantages = jax.lax.stop_gradient(
            compute_vtrace(
                log_rhos,
                rollout["reward"],
                values,
                next_values,
                terminated | truncated,
                hp.gamma,
                hp.clip_rho,
                hp.clip_c,
                hp.clip_pg_rho,
            )
        )
        if hp.normalize_advantages:
            pg_advantages = standardize(pg_advantages, valid)
        policy_loss = -masked_mean(pg_advantages * log_prob, valid)
        value_loss = 0.5 * masked_mean((vs - values) ** 2, valid)
        entropy = masked_mean(distribution.entropy(head), valid)
        total = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy
        rhos = jnp.exp(log_rhos)
        metrics = {
            "loss/total": total,
            "loss/policy": policy_loss,
            "loss/value": value_loss,
            "loss/entropy": entropy,
            "importance_weight_mean": masked_mean(rhos, valid),
            "importance_weight_clipped": masked_mean(
                (rhos > hp.clip_rho).astype(jnp.float32), valid
            ),
            "approx_kl": masked_mean(jnp.expm1(-log_rhos) + log_rhos, valid),
            "value_target_mean": masked_mean(vs, valid),
        }
        return total, metrics

    return loss_fn


def make_impala_update(
    apply_fn: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]],
    distribution: ActionDistribution,
    optimizer: optax.GradientTransformation,
    hp: IMPALAHyperparams,
    constrain_rows: Callable[[jax.Array], jax.Array] = lambda x: x,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Return `update(state, rollout) -> (state, metrics)`: one gradient step on the rollout.

    `constrain_rows` is accepted for symmetry with PPO; the rollout keeps the sharding of its env
    axis that the caller gave it, so nothing here needs re-sharding.
    """
    del constrain_rows
    grad_fn = jax.grad(make_impala_loss(apply_fn, distribution, hp), has_aux=True)

    def update(state: TrainState, rollout: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        grads, metrics = grad_fn(state.params, rollout)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        # Counted here, from what the device holds, for the run's accounting.
        metrics["trained_rows"] = jnp.sum(rollout["valid"].astype(jnp.int32))
        new_state = TrainState(
            params=params, opt_state=opt_state, update_count=state.update_count + 1, key=state.key
        )
        return new_state, metrics

    return update
