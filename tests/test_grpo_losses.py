"""The GRPO family on token-level PPO's loss, each variant against a numpy reference on hand-made
groups: group advantages with and without std scaling (GRPO, Dr. GRPO), RLOO's leave-one-out
baseline, the token / sequence / constant loss aggregations (DAPO, GRPO, Dr. GRPO), clip-higher,
GSPO's sequence-level ratio, the k1 and k3 KL terms, DAPO's overlong shaping, and dynamic
sampling, which leaves out exactly the groups whose answers all scored alike, and the truncated
importance correction of asynchronous (stale) samples."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentenv_jax.algorithms.ppo import clipped_surrogate
from agentenv_jax.algorithms.token_ppo import (
    TokenPPOHyperparams,
    TokenTrainState,
    aggregate,
    alike_groups,
    episode_group_advantages,
    group_advantages,
    make_token_ppo_loss,
    make_token_ppo_update,
    overlong_penalty,
    rloo_advantages,
    sequence_log_ratio,
    truncated_importance_weight,
)
from agentenv_jax.learner.group_refill import informative_mask, refilled_rollout

# Two prompts (rows) of groups of 4 answers over 8 envs: [T=2, B=8].
REWARD = np.array(
    [[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 3.0]],
    np.float32,
)
VALID = np.array([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1, 1, 0]], np.float32)
G = 4


def _groups(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], -1, G)


def numpy_group_advantages(reward, valid, scale: bool, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(reward)
    for t, g in itertools.product(range(reward.shape[0]), range(reward.shape[1] // G)):
        cols = slice(g * G, (g + 1) * G)
        r, v = reward[t, cols], valid[t, cols] > 0
        if not v.any():
            continue
        centred = r[v] - r[v].mean()
        if scale:
            centred = centred / (r[v].std() + eps)
        out[t, cols][v] = centred
    return out


def numpy_rloo(reward, valid) -> np.ndarray:
    out = np.zeros_like(reward)
    for t, g in itertools.product(range(reward.shape[0]), range(reward.shape[1] // G)):
        members = [g * G + i for i in range(G) if valid[t, g * G + i] > 0]
        if len(members) < 2:
            continue
        for i in members:
            others = [reward[t, j] for j in members if j != i]
            out[t, i] = reward[t, i] - np.mean(others)
    return out


@pytest.mark.parametrize("scale", [True, False], ids=["grpo", "dr_grpo"])
def test_group_advantages_against_numpy(scale):
    got = group_advantages(jnp.asarray(REWARD), jnp.asarray(VALID), G, scale=scale)
    np.testing.assert_allclose(got, numpy_group_advantages(REWARD, VALID, scale), atol=1e-5)
    # The alike group (row 0, envs 4-7: all 1) gets no advantage either way.
    assert np.all(np.asarray(got)[0, 4:] == 0)


def test_rloo_subtracts_the_mean_of_the_other_answers():
    got = np.asarray(rloo_advantages(jnp.asarray(REWARD), jnp.asarray(VALID), G))
    np.testing.assert_allclose(got, numpy_rloo(REWARD, VALID), atol=1e-6)
    # By hand, row 1's first group: valid rewards 0.5, 0, 1 (env 2 invalid).
    np.testing.assert_allclose(got[1, :4], [0.5 - 0.5, 0 - 0.75, 0.0, 1 - 0.25], atol=1e-6)


# Two rounds of 3 messages of one group of 4 envs (a multi-turn task): [T=6, B=4]. Each env's
# episode of a round ends at a different turn, and waits (invalid) for the round's end.
ROUND_VALID = np.array(
    [
        [1, 1, 1, 1],
        [1, 0, 1, 1],
        [0, 0, 1, 1],
        [1, 1, 1, 1],
        [1, 1, 0, 0],
        [1, 0, 0, 0],
    ],
    np.float32,
)
ROUND_REWARD = np.array(
    [
        [0.0, 1.0, 0.0, 0.0],
        [0.5, 9.0, 0.0, 0.2],  # 9.0: a waiting env's row, not counted
        [9.0, 9.0, 1.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 1.0, 9.0, 9.0],
        [1.0, 9.0, 9.0, 9.0],
    ],
    np.float32,
)


@pytest.mark.parametrize("advantage", ["group", "dr_grpo", "rloo"])
def test_multi_turn_group_advantages_compare_whole_episodes_against_numpy(advantage):
    """Each episode's return (its valid messages' rewards) against its group's episodes of the
    same round, given to every valid message of the episode; waiting rows get nothing."""
    hp = hyperparams(
        advantage="rloo" if advantage == "rloo" else "group",
        scale_group_rewards=advantage == "group",
        group_size=4,
        round_length=3,
    )
    got = np.asarray(
        episode_group_advantages(jnp.asarray(ROUND_REWARD), jnp.asarray(ROUND_VALID), hp)
    )
    want = np.zeros_like(ROUND_REWARD)
    for first in (0, 3):
        rows = slice(first, first + 3)
        returns = (ROUND_REWARD[rows] * ROUND_VALID[rows]).sum(0)[None]  # [1, 4]
        ones = np.ones_like(returns)
        if advantage == "rloo":
            per_episode = numpy_rloo(returns, ones)
        else:
            per_episode = numpy_group_advantages(returns, ones, scale=advantage == "group")
        want[rows] = per_episode * ROUND_VALID[rows]
    np.testing.assert_allclose(got, want, atol=1e-5)
    # By hand, round 0's returns: 0.5, 1, 1, 0.2; env 0's two messages share its advantage.
    assert got[0, 0] == got[1, 0] != 0 and got[2, 0] == 0
    # One message a round reduces to the single-turn advantage of each row.
    single = dataclasses.replace(hp, round_length=1)
    np.testing.assert_allclose(
        episode_group_advantages(jnp.asarray(REWARD), jnp.asarray(VALID), single),
        numpy_rloo(REWARD, VALID)
        if advantage == "rloo"
        else numpy_group_advantages(REWARD, VALID, scale=advantage == "group"),
        atol=1e-5,
    )


def test_alike_groups_are_exactly_the_zero_variance_ones():
    got = np.asarray(alike_groups(jnp.asarray(REWARD), jnp.asarray(VALID), G))
    # Row 0: [1 0 0 1] differs, [1 1 1 1] alike. Row 1: valid [0.5 0 . 1] differs; valid
    # [0 0 0 .] alike (the invalid 3.0 does not count).
    want = np.array([[0] * 4 + [1] * 4, [0] * 4 + [1] * 4], bool)
    np.testing.assert_array_equal(got, want)
    none_valid = alike_groups(jnp.asarray(REWARD), jnp.zeros_like(jnp.asarray(VALID)), G)
    assert not np.any(none_valid)


def test_overlong_penalty_falls_linearly_over_the_buffer():
    lengths = jnp.array([0, 10, 12, 14, 16])
    got = overlong_penalty(lengths, response_length=16, buffer=4, penalty=0.5)
    np.testing.assert_allclose(got, [0.0, 0.0, 0.0, -0.25, -0.5])
    assert np.all(np.asarray(overlong_penalty(lengths, 16, 0, 0.5)) == 0)


# -- the loss of one minibatch ----------------------------------------------------------------

N, M = 6, 5
RNG = np.random.default_rng(0)
LENGTHS = np.array([5, 1, 3, 0, 2, 5])  # an answer of no tokens (a padding row) included
MASK = (np.arange(M)[None] < LENGTHS[:, None]).astype(np.float32)
BEHAVIOUR = RNG.normal(-1.5, 0.3, (N, M)).astype(np.float32) * MASK
REFERENCE = RNG.normal(-1.5, 0.3, (N, M)).astype(np.float32) * MASK
ADVANTAGE = (np.repeat(RNG.normal(size=(N, 1)), M, 1) * MASK).astype(np.float32)
ENTROPY = RNG.uniform(0.5, 2.0, (N, M)).astype(np.float32)
# The current policy: moved from the behaviour policy by up to +-0.5 per token, so that both
# clips and the sequence ratio bite.
CURRENT = (BEHAVIOUR + RNG.uniform(-0.5, 0.5, (N, M)) * MASK).astype(np.float32)


def numpy_aggregate(x, mask, how):
    if how == "token":
        return (x * mask).sum() / max(mask.sum(), 1)
    if how == "constant":
        return (x * mask).sum() / x.size
    lengths = mask.sum(-1)
    answered = lengths > 0
    return ((x * mask).sum(-1)[answered] / lengths[answered]).mean()


def numpy_sequence_mean(log_ratio) -> np.ndarray:
    per_answer = log_ratio.sum(-1) / np.maximum(MASK.sum(-1), 1)
    return per_answer[:, None] * MASK


def numpy_loss(how, ratio_level, low, high, kl_estimator, kl_coef, ent_coef, weight=1.0) -> float:
    log_ratio = (CURRENT - BEHAVIOUR) * MASK
    if ratio_level == "sequence":
        log_ratio = numpy_sequence_mean(log_ratio)
    ratio = np.exp(log_ratio)
    surrogate = -np.minimum(ratio * ADVANTAGE, np.clip(ratio, 1 - low, 1 + high) * ADVANTAGE)
    surrogate = surrogate * weight
    total = numpy_aggregate(surrogate, MASK, how) - ent_coef * numpy_aggregate(ENTROPY, MASK, how)
    diff = REFERENCE - CURRENT
    kl = np.expm1(diff) - diff if kl_estimator == "k3" else CURRENT - REFERENCE
    return float(total + kl_coef * numpy_aggregate(kl, MASK, how))


def hyperparams(**settings) -> TokenPPOHyperparams:
    """Token-level PPO's settings for one epoch of one minibatch with GRPO's group advantage
    and the KL as a loss term (off until `kl_coef` is set); `settings` override them."""
    base = dict(
        num_epochs=1,
        num_minibatches=1,
        gamma=1.0,
        gae_lambda=1.0,
        clip_eps=0.2,
        value_clip_eps=None,
        vf_coef=0.5,
        ent_coef=0.0,
        normalize_advantages=False,
        kl_coef=0.0,
        kl_penalty="loss",
        advantage="group",
        group_size=2,
    )
    return TokenPPOHyperparams(**(base | settings))


def _score(params, obs, action):
    """A policy whose log-probs are its parameters (`[N, M]`): the loss as a function of them."""
    return params["log_prob"], jnp.zeros((N, M)), jnp.asarray(ENTROPY), jnp.asarray(MASK)


MINIBATCH = {
    "obs": jnp.zeros((N, 3), jnp.int32),
    "action": jnp.zeros((N, M), jnp.int32),
    "log_prob": jnp.asarray(BEHAVIOUR),
    "value": jnp.zeros((N, M)),
    "ref_log_prob": jnp.asarray(REFERENCE),
    "advantage": jnp.asarray(ADVANTAGE),
    "return": jnp.zeros((N, M)),
    "mask": jnp.asarray(MASK),
}


@pytest.mark.parametrize("how", ["token", "sequence", "constant"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize(
    ("high", "kl_estimator", "kl_coef", "ent_coef"),
    [(None, "k3", 0.0, 0.0), (0.28, "k3", 0.1, 0.0), (0.28, "k1", 0.1, 0.01)],
    ids=["symmetric", "clip_higher_k3", "clip_higher_k1_entropy"],
)
def test_every_loss_variant_matches_numpy(how, ratio_level, high, kl_estimator, kl_coef, ent_coef):
    hp = hyperparams(
        loss_aggregation=how,
        importance_ratio=ratio_level,
        clip_eps_high=high,
        kl_estimator=kl_estimator,
        kl_coef=kl_coef,
        ent_coef=ent_coef,
    )
    loss_fn = jax.jit(make_token_ppo_loss(_score, hp))
    total, metrics = loss_fn({"log_prob": jnp.asarray(CURRENT)}, MINIBATCH, jnp.float32(0.2))
    want = numpy_loss(how, ratio_level, 0.2, high or 0.2, kl_estimator, kl_coef, ent_coef)
    assert float(total) == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert 0.0 < float(metrics["clip_fraction"]) < 1.0


# A stale sampler: the policy at the update's start (PROXIMAL, in place of BEHAVIOUR in the
# ratio) moved away from the one that generated, by up to 1 nat per token (weights e^-1..e).
PROXIMAL = BEHAVIOUR
SAMPLER = (BEHAVIOUR + RNG.uniform(-1.0, 1.0, (N, M)) * MASK).astype(np.float32)


def numpy_importance_weight(level: str, cap: float) -> np.ndarray:
    log_weight = (PROXIMAL - SAMPLER) * MASK
    if level == "sequence":
        log_weight = numpy_sequence_mean(log_weight)
    return np.minimum(np.exp(log_weight), cap) * MASK


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_truncated_importance_weight_against_numpy(level):
    weight, metrics = truncated_importance_weight(
        jnp.asarray(PROXIMAL), jnp.asarray(SAMPLER), jnp.asarray(MASK), 1.1, level
    )
    np.testing.assert_allclose(weight, numpy_importance_weight(level, 1.1), rtol=1e-6)
    untruncated = numpy_importance_weight(level, np.inf)[MASK > 0]
    assert float(metrics["importance_weight_mean"]) == pytest.approx(untruncated.mean(), 1e-5)
    assert float(metrics["importance_weight_std"]) == pytest.approx(untruncated.std(), 1e-4)
    assert float(metrics["importance_weight_min"]) == pytest.approx(untruncated.min(), 1e-6)
    assert float(metrics["importance_weight_max"]) == pytest.approx(untruncated.max(), 1e-6)
    clipped = float(metrics["importance_weight_clipped"])
    assert clipped == pytest.approx(np.mean(untruncated > 1.1))
    assert 0.0 < clipped < 1.0


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_the_truncated_weight_scales_each_tokens_surrogate(ratio_level):
    hp = hyperparams(importance_ratio=ratio_level, importance_weight_cap=1.5, clip_eps_high=0.28)
    weight = numpy_importance_weight(ratio_level, 1.5)
    minibatch = MINIBATCH | {"importance_weight": jnp.asarray(weight)}
    total, _ = jax.jit(make_token_ppo_loss(_score, hp))(
        {"log_prob": jnp.asarray(CURRENT)}, minibatch, jnp.float32(0.2)
    )
    want = numpy_loss("token", ratio_level, 0.2, 0.28, "k3", 0.0, 0.0, weight)
    assert float(total) == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert want != pytest.approx(numpy_loss("token", ratio_level, 0.2, 0.28, "k3", 0.0, 0.0))


def test_aggregations_weigh_answers_as_their_papers_say():
    """A long and a short answer with per-token losses 1 and 3: the token mean weighs tokens
    (DAPO), the sequence mean answers (GRPO), the constant normaliser neither."""
    per_token = jnp.array([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(aggregate(per_token, mask, "token")) == pytest.approx(7 / 5)
    assert float(aggregate(per_token, mask, "sequence")) == pytest.approx(2.0)
    assert float(aggregate(per_token, mask, "constant")) == pytest.approx(7 / 8)


def test_sequence_ratio_and_clip_higher_by_hand():
    log_ratio = jnp.array([[0.3, -0.1, 0.1, 9.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    np.testing.assert_allclose(sequence_log_ratio(log_ratio, mask), [[0.1, 0.1, 0.1, 0.0]])
    # Ratios 0.7, 1.1 and 1.3 with advantage 1: clipped to [0.8, 1.28] from above only (the
    # min keeps 0.7), so the loss is -(0.7, 1.1, 1.28) and only 1.3 counts as clipped.
    loss, clipped = clipped_surrogate(jnp.log(jnp.array([0.7, 1.1, 1.3])), 1.0, 0.2, 0.28)
    np.testing.assert_allclose(loss, [-0.7, -1.1, -1.28], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [1.0, 0.0, 1.0])


# -- dynamic sampling in the update -----------------------------------------------------------


def _rollout_score(params, obs, action):
    """log pi(token) = -softplus(w * token / 10): a one-parameter policy over any rows."""
    mask = (action != 0).astype(jnp.float32)
    log_probs = -jax.nn.softplus(params["w"] * action.astype(jnp.float32) / 10.0) * mask
    n, m = action.shape
    return log_probs, jnp.zeros((n, m)), jnp.zeros((n, m)), mask


def _update_of(**settings):
    hp = hyperparams(group_size=G, advantage="rloo", **settings)
    optimizer = optax.sgd(0.1)
    return jax.jit(make_token_ppo_update(_rollout_score, optimizer, hp)), optimizer


def _rollout(valid: np.ndarray) -> dict:
    t, b = REWARD.shape
    action = (np.arange(t * b * 3).reshape(t, b, 3) % 7 + 1).astype(np.int32)
    action[0, 1, 2] = action[1, 5, 1:] = 0  # shorter answers
    params = {"w": jnp.float32(0.5)}
    log_prob, _, _, _ = _rollout_score(params, jnp.zeros((t * b, 2)), action.reshape(t * b, 3))
    return {
        "obs": np.ones((t, b, 2), np.int32),
        "action": action,
        "log_prob": np.asarray(log_prob).reshape(t, b, 3),
        "value": np.zeros((t, b, 3), np.float32),
        "reward": REWARD,
        "terminated": np.ones((t, b), bool),
        "truncated": np.zeros((t, b), bool),
        "valid": valid.astype(np.uint8),
        "bootstrap_value": np.zeros((t, b), np.float32),
        "last_value": np.zeros((b,), np.float32),
    }


def _state(optimizer) -> TokenTrainState:
    params = {"w": jnp.float32(0.5)}
    return TokenTrainState(
        params=params,
        ref_params=params,
        opt_state=optimizer.init(params),
        update_count=jnp.zeros((), jnp.int32),
        key=jax.random.key(0),
    )


def test_dynamic_sampling_leaves_out_exactly_the_alike_groups():
    update, optimizer = _update_of(dynamic_sampling=True, loss_aggregation="token")
    plain, _ = _update_of(loss_aggregation="token")
    state, metrics = update(_state(optimizer), _rollout(VALID))
    assert float(metrics["groups_dropped"]) == 2
    # As if the alike groups had never been sent: the same step...
    by_hand = VALID * ~np.asarray(alike_groups(jnp.asarray(REWARD), jnp.asarray(VALID), G))
    want, want_metrics = plain(_state(optimizer), _rollout(by_hand))
    assert float(state.params["w"]) == pytest.approx(float(want.params["w"]), rel=1e-6)
    assert float(state.params["w"]) != pytest.approx(0.5)
    # ...while their rows and tokens still count as trained on, for the run's accounting.
    assert int(metrics["trained_rows"]) == int(VALID.sum())
    assert int(metrics["trained_tokens"]) > int(want_metrics["trained_tokens"])


def test_a_step_without_a_move_counts_its_reward_and_trains_none_of_its_tokens():
    """A self-play seat whose game ended on the other seat's move has a valid step of 0
    response tokens: its reward is in its group's returns, its tokens get no gradient."""
    update, optimizer = _update_of(loss_aggregation="token")
    rollout = _rollout(VALID)
    rollout["response_tokens"] = np.full(REWARD.shape, 3, np.int32)
    rollout["response_tokens"][0, 3] = 0
    state, _ = update(_state(optimizer), rollout)
    # Whatever that step's tokens are, the update is the same...
    other = dict(rollout, action=rollout["action"].copy())
    other["action"][0, 3] = [6, 6, 6]
    same, _ = update(_state(optimizer), other)
    assert float(state.params["w"]) == pytest.approx(float(same.params["w"]), rel=1e-6)
    # ...and its reward still counts for the others of its group (their advantages move).
    zero_reward = dict(rollout, reward=REWARD.copy())
    zero_reward["reward"][0, 3] = 0.0
    changed, _ = update(_state(optimizer), zero_reward)
    assert float(changed.params["w"]) != pytest.approx(float(state.params["w"]), rel=1e-6)
    # Without the count, the step's tokens are trained.
    trained, _ = update(
        _state(optimizer), {k: v for k, v in other.items() if k != "response_tokens"}
    )
    assert float(trained.params["w"]) != pytest.approx(float(same.params["w"]), rel=1e-6)


