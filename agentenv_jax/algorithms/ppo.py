"""PPO: loss pieces and the whole update step as pure, jit-able functions.

The update takes one synchronous rollout `[T, B]` gathered from every env rank, computes GAE, and
runs `num_epochs` passes of `num_minibatches` clipped-surrogate gradient steps. Sharding is the
caller's business, in one of two ways:
* the learner jits `update` with the batch axis sharded over its device mesh and passes
  `constrain_rows`, which pins each minibatch's rows to that axis; XLA shuffles the rows across
  devices and reduces each gradient leaf (the result is the one-device update's);
* with `data_axis`, `update` is one shard's part (run under `shard_map` over that mesh axis):
  each shard shuffles its own rows with the shared key, so minibatch m is the union of every
  shard's m-th; the statistics the losses divide by (valid rows, advantage moments) are summed
  over shards once per update, and each gradient step sums its raveled gradients and metrics in
  one `psum`. With one shard it is the one-device update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from agentenv_jax.algorithms.returns import compute_gae, next_state_values
from agentenv_jax.networks.distributions import ActionDistribution

Params = Any
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything the learner updates: one pytree, so a checkpoint is one call."""

    params: Params
    opt_state: optax.OptState
    update_count: jax.Array  # int32 scalar, completed updates
    key: jax.Array  # PRNG key for minibatch shuffling


@dataclasses.dataclass(frozen=True)
class PPOHyperparams:
    """The static settings the update closes over (see `PPOConfig` for their meaning)."""

    num_epochs: int
    num_minibatches: int
    gamma: float
    gae_lambda: float
    clip_eps: float
    anneal_clip: bool
    value_clip_eps: float | None
    vf_coef: float
    ent_coef: float
    normalize_advantages: bool
    num_updates: int  # total updates in the run, for annealing
    # Gradient steps as straight-line code instead of a loop: XLA's CPU backend runs
    # convolutions inside a while loop about 8x slower than outside one (`cpu_unrolls`).
    unroll: bool = False


def masked_mean(x: jax.Array, mask: jax.Array, count: jax.Array | None = None) -> jax.Array:
    """Mean of `x` over entries where `mask` is 1; 0 when the mask is empty. With `count`,
    the masked sum over `count` (at least 1): one shard's part of a mean over all shards."""
    mask = mask.astype(x.dtype)
    count = jnp.sum(mask) if count is None else count
    return jnp.sum(x * mask) / jnp.maximum(count, 1.0)


def standardize(
    x: jax.Array, mask: jax.Array, eps: float = 1e-8, moments: tuple | None = None
) -> jax.Array:
    """`(x - mean) / (std + eps)` with statistics over the masked entries, or the given
    `(mean, std)` (`moments`, over every shard's entries)."""
    if moments is None:
        mean = masked_mean(x, mask)
        moments = (mean, jnp.sqrt(masked_mean((x - mean) ** 2, mask)))
    mean, std = moments
    return (x - mean) / (std + eps)


def clipped_surrogate(
    log_ratio: jax.Array,
    advantages: jax.Array,
    clip_low: float | jax.Array,
    clip_high: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate per element, `-min(r A, clip(r, 1 - low, 1 + high) A)` (DAPO's
    clip-higher where `clip_high` > `clip_low`), and whether each ratio lies outside the clip
    (float32 0/1), both shaped like `log_ratio`."""
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -jnp.minimum(ratio * advantages, clipped * advantages)
    return loss, ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).astype(jnp.float32)


def clipped_surrogate_loss(
    log_ratio: jax.Array,
    advantages: jax.Array,
    clip_eps: float | jax.Array,
    mask: jax.Array,
    count: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped policy loss `-E[min(r A, clip(r, 1-eps, 1+eps) A)]` and the clip fraction.

    Args:
      log_ratio: `[N]` log pi(a|s) - log mu(a|s).
      advantages: `[N]`.
      clip_eps: the clipping epsilon.
      mask: `[N]` 1 for transitions that count.
      count: the means' denominator (`masked_mean`); the mask's sum by default.
    """
    loss, clipped = clipped_surrogate(log_ratio, advantages, clip_eps, clip_eps)
    return masked_mean(loss, mask, count), masked_mean(clipped, mask, count)


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    value_clip_eps: float | None,
    mask: jax.Array,
    count: jax.Array | None = None,
) -> jax.Array:
    """`0.5 * E[(V - R)^2]`, or with `value_clip_eps` the pessimistic clipped variant (`count`
    as for `masked_mean`)."""
    squared = (values - returns) ** 2
    if value_clip_eps is not None:
        clipped_values = old_values + jnp.clip(values - old_values, -value_clip_eps, value_clip_eps)
        squared = jnp.maximum(squared, (clipped_values - returns) ** 2)
    return 0.5 * masked_mean(squared, mask, count)


