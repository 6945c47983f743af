"""Token-level PPO for language-model policies on text envs, as pure, jit-able functions.

An env step is one message: the policy reads the dialogue so far (`obs [T, B, L]` token ids)
and generates a response (`action [T, B, M]` token ids, ended by EOS). The env's reward belongs
to the message's last token; advantages and value targets are per generated token, by GAE over
the tokens of a segment in order (message t's tokens, then message t+1's), so a multi-turn
dialogue is one sequence of decisions. A frozen reference policy (the initial parameters, or
an adapter run's frozen base: `Finetuning`) anchors training: its per-token log-probabilities
give a KL penalty in the reward or a loss term. With `advantage = "group"` the critic is
dropped (GRPO): each answer's advantage is its reward standardized over the answers to the same
prompt. The clipped surrogate, value loss and masked statistics are PPO's own
(`algorithms.ppo`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from agentenv_jax.algorithms.ppo import (
    Batch,
    Params,
    approx_kl,
    clipped_surrogate,
    masked_mean,
    minibatch_epochs,
    standardize,
    value_loss,
)
from agentenv_jax.networks.packing import PACKED_MESSAGE_FIELDS, PACKED_ROW_FIELDS, PackedRows

# `score(params, context [N, L], response [N, M]) -> (log_probs, values, entropy, mask)`, each
# `[N, M]`: the policy's view of a generated response (`networks.language_model`).
ScoreFn = Callable[
    [Params, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array, jax.Array]
]
# The same of messages packed into rows: `(params, PackedRows, response [N, M])`.
PackedScoreFn = Callable[
    [Params, PackedRows, jax.Array], tuple[jax.Array, jax.Array, jax.Array, jax.Array]
]


@flax.struct.dataclass
class TokenTrainState:
    """The learner's state for a language-model policy: `TrainState`'s fields and the frozen
    reference parameters (the initial policy), one pytree for one checkpoint."""

    params: Params
    ref_params: Params | None  # None where `Finetuning.reference` derives it from `params`
    opt_state: optax.OptState  # of `Finetuning.part(params)`, the parameters trained
    update_count: jax.Array  # int32 scalar, completed updates
    key: jax.Array  # PRNG key for minibatch shuffling


@dataclasses.dataclass(frozen=True)
class TokenPPOHyperparams:
    """The static settings the update closes over (see `PPOConfig` for their meaning)."""

    num_epochs: int
    num_minibatches: int
    gamma: float
    gae_lambda: float
    clip_eps: float
    value_clip_eps: float | None
    vf_coef: float
    ent_coef: float
    normalize_advantages: bool
    kl_coef: float
    kl_penalty: str  # "reward" or "loss"
    advantage: str  # "gae", "group" or "rloo"
    group_size: int
    kl_estimator: str = "k3"  # of the loss term: "k1" or "k3"
    scale_group_rewards: bool = True
    loss_aggregation: str = "token"  # "token", "sequence" or "constant"
    clip_eps_high: float | None = None  # None: clip_eps
    importance_ratio: str = "token"  # "token" or "sequence" (GSPO)
    dynamic_sampling: bool = False
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    # Asynchronous generation (max_policy_lag > 0): the truncation of each token's weight
    # pi_start / pi_behaviour; None where the sampler is the policy being updated.
    importance_weight_cap: float | None = None
    # The configured answer length M, which Dr. GRPO's normaliser and the overlong penalty
    # read; None: the batch's own (its responses may be trimmed to their longest answer).
    response_length: int | None = None
    # Messages per episode round of a multi-turn env under a group baseline: every env starts
    # an episode together every `round_length` steps (`TextVectorEnv(round_turns=...)`), so a
    # segment's rows `[k R, (k + 1) R)` hold one whole episode of each env. 1: single turn.
    round_length: int = 1


def _stored_reference(params: Params, ref_params: Params) -> Params:
    return ref_params


@dataclasses.dataclass(frozen=True)
class Finetuning:
    """Which parameters an update trains and which policy is its reference. By default every
    parameter is trained and the reference is `ref_params`, a frozen copy of the initial
    policy; an adapter run (LoRA) trains some top-level groups of the parameter tree (the
    adapters and the value head), so only they get gradients and optimizer state, and derives
    the reference from the frozen rest (`reference(params, ref_params)`)."""

    trained: tuple[str, ...] | None = None  # top-level groups of the parameters (None: all)
    reference: Callable[[Params, Params | None], Params] = _stored_reference

    def part(self, params: Params) -> Params:
        """The trained part of `params`: what the gradient and the optimizer see."""
        return params if self.trained is None else {k: params[k] for k in self.trained}

    def merge(self, params: Params, part: Params) -> Params:
        """`params` with its trained part replaced by `part`."""
        return part if self.trained is None else params | part


def last_token_mask(mask: jax.Array) -> jax.Array:
    """`mask [..., M]` (1 for a message's generated tokens, a prefix) -> 1 at its last token."""
    following = jnp.concatenate([mask[..., 1:], jnp.zeros_like(mask[..., :1])], axis=-1)
    return mask * (1.0 - following)


def token_gae(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    bootstrap_value: jax.Array,
    last_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """GAE over the generated tokens of a segment, message after message.

    Args:
      token_rewards: `[T, B, M]` reward of each token (the env's reward on a message's last
        token, KL penalties on any).
      values: `[T, B, M]` V of the state before each token was generated.
      mask: `[T, B, M]` 1 for generated tokens of valid messages (a prefix of each message;
        all 0 for a padding row), 0 elsewhere: masked tokens are skipped.
      terminated, truncated: `[T, B]` bool, the episode ended with message t.
      bootstrap_value: `[T, B]` V(final observation) where truncated.
      last_value: `[B]` V of the observation after the segment's last message.
      gamma, gae_lambda: per-token discount and GAE lambda.

    Returns `(advantages, returns)`, `[T, B, M]`, 0 at masked tokens.
    """
    t, b, m = values.shape
    last = last_token_mask(mask)
    # One time axis of T * M tokens, time-major.
    flat = lambda x: jnp.swapaxes(x, 1, 2).reshape(t * m, b)  # noqa: E731
    per_token = lambda x: jnp.broadcast_to(x[:, :, None], (t, b, m))  # noqa: E731
    is_last = flat(last) > 0
    ended_term = terminated.astype(bool)
    ended_trunc = truncated.astype(bool) & ~ended_term
    term = flat(per_token(ended_term)) & is_last
    trunc = flat(per_token(ended_trunc)) & is_last
    boot = flat(per_token(bootstrap_value))
    # An episode that ended on a row without tokens (a faulted env step, say) still cuts the
    # sequence there: the message before it bootstraps from V(state of the row) = gamma *
    # bootstrap where truncated (how the actor writes a faulted row), 0 where terminated.
    empty_end = (mask.sum(-1) == 0) & (ended_term | ended_trunc)  # [T, B]
    at_first = jnp.zeros((t, b, m), bool).at[:, :, 0].set(empty_end)
    cut = flat(at_first)
    cut_value = flat(per_token(jnp.where(ended_trunc, gamma * bootstrap_value, 0.0)))

    def step(carry, x):
        next_value, next_adv = carry
        reward, value, valid, term_t, trunc_t, boot_t, cut_t, cut_value_t = x
        nv = jnp.where(term_t, 0.0, jnp.where(trunc_t, boot_t, next_value))
        cont = 1.0 - (term_t | trunc_t).astype(values.dtype)
        delta = reward + gamma * nv - value
        adv = delta + gamma * gae_lambda * cont * next_adv
        valid = valid > 0
        carry = (
            jnp.where(valid, value, jnp.where(cut_t, cut_value_t, next_value)),
            jnp.where(valid, adv, jnp.where(cut_t, 0.0, next_adv)),
        )
        return carry, jnp.where(valid, adv, 0.0)

    xs = (flat(token_rewards), flat(values), flat(mask), term, trunc, boot, cut, cut_value)
    init = (last_value.astype(values.dtype), jnp.zeros_like(last_value, dtype=values.dtype))
    _, advantages = jax.lax.scan(step, init, xs, reverse=True)
    advantages = jnp.swapaxes(advantages.reshape(t, m, b), 1, 2)
    returns = (advantages + values) * mask
    return advantages, returns


def group_advantages(
    reward: jax.Array, valid: jax.Array, group_size: int, eps: float = 1e-6, scale: bool = True
) -> jax.Array:
    """GRPO's critic-free advantage: `reward [T, B]` minus its group's mean, over each group of
    `group_size` consecutive envs (the answers to one prompt) and its valid rows `valid [T, B]`,
    divided by the group's std when `scale` (GRPO; Dr. GRPO does not). Returns `[T, B]` (0 on
    invalid rows; 0 for a group whose answers all scored alike)."""
    t, b = reward.shape
    r = reward.reshape(t, b // group_size, group_size)
    v = valid.astype(reward.dtype).reshape(r.shape)
    count = jnp.maximum(v.sum(-1, keepdims=True), 1.0)
    mean = (r * v).sum(-1, keepdims=True) / count
    centred = (r - mean) * v
    if scale:
        std = jnp.sqrt((centred**2).sum(-1, keepdims=True) / count)
        centred = centred / (std + eps)
    return centred.reshape(t, b)


def rloo_advantages(reward: jax.Array, valid: jax.Array, group_size: int) -> jax.Array:
    """RLOO's advantage: each valid answer's reward minus the mean reward of the other valid
    answers of its group (`[T, B]`, groups of `group_size` consecutive envs). 0 on invalid rows
    and where a group has fewer than two valid answers."""
    t, b = reward.shape
    r = reward.reshape(t, b // group_size, group_size)
    v = valid.astype(reward.dtype).reshape(r.shape)
    count = v.sum(-1, keepdims=True)
    others_mean = ((r * v).sum(-1, keepdims=True) - r) / jnp.maximum(count - 1.0, 1.0)
    return ((r - others_mean) * v * (count >= 2)).reshape(t, b)


def episode_rewards(
    reward: jax.Array, valid: jax.Array, round_length: int
) -> tuple[jax.Array, jax.Array]:
    """Each episode's return and whether it has any valid message: `reward, valid [T, B]` summed
    over the rows of each round of `round_length` messages (one episode of each env), giving
    `[T / R, B]` each. With `round_length` 1 (single turn) they are `reward` and `valid`."""
    if round_length == 1:
        return reward, valid
    t, b = reward.shape
    v = valid.astype(reward.dtype).reshape(t // round_length, round_length, b)
    returns = (reward.reshape(v.shape) * v).sum(1)
    return returns, v.max(1)


def per_message(per_episode: jax.Array, valid: jax.Array, round_length: int) -> jax.Array:
    """`per_episode [T / R, B]` given to each valid message of its episode: `[T, B]`."""
    return jnp.repeat(per_episode, round_length, axis=0) * valid


def episode_group_advantages(
    reward: jax.Array, valid: jax.Array, hp: TokenPPOHyperparams
) -> jax.Array:
    """The group baseline (`group` or `rloo`) over whole episodes: each episode's return
    (`episode_rewards`) against the other episodes of its group (the group's envs' episodes of
    the same round, which share a prompt), given to every message of the episode. `[T, B]`, 0
    on invalid messages (an env waiting for its group's round to end)."""
    returns, episode_valid = episode_rewards(reward, valid, hp.round_length)
    if hp.advantage == "group":
        advantage = group_advantages(
            returns, episode_valid, hp.group_size, scale=hp.scale_group_rewards
        )
    else:
        advantage = rloo_advantages(returns, episode_valid, hp.group_size)
    return per_message(advantage, valid, hp.round_length)


def alike_groups(reward: jax.Array, valid: jax.Array, group_size: int) -> jax.Array:
    """`[T, B]` bool: the row's group has valid answers and they all have the same reward (a
    group that teaches nothing, which dynamic sampling leaves out)."""
    t, b = reward.shape
    r = reward.reshape(t, b // group_size, group_size)
    v = valid.astype(bool).reshape(r.shape)
    highest = jnp.max(jnp.where(v, r, -jnp.inf), axis=-1, keepdims=True)
    lowest = jnp.min(jnp.where(v, r, jnp.inf), axis=-1, keepdims=True)
    alike = (highest <= lowest) & v.any(-1, keepdims=True)
    return jnp.broadcast_to(alike, r.shape).reshape(t, b)


def overlong_penalty(
    lengths: jax.Array, response_length: int, buffer: int, penalty: float
) -> jax.Array:
    """DAPO's soft overlong punishment of answers of `lengths` tokens: 0 up to `response_length
    - buffer`, then falling linearly to `-penalty` at `response_length`."""
    if buffer == 0:
        return jnp.zeros_like(lengths, jnp.float32)
    over = (lengths.astype(jnp.float32) - (response_length - buffer)) / buffer
    return -penalty * jnp.clip(over, 0.0, 1.0)


def shaped_reward(
    reward: jax.Array,
    valid: jax.Array,
    lengths: jax.Array,
    response_length: int,
    hp: TokenPPOHyperparams,
) -> jax.Array:
    """`[T, B]`: each answer's reward with its overlong penalty (`lengths`: its tokens, EOS
    included, of at most `response_length`), what group advantages and dynamic sampling see."""
    response_length = hp.response_length or response_length
    return reward + valid * overlong_penalty(
        lengths, response_length, hp.overlong_buffer, hp.overlong_penalty
    )


def informative_groups(
    reward: jax.Array,
    valid: jax.Array,
    lengths: jax.Array,
    response_length: int,
    hp: TokenPPOHyperparams,
) -> jax.Array:
    """`[T, B // group_size]` bool: the groups of `[T, B]` answers (of `lengths` tokens, EOS
    included, out of `response_length`) that the update trains on under dynamic sampling: some
    valid answers, not all with the same shaped reward."""
    t = reward.shape[0]
    valid = valid.astype(jnp.float32)
    shaped = shaped_reward(reward, valid, lengths, response_length, hp)
    alike = alike_groups(shaped, valid, hp.group_size)
    some_valid = valid.reshape(t, -1, hp.group_size).max(-1) > 0
    return some_valid & ~alike.reshape(t, -1, hp.group_size)[..., 0]


def aggregate(
    per_token: jax.Array, mask: jax.Array, how: str, response_length: int | None = None
) -> jax.Array:
    """One number from per-token losses `[N, M]` over the tokens where `mask` is 1: "token"
    (their mean: DAPO), "sequence" (the mean over answers with tokens of each answer's mean:
    GRPO) or "constant" (their sum / (N * response_length), M by default: Dr. GRPO, which
    weighs every token alike whatever its answer's length)."""
    mask = mask.astype(per_token.dtype)
    if how == "token":
        return masked_mean(per_token, mask)
    if how == "constant":
        length = per_token.shape[1] if response_length is None else response_length
        return jnp.sum(per_token * mask) / (per_token.shape[0] * length)
    lengths = mask.sum(-1)
    per_answer = (per_token * mask).sum(-1) / jnp.maximum(lengths, 1.0)
    answered = (lengths > 0).astype(per_token.dtype)
    return jnp.sum(per_answer * answered) / jnp.maximum(jnp.sum(answered), 1.0)


def sequence_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO's ratio: each answer's mean per-token log-ratio, on every one of its tokens
    (`[N, M]`; 0 where `mask` is 0)."""
    mask = mask.astype(log_ratio.dtype)
    mean = (log_ratio * mask).sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1)
    return mean * mask


def kl_k3(log_prob: jax.Array, ref_log_prob: jax.Array) -> jax.Array:
    """The unbiased, non-negative per-token estimator of KL(pi || ref) from samples of pi:
    `exp(ref - logp) - (ref - logp) - 1` (Schulman, 2020; GRPO's KL term)."""
    diff = ref_log_prob - log_prob
    return jnp.expm1(diff) - diff


def truncated_importance_weight(
    proximal: jax.Array, behaviour: jax.Array, mask: jax.Array, cap: float, level: str
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Decoupled PPO's correction of stale samples: with the proximal policy (the one an
    update starts from) in the ratio in place of the sampler, each token's loss is weighted by
    `min(pi_proximal / pi_behaviour, cap)` (truncated importance sampling; per answer, from
    its mean log-ratio, where `level` is "sequence" as in GSPO).

    Args:
      proximal, behaviour: `[..., M]` per-token log-probs (0 where `mask` is 0).
      mask: `[..., M]` 1 for the tokens trained on.

    Returns the truncated weights (0 where masked) and the untruncated weight's masked mean,
    std, min and max and the fraction truncated (`importance_weight_*`; all 0 without
    tokens)."""
    log_weight = (proximal - behaviour) * mask
    if level == "sequence":
        log_weight = sequence_log_ratio(log_weight, mask)
    weight = jnp.exp(log_weight)
    mean = masked_mean(weight, mask)
    valid = mask > 0
    metrics = {
        "importance_weight_mean": mean,
        "importance_weight_std": jnp.sqrt(masked_mean((weight - mean) ** 2, mask)),
        "importance_weight_min": jnp.where(
            jnp.any(valid), jnp.min(jnp.where(valid, weight, jnp.inf)), 0.0
        ),
        "importance_weight_max": jnp.max(jnp.where(valid, weight, 0.0)),
        "importance_weight_clipped": masked_mean((weight > cap).astype(weight.dtype), mask),
    }
    return jnp.minimum(weight, cap) * mask, metrics


def make_token_ppo_loss(
    score_fn: ScoreFn, hp: TokenPPOHyperparams, packed_score_fn: PackedScoreFn | None = None
) -> Callable[[Params, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """The loss of one minibatch of messages: `obs [N, L]`, `action [N, M]`, `log_prob` (of
    the proximal policy), `value`, `ref_log_prob`, `advantage`, `return`, `mask` (all `[N, M]`)
    and, with `importance_weight_cap`, `importance_weight` (`[N, M]`, truncated). A minibatch
    that holds its messages packed (`packed_tokens`, `packed_segments`, `packed_rows`,
    `packed_columns`: `networks.packing`) is scored by `packed_score_fn(params, PackedRows,
    action)`, which computes none of its padding."""

    clip_high = hp.clip_eps if hp.clip_eps_high is None else hp.clip_eps_high

    def scores(params: Params, mb: Batch) -> tuple[jax.Array, ...]:
        if PACKED_ROW_FIELDS[0] not in mb:
            return score_fn(params, mb["obs"], mb["action"])
        packed = PackedRows(*(mb[name] for name in PACKED_ROW_FIELDS))
        return packed_score_fn(params, packed, mb["action"])

    def loss_fn(params: Params, mb: Batch, clip_eps: jax.Array):
        log_probs, values, entropy, _ = scores(params, mb)
        mask = mb["mask"]
        # Against the proximal policy: the sampler's, or the update's starting one where the
        # samples are stale (then `importance_weight` corrects for the sampler).
        log_ratio = (log_probs - mb["log_prob"]) * mask
        advantages = mb["advantage"]
        if hp.normalize_advantages:
            advantages = standardize(advantages, mask)
        ratio = (
            sequence_log_ratio(log_ratio, mask) if hp.importance_ratio == "sequence" else log_ratio
        )
        per_token, clipped = clipped_surrogate(ratio, advantages, clip_eps, clip_high)
        if hp.importance_weight_cap is not None:
            per_token = per_token * mb["importance_weight"]
        policy_loss = aggregate(per_token, mask, hp.loss_aggregation, hp.response_length)
        entropy_mean = aggregate(entropy, mask, hp.loss_aggregation, hp.response_length)
        total = policy_loss - hp.ent_coef * entropy_mean
        metrics = {
            "loss/policy": policy_loss,
            "loss/entropy": entropy_mean,
            "approx_kl": approx_kl(log_ratio, mask),
            "clip_fraction": masked_mean(clipped, mask),
        }
        if hp.advantage == "gae":
            v_loss = value_loss(values, mb["value"], mb["return"], hp.value_clip_eps, mask)
            total = total + hp.vf_coef * v_loss
            metrics["loss/value"] = v_loss
        if hp.kl_coef > 0 and hp.kl_penalty == "loss":
            per_token_kl = (
                kl_k3(log_probs, mb["ref_log_prob"])
                if hp.kl_estimator == "k3"
                else log_probs - mb["ref_log_prob"]
            )
            kl = aggregate(per_token_kl, mask, hp.loss_aggregation, hp.response_length)
            total = total + hp.kl_coef * kl
            metrics["loss/kl"] = kl
        metrics["loss/total"] = total
        return total, metrics

    return loss_fn


def make_token_ppo_update(
    score_fn: ScoreFn,
    optimizer: optax.GradientTransformation,
    hp: TokenPPOHyperparams,
    constrain_rows: Callable[[jax.Array], jax.Array] = lambda x: x,
    finetuning: Finetuning = Finetuning(),
    packed_score_fn: PackedScoreFn | None = None,
) -> Callable[[TokenTrainState, Batch], tuple[TokenTrainState, dict[str, jax.Array]]]:
    """Return `update(state, rollout) -> (state, metrics)`, one token-level PPO update.

    `rollout` is time-major over messages: `obs [T, B, L]` and `action [T, B, M]` int32 token
    ids, behaviour `log_prob`/`value` `[T, B, M]`, `reward`, `bootstrap_value` `[T, B]`
    float32, `terminated`, `truncated`, `valid` `[T, B]` and `last_value [B]`. Minibatches are
    drawn over messages; `constrain_rows` pins arrays whose leading axis is the message axis.
    `finetuning` says which parameters are trained (the optimizer holds state for those
    alone) and which are the reference policy's.

    A rollout with `minibatch_orders` and its minibatches packed (`networks.packing.
    packed_minibatches`) trains on those minibatches, scored by `packed_score_fn` without
    their padding: the same gradient steps as the padded minibatches of the same orders. The
    reference policy's pass (and the proximal policy's) scores the update's messages packed
    all at once, likewise.
    """
    loss_fn = make_token_ppo_loss(score_fn, hp, packed_score_fn)

    def update(state: TokenTrainState, rollout: Batch) -> tuple[TokenTrainState, Any]:
        t, b = rollout["reward"].shape
        num_rows = t * b
        rows = lambda x: constrain_rows(x.reshape((num_rows,) + x.shape[2:]))  # noqa: E731
        obs, action = rows(rollout["obs"]), rows(rollout["action"])
        if PACKED_MESSAGE_FIELDS[0] in rollout:  # every message packed: no padding computed
            every = PackedRows(*(rollout[name] for name in PACKED_MESSAGE_FIELDS))
            score_all = lambda params: packed_score_fn(params, every, action)  # noqa: E731
        else:
            score_all = lambda params: score_fn(params, obs, action)  # noqa: E731
        # The reference policy's log-probs of what was generated, once per update.
        reference = finetuning.reference(state.params, state.ref_params)
        ref_log_prob, _, _, token_mask = score_all(reference)
        ref_log_prob = ref_log_prob.reshape(t, b, -1)
        received = valid = rollout["valid"].astype(jnp.float32)
        token_mask = token_mask.reshape(t, b, -1)
        if "response_tokens" in rollout:
            # Only the tokens the env took are trained: none for a step whose message was not
            # a move (a seat whose game ended on another seat's move), which carries its
            # reward and episode end; the first n of a completion cut at n tokens (an agent's
            # request's max_tokens or stop string), the rest never reaching its agent.
            taken = jnp.arange(token_mask.shape[-1]) < rollout["response_tokens"][:, :, None]
            token_mask = token_mask * taken.astype(token_mask.dtype)
        reward = shaped_reward(
            rollout["reward"], valid, token_mask.sum(-1), token_mask.shape[-1], hp
        )
        dropped = None
        if hp.dynamic_sampling:
            dropped = alike_groups(reward, valid, hp.group_size)
            valid = valid * (1.0 - dropped)
        mask = token_mask * valid[:, :, None]
        behaviour = rollout["log_prob"] * mask
        sample_kl = (behaviour - ref_log_prob) * mask  # log pi_behaviour - log pi_ref, per token
        terminated = rollout["terminated"].astype(bool)
        truncated = rollout["truncated"].astype(bool)
        if hp.advantage != "gae":
            advantages = episode_group_advantages(reward, valid, hp)[:, :, None] * mask
            returns = jnp.zeros_like(advantages)
        else:
            rewards = last_token_mask(mask) * reward[:, :, None]
            if hp.kl_coef > 0 and hp.kl_penalty == "reward":
                rewards = rewards - hp.kl_coef * sample_kl
            advantages, returns = token_gae(
                rewards,
                rollout["value"] * mask,
                mask,
                terminated,
                truncated,
                rollout["bootstrap_value"],
                rollout["last_value"],
                hp.gamma,
                hp.gae_lambda,
            )
        proximal, correction = behaviour, {}
        if hp.importance_weight_cap is not None:
            # The policy this update starts from, on the stale samples.
            proximal = score_all(state.params)[0].reshape(t, b, -1) * mask
            weight, correction = truncated_importance_weight(
                proximal, behaviour, mask, hp.importance_weight_cap, hp.importance_ratio
            )
        flat = {
            "obs": obs,
            "action": action,
            "log_prob": rows(proximal),
            "value": rows(rollout["value"] * mask),
            "ref_log_prob": rows(ref_log_prob),
            "advantage": rows(advantages),
            "return": rows(returns),
            "mask": rows(mask),
        }
        if correction:
            flat["importance_weight"] = rows(weight)
        key, epoch_key = jax.random.split(state.key)

        # Gradients of the trained part only: the frozen rest is a constant of the loss.
        def part_loss(part: Params, mb: Batch, clip_eps: jax.Array):
            return loss_fn(finetuning.merge(state.params, part), mb, clip_eps)

        packed = {name: rollout[name] for name in PACKED_ROW_FIELDS if name in rollout}
        part, opt_state, metrics = minibatch_epochs(
            jax.grad(part_loss, has_aux=True),
            optimizer,
            (finetuning.part(state.params), state.opt_state),
            flat,
            epoch_key,
            hp.num_epochs,
            hp.num_minibatches,
            jnp.float32(hp.clip_eps),
            constrain_rows,
            orders=rollout.get("minibatch_orders"),
            per_step=packed or None,
        )
        metrics = jax.tree.map(jnp.mean, metrics) | correction
        tokens = jnp.sum(mask)
        metrics["kl_to_reference"] = jnp.sum(sample_kl) / jnp.maximum(tokens, 1.0)
        if hp.advantage == "gae":
            value_error = masked_mean((returns - rollout["value"]) ** 2, mask)
            target_mean = masked_mean(returns, mask)
            # What predicting the targets' mean for every token would err: their variance.
            target_variance = masked_mean((returns - target_mean) ** 2, mask)
            metrics["value_error"] = value_error
            metrics["value_target_mean"] = target_mean
            metrics["explained_variance"] = 1.0 - value_error / jnp.maximum(target_variance, 1e-8)
        metrics["response_length_mean"] = tokens / jnp.maximum(jnp.sum(valid), 1.0)
        if dropped is not None:
            metrics["groups_dropped"] = jnp.sum(dropped) / hp.group_size
        # Counted here, from what the device holds, for the run's accounting.
        metrics["trained_rows"] = jnp.sum(rollout["valid"].astype(jnp.int32))
        # Every valid message's tokens, those of groups dynamic sampling left out too: they
        # were consumed by this update (the run's token accounting reconciles on them).
        metrics["trained_tokens"] = jnp.sum(token_mask * received[:, :, None]).astype(jnp.int32)
        new_state = state.replace(
            params=finetuning.merge(state.params, part),
            opt_state=opt_state,
            update_count=state.update_count + 1,
            key=key,
        )
        return new_state, metrics

    return update