def test_a_completion_cut_short_trains_only_the_tokens_handed_back():
    """An agent's request cut a completion at its max_tokens or stop string: the env reports
    the ids it handed back (`response_tokens`), and the tokens sampled past them get no
    gradient, whatever they are."""
    update, optimizer = _update_of(loss_aggregation="token")
    rollout = _rollout(VALID)
    rollout["response_tokens"] = np.full(REWARD.shape, 3, np.int32)
    rollout["response_tokens"][1, 3] = 1
    state, metrics = update(_state(optimizer), rollout)
    other = dict(rollout, action=rollout["action"].copy())
    other["action"][1, 3, 1:] = [6, 6]
    same, _ = update(_state(optimizer), other)
    assert float(state.params["w"]) == pytest.approx(float(same.params["w"]), rel=1e-6)
    whole = dict(other, response_tokens=np.full(REWARD.shape, 3, np.int32))
    trained, whole_metrics = update(_state(optimizer), whole)
    assert float(trained.params["w"]) != pytest.approx(float(same.params["w"]), rel=1e-6)
    assert int(whole_metrics["trained_tokens"]) - int(metrics["trained_tokens"]) == 2


# The groups of `_rollout(VALID)`, (t, group) in order: 1 0 0 1 | 1 1 1 1 | .5 0 _ 1 | 0 0 0 _.
INFORMATIVE = np.array([[True, False], [True, False]])