def approx_kl(log_ratio: jax.Array, mask: jax.Array, count: jax.Array | None = None) -> jax.Array:
    """The low-variance KL(mu || pi) estimator `E[(r - 1) - log r]` (Schulman, 2020)."""
    return masked_mean(jnp.expm1(log_ratio) - log_ratio, mask, count)


class RowGroups(NamedTuple):
    """Agent groups of a multi-agent rollout, for per-group loss metrics: their names, and
    `of(obs [N, ...]) -> [N]` int, each row's group index."""

    names: tuple[str, ...]
    of: Callable[[jax.Array], jax.Array]


def make_ppo_loss(
    apply_fn: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]],
    distribution: ActionDistribution,
    hp: PPOHyperparams,
    groups: RowGroups | None = None,
) -> Callable[[Params, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """The PPO loss of one minibatch of flat transitions.

    The minibatch holds `obs [N, ...]`, `action [N, ...]`, `log_prob [N]`, `value [N]`,
    `advantage [N]`, `return [N]` and `valid [N]` (0 for padding rows some vector envs emit on
    auto-reset). With `groups`, the metrics also hold each agent group's policy and value loss
    and entropy (`loss/policy/<group>`, ...), over its rows; the loss itself is unchanged.
    A minibatch with `sums` (`minibatch_sums`, over every shard's part of it) is one shard's
    part: its means divide by those counts and its advantages are standardized with those
    moments, so the shards' losses and metrics add up to the whole minibatch's.
    """

    def loss_fn(params: Params, mb: Batch, clip_eps: jax.Array):
        head, values = apply_fn(params, mb["obs"])
        new_log_prob = distribution.log_prob(head, mb["action"])
        log_ratio = new_log_prob - mb["log_prob"]
        valid = mb["valid"]
        count = moments = group_counts = None
        if "sums" in mb:
            count, moments, group_counts = minibatch_statistics(mb["sums"])
        advantages = mb["advantage"]
        if hp.normalize_advantages:
            advantages = standardize(advantages, valid, moments=moments)
        policy_loss, clip_fraction = clipped_surrogate_loss(
            log_ratio, advantages, clip_eps, valid, count
        )
        v_loss = value_loss(values, mb["value"], mb["return"], hp.value_clip_eps, valid, count)
        entropy = masked_mean(distribution.entropy(head), valid, count)
        total = policy_loss + hp.vf_coef * v_loss - hp.ent_coef * entropy
        metrics = {
            "loss/total": total,
            "loss/policy": policy_loss,
            "loss/value": v_loss,
            "loss/entropy": entropy,
            "approx_kl": approx_kl(log_ratio, valid, count),
            "clip_fraction": clip_fraction,
        }
        if groups is not None:
            row_group = groups.of(mb["obs"])
            entropies = distribution.entropy(head)
            for index, name in enumerate(groups.names):
                mask = valid * (row_group == index)
                n = None if group_counts is None else group_counts[index]
                metrics[f"loss/policy/{name}"] = clipped_surrogate_loss(
                    log_ratio, advantages, clip_eps, mask, n
                )[0]
                metrics[f"loss/value/{name}"] = value_loss(
                    values, mb["value"], mb["return"], hp.value_clip_eps, mask, n
                )
                metrics[f"loss/entropy/{name}"] = masked_mean(entropies, mask, n)
        return total, metrics

    return loss_fn


def minibatch_sums(mb: Batch, groups: RowGroups | None = None) -> jax.Array:
    """What a minibatch's loss divides by, as sums that add over shards: valid rows, the sum
    and the sum of squares of their advantages, and (with `groups`) each group's valid rows."""
    valid = mb["valid"]
    advantage = mb["advantage"] * valid
    sums = [jnp.sum(valid), jnp.sum(advantage), jnp.sum(advantage * mb["advantage"])]
    if groups is not None:
        row_group = groups.of(mb["obs"])
        sums += [jnp.sum(valid * (row_group == index)) for index in range(len(groups.names))]
    return jnp.stack(sums)


def minibatch_statistics(sums: jax.Array) -> tuple[jax.Array, tuple, jax.Array]:
    """`minibatch_sums` summed over shards -> (valid rows, advantage (mean, std), each group's
    valid rows)."""
    count = sums[0]
    mean = sums[1] / jnp.maximum(count, 1.0)
    variance = jnp.maximum(sums[2] / jnp.maximum(count, 1.0) - mean**2, 0.0)
    return count, (mean, jnp.sqrt(variance)), sums[3:]


def data_parallel_epochs(
    grad_fn: Callable[[Params, Batch, jax.Array], tuple[Any, dict[str, jax.Array]]],
    optimizer: optax.GradientTransformation,
    carry: tuple[Params, optax.OptState],
    flat: Batch,
    key: jax.Array,
    num_epochs: int,
    num_minibatches: int,
    clip_eps: jax.Array,
    data_axis: str,
    sums_of: Callable[[Batch], jax.Array],
    rollout_sums: jax.Array,
    unroll: bool = False,
) -> tuple[Params, optax.OptState, dict[str, jax.Array], jax.Array]:
    """`minibatch_epochs` as one shard's part, under `shard_map` over `data_axis`: `flat` is
    this shard's rows, shuffled with the shared `key` (no collective), so minibatch m is the
    union of every shard's m-th. Every minibatch's `sums_of` (`minibatch_sums`) and the
    whole rollout's `rollout_sums` are summed over the shards in one `psum` before the first
    step; each step then sums its gradients and metrics, raveled into one vector, in one
    `psum`. Returns what `minibatch_epochs` does and the summed `rollout_sums`."""
    num_rows = next(iter(flat.values())).shape[0]
    minibatch_size = num_rows // num_minibatches
    orders = jax.vmap(
        lambda k: jax.random.permutation(k, num_rows)[: minibatch_size * num_minibatches]
    )(jax.random.split(key, num_epochs))

    def minibatches(order: jax.Array, fields: Batch) -> Batch:
        return {
            k: v[order].reshape((num_minibatches, minibatch_size) + v.shape[1:])
            for k, v in fields.items()
        }

    sums = jax.vmap(lambda order: jax.vmap(sums_of)(minibatches(order, flat)))(orders)
    both, unravel_sums = ravel_pytree((sums, rollout_sums))
    sums, rollout_sums = unravel_sums(jax.lax.psum(both, data_axis))

    def epoch(carry, xs):
        order, epoch_sums = xs

        def step(carry, mb):
            params, opt_state = carry
            parts = grad_fn(params, mb, clip_eps)
            raveled, unravel = ravel_pytree(parts)
            grads, metrics = unravel(jax.lax.psum(raveled, data_axis))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics["grad_norm"] = optax.tree.norm(grads)
            return (params, opt_state), metrics

        return jax.lax.scan(
            step, carry, minibatches(order, flat) | {"sums": epoch_sums}, unroll=unroll
        )

    (params, opt_state), metrics = jax.lax.scan(epoch, carry, (orders, sums), unroll=unroll)
    return params, opt_state, metrics, rollout_sums


def minibatch_epochs(
    grad_fn: Callable[[Params, Batch, jax.Array], tuple[Any, dict[str, jax.Array]]],
    optimizer: optax.GradientTransformation,
    carry: tuple[Params, optax.OptState],
    flat: Batch,
    key: jax.Array,
    num_epochs: int,
    num_minibatches: int,
    clip_eps: jax.Array,
    constrain_rows: Callable[[jax.Array], jax.Array],
    unroll: bool = False,
    orders: jax.Array | None = None,
    per_step: Batch | None = None,
) -> tuple[Params, optax.OptState, dict[str, jax.Array]]:
    """`num_epochs` passes over the rows of `flat` (arrays `[N, ...]`), each in
    `num_minibatches` shuffled minibatches, one gradient step each: `grad_fn(params, mb,
    clip_eps) -> (grads, metrics)`. Returns the parameters, optimizer state and every step's
    metrics (with `grad_norm`), stacked `[num_epochs, num_minibatches]`. PPO's and token-level
    PPO's updates share it; `constrain_rows` pins each minibatch's rows to the mesh; `unroll`
    writes the steps out instead of looping over them (`PPOHyperparams.unroll`).

    `orders` `int [num_epochs, num_minibatches, n]` gives each minibatch's rows instead of a
    shuffle from `key`; `per_step` holds arrays `[num_epochs, num_minibatches, ...]` that each
    step's minibatch gets as they are (a packed update's rows: `networks.packing`)."""
    num_rows = next(iter(flat.values())).shape[0]
    minibatch_size = num_rows // num_minibatches

    def epoch(carry, xs):
        key, order, given = xs
        if order is None:
            order = jax.random.permutation(key, num_rows)[: minibatch_size * num_minibatches]
            order = order.reshape(num_minibatches, minibatch_size)
        minibatches = {k: v[order] for k, v in flat.items()} | (given or {})

        def step(carry, mb):
            params, opt_state = carry
            mb = {k: constrain_rows(v) for k, v in mb.items()}
            grads, metrics = grad_fn(params, mb, clip_eps)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics["grad_norm"] = optax.tree.norm(grads)
            return (params, opt_state), metrics

        return jax.lax.scan(step, carry, minibatches, unroll=unroll)

    (params, opt_state), metrics = jax.lax.scan(
        epoch, carry, (jax.random.split(key, num_epochs), orders, per_step), unroll=unroll
    )
    return params, opt_state, metrics


def make_ppo_update(
    apply_fn: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]],
    distribution: ActionDistribution,
    optimizer: optax.GradientTransformation,
    hp: PPOHyperparams,
    constrain_rows: Callable[[jax.Array], jax.Array] = lambda x: x,
    groups: RowGroups | None = None,
    data_axis: str | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Return `update(state, rollout) -> (state, metrics)`, one PPO update.

    `rollout` is time-major: `obs [T, B, ...]`, `action [T, B, ...]`, `reward`, `log_prob`,
    `value`, `bootstrap_value` (float32 `[T, B]`), `terminated`, `truncated`, `valid`
    (`[T, B]`, any numeric dtype) and `last_value [B]`. `constrain_rows` is applied to every
    array whose leading axis is the transition axis (identity on one device; on a mesh, a
    sharding constraint along the batch axis). `groups`: per-group loss metrics
    (`make_ppo_loss`). With `data_axis`, the update is one shard's part of it (the module
    docstring; `data_parallel_epochs`).
    """
    loss_fn = make_ppo_loss(apply_fn, distribution, hp, groups)
    grad_fn = jax.grad(loss_fn, has_aux=True)
    if data_axis is not None:
        constrain_rows = lambda x: x  # noqa: E731  a shard's rows are its own already

    def update(state: TrainState, rollout: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        terminated = rollout["terminated"].astype(bool)
        truncated = rollout["truncated"].astype(bool)
        next_values = next_state_values(
            rollout["value"],
            rollout["last_value"],
            terminated,
            truncated,
            rollout["bootstrap_value"],
        )
        advantages, returns = compute_gae(
            rollout["reward"],
            rollout["value"],
            next_values,
            terminated | truncated,
            hp.gamma,
            hp.gae_lambda,
        )
        flat = {
            "obs": rollout["obs"],
            "action": rollout["action"],
            "log_prob": rollout["log_prob"],
            "value": rollout["value"],
            "advantage": advantages,
            "return": returns,
            "valid": rollout["valid"].astype(jnp.float32),
        }
        num_rows = rollout["reward"].shape[0] * rollout["reward"].shape[1]
        flat = {k: constrain_rows(v.reshape((num_rows,) + v.shape[2:])) for k, v in flat.items()}
        progress = state.update_count.astype(jnp.float32) / hp.num_updates
        clip_eps = hp.clip_eps * (1.0 - progress) if hp.anneal_clip else jnp.float32(hp.clip_eps)
        key, epoch_key = jax.random.split(state.key)
        if data_axis is None:
            params, opt_state, metrics = minibatch_epochs(
                grad_fn,
                optimizer,
                (state.params, state.opt_state),
                flat,
                epoch_key,
                hp.num_epochs,
                hp.num_minibatches,
                clip_eps,
                constrain_rows,
                hp.unroll,
            )
            totals = rollout_sums(flat)
        else:
            params, opt_state, metrics, totals = data_parallel_epochs(
                grad_fn,
                optimizer,
                (state.params, state.opt_state),
                flat,
                epoch_key,
                hp.num_epochs,
                hp.num_minibatches,
                clip_eps,
                data_axis,
                lambda mb: minibatch_sums(mb, groups),
                rollout_sums(flat),
                hp.unroll,
            )
        metrics = jax.tree.map(jnp.mean, metrics)
        count, return_sum, return_squares, error_squares = (totals[i] for i in range(4))
        target_mean = return_sum / jnp.maximum(count, 1.0)
        target_variance = return_squares / jnp.maximum(count, 1.0) - target_mean**2
        metrics["value_target_mean"] = target_mean
        metrics["explained_variance"] = 1.0 - error_squares / jnp.maximum(count, 1.0) / (
            jnp.maximum(target_variance, 1e-8)
        )
        metrics["clip_eps"] = clip_eps
        # Counted here, from what the device holds, for the run's accounting.
        metrics["trained_rows"] = count.astype(jnp.int32)
        new_state = TrainState(
            params=params, opt_state=opt_state, update_count=state.update_count + 1, key=key
        )
        return new_state, metrics

    return update


def rollout_sums(flat: Batch) -> jax.Array:
    """The whole rollout's sums the update's closing metrics need (they add over shards):
    valid rows, their returns' sum and sum of squares, and the value error's sum of squares."""
    valid, returns = flat["valid"], flat["return"]
    return jnp.stack(
        [
            jnp.sum(valid),
            jnp.sum(returns * valid),
            jnp.sum(returns**2 * valid),
            jnp.sum((returns - flat["value"]) ** 2 * valid),
        ]
    )


def make_optimizer(
    learning_rate: float,
    anneal: bool,
    total_gradient_steps: int,
    max_grad_norm: float,
    adam_eps: float,
) -> optax.GradientTransformation:
    """Adam with global-norm clipping, and a linear decay to 0 when `anneal`."""
    schedule = (
        optax.linear_schedule(learning_rate, 0.0, max(total_gradient_steps, 1))
        if anneal
        else learning_rate
    )
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(schedule, eps=adam_eps))


def float32_moments(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer` kept in float32 for lower-precision (bfloat16) parameters: its state (Adam's
    moments) is made from, and updated with, float32 copies of the parameters and gradients,
    and its updates are float32 (`optax.apply_updates` casts each to its parameter's dtype)."""

    def as_float32(tree: Any) -> Any:
        return jax.tree.map(lambda x: x.astype(jnp.float32), tree)

    def init(params: Any) -> optax.OptState:
        return optimizer.init(as_float32(params))

    def update(grads: Any, state: optax.OptState, params: Any = None) -> tuple[Any, Any]:
        return optimizer.update(
            as_float32(grads), state, None if params is None else as_float32(params)
        )

    return optax.GradientTransformation(init, update)


def cpu_unrolls(backend: str, torso: str, obs_shape: tuple[int, ...]) -> bool:
    """Whether PPO's gradient steps are unrolled (`PPOHyperparams.unroll`): for a CNN torso on
    XLA's CPU backend and images of at least 32x32 pixels, where a convolution's gradient in a
    loop body runs ~8x slower than outside one (~4 s against ~0.5 s per 256 Atari frames,
    docs/atari.md). Smaller images (Catch, MinAtar) keep the loop, which compiles once."""
    pixels = obs_shape[0] * obs_shape[1] if len(obs_shape) >= 2 else 0
    return backend == "cpu" and torso != "mlp" and pixels >= UNROLL_MIN_PIXELS


UNROLL_MIN_PIXELS = 32 * 32