def test_the_learner_judges_groups_by_the_updates_own_criterion():
    hp = hyperparams(group_size=G, dynamic_sampling=True)
    rollout = _rollout(VALID)
    np.testing.assert_array_equal(informative_mask(rollout, 0, hp), INFORMATIVE)
    # Alike rewards, answers of 1, 2 and 3 tokens (EOS 0 included): with overlong shaping
    # (the last 2 of 3 tokens penalised) their shaped rewards differ, and the group teaches.
    alike = rollout | {"reward": np.ones_like(REWARD)}
    alike["action"] = np.zeros_like(rollout["action"])
    alike["action"][0, :G] = [[0, 0, 0], [5, 0, 0], [5, 5, 0], [5, 5, 5]]
    assert not informative_mask(alike, 0, hp).any()
    shaped = hyperparams(group_size=G, dynamic_sampling=True, overlong_buffer=2)
    want = np.array([[True, False], [False, False]])
    np.testing.assert_array_equal(informative_mask(alike, 0, shaped), want)
    # A group with no valid answer teaches nothing either.
    empty = rollout | {"valid": np.zeros_like(VALID)}
    assert not informative_mask(empty, 0, hp).any()


def test_refill_puts_later_rounds_informative_groups_in_place_of_alike_ones():
    hp = hyperparams(group_size=G, dynamic_sampling=True)
    first = _rollout(VALID)
    second = _rollout(VALID[::-1].copy()) | {
        "reward": REWARD[::-1].copy(),
        "obs": np.full((2, 8, 2), 2),
        "last_value": np.full(8, 2.0, np.float32),
    }
    # The second round's groups: .5 0 _ 1 | 0 0 0 _ | 1 0 0 1 | 1 1 1 1.
    informative = [informative_mask(r, 0, hp) for r in (first, second)]
    np.testing.assert_array_equal(informative[1], INFORMATIVE)
    rollout, left = refilled_rollout(
        [first, second], informative, G, per_env_fields=("last_value",)
    )
    # Slots in order: round 1's two informative groups, then round 2's.
    groups = lambda x: x.reshape(4, G, *x.shape[2:])  # noqa: E731
    for name in ("reward", "valid", "action", "log_prob"):
        want = np.concatenate([groups(first[name])[[0, 2]], groups(second[name])[[0, 2]]])
        np.testing.assert_array_equal(groups(rollout[name]), want, err_msg=name)
    np.testing.assert_array_equal(groups(rollout["obs"])[:, 0, 0], [1, 1, 2, 2])
    np.testing.assert_array_equal(rollout["last_value"], second["last_value"])
    assert {name: v.shape for name, v in rollout.items()} == {
        name: v.shape for name, v in first.items()
    }
    # Left out: the alike groups of both rounds.
    want_left = np.repeat(~INFORMATIVE, G, axis=1)
    np.testing.assert_array_equal(left[0], want_left)
    np.testing.assert_array_equal(left[1], want_left)
    # The update finds nothing to drop, and trains on every row it was given.
    update, optimizer = _update_of(dynamic_sampling=True, loss_aggregation="token")
    _, metrics = update(_state(optimizer), rollout)
    assert float(metrics["groups_dropped"]) == 0
    assert int(metrics["trained_rows"]) == int(rollout["valid"].sum())


def test_refill_short_of_informative_groups_fills_up_with_alike_ones_the_update_drops():
    first = _rollout(VALID)
    second = first | {"obs": np.full((2, 8, 2), 2)}
    none = np.zeros((2, 2), bool)
    rollout, left = refilled_rollout(
        [first, second], [INFORMATIVE, none], G, per_env_fields=("last_value",)
    )
    groups = lambda x: x.reshape(4, G, *x.shape[2:])  # noqa: E731
    # Round 1's informative groups, then its alike ones: round 2 is left out whole.
    np.testing.assert_array_equal(groups(rollout["reward"]), groups(first["reward"])[[0, 2, 1, 3]])
    np.testing.assert_array_equal(groups(rollout["obs"])[:, 0, 0], [1, 1, 1, 1])
    assert not left[0].any() and left[1].all()
    update, optimizer = _update_of(dynamic_sampling=True, loss_aggregation="token")
    _, metrics = update(_state(optimizer), rollout)
    assert float(metrics["groups_dropped"]) == 2


# -- asynchronous samples in the update -------------------------------------------------------


def _sampled_by(w: float) -> dict:
    """`_rollout(VALID)` as generated by the policy of parameter `w`."""
    rollout = _rollout(VALID)
    t, b, m = rollout["action"].shape
    log_prob, _, _, _ = _rollout_score(
        {"w": jnp.float32(w)}, None, rollout["action"].reshape(-1, m)
    )
    return rollout | {"log_prob": np.asarray(log_prob).reshape(t, b, m)}


def test_stale_samples_are_weighted_by_the_truncated_ratio_to_the_start_policy():
    cap = 1.05
    update, optimizer = _update_of(loss_aggregation="token", importance_weight_cap=cap)
    stale = _sampled_by(1.0)  # the learner's policy (w = 0.5) has moved on since
    _, metrics = update(_state(optimizer), stale)
    t, b, m = stale["action"].shape
    start, _, _, mask = _rollout_score(
        _state(optimizer).params, None, stale["action"].reshape(-1, m)
    )
    mask = np.asarray(mask).reshape(t, b, m) * VALID[:, :, None]
    weight = np.exp(np.asarray(start).reshape(t, b, m) - stale["log_prob"])
    assert float(metrics["importance_weight_mean"]) == pytest.approx(weight[mask > 0].mean(), 1e-5)
    assert float(metrics["importance_weight_max"]) == pytest.approx(weight[mask > 0].max(), 1e-5)
    clipped = np.mean(weight[mask > 0] > cap)
    assert float(metrics["importance_weight_clipped"]) == pytest.approx(clipped)
    assert 0.0 < clipped < 1.0
    # One minibatch, one epoch: the loss is taken at the start policy, where the ratio is 1,
    # so it is minus the mean over tokens of the truncated weight times the advantage.
    advantage = numpy_rloo(REWARD, VALID)[:, :, None] * mask
    want = -(np.minimum(weight, cap) * advantage).sum() / mask.sum()
    assert float(metrics["loss/policy"]) == pytest.approx(want, rel=1e-5)


def test_the_correction_changes_nothing_on_fresh_samples():
    corrected, optimizer = _update_of(loss_aggregation="token", importance_weight_cap=1.05)
    plain, _ = _update_of(loss_aggregation="token")
    fresh = _sampled_by(0.5)  # the learner's own policy generated them
    state, metrics = corrected(_state(optimizer), fresh)
    want, _ = plain(_state(optimizer), fresh)
    assert float(state.params["w"]) == pytest.approx(float(want.params["w"]), rel=1e-6)
    assert float(metrics["importance_weight_max"]) == pytest.approx(1.0)
    assert float(metrics["importance_weight_clipped"]) == 0.0
    # ...and stale ones move the policy differently.
    stale_state, _ = corrected(_state(optimizer), _sampled_by(1.0))
    assert float(stale_state.params["w"]) != pytest.approx(float(want.params["w"]), abs=1e-6)
