"""Token-level PPO: token GAE against a numpy reference, group advantages, the k3 KL, and the
language-model update built as the learner builds it (`language_model_training`)."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.algorithms.token_ppo import (
    group_advantages,
    kl_k3,
    last_token_mask,
    token_gae,
)
from agentenv_jax.config.schema import (
    EnvConfig,
    ExperimentConfig,
    LanguageModelConfig,
    NetworkConfig,
    PPOConfig,
)
from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.learner.on_policy_model import OnPolicyModel
from agentenv_jax.learner.text_training import language_model_training
from agentenv_jax.networks.language_model import LanguageModel
from agentenv_jax.networks.text_models import language_model_for

VOCAB, CONTEXT, RESPONSE, PAD, BOS, EOS = 260, 8, 3, 256, 257, 258
TEXT = TextSpec(
    vocab_size=VOCAB,
    context_length=CONTEXT,
    response_length=RESPONSE,
    pad_id=PAD,
    bos_id=BOS,
    eos_id=EOS,
)
T_LEN, BATCH = 2, 4  # messages per env and envs of the update tests' rollout
# Rewarded answers `[T, B]`: one of each consecutive pair of envs, so groups of 2 differ.
REWARD = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]], np.float32)

token_gae_jit = jax.jit(token_gae, static_argnums=(7, 8))
_score_jit = jax.jit(lambda lm, *args: lm.score(*args, PAD, EOS), static_argnums=0)


# -- token GAE -------------------------------------------------------------------------------


def numpy_token_gae(
    rewards, values, mask, terminated, truncated, bootstrap, last_value, gamma, lam
):
    """GAE one env at a time over its generated tokens in order (message t's, then t + 1's),
    written independently of the JAX version: masked tokens are not in the sequence, and an
    episode ends at the last token of the message it ended with."""
    t_len, batch, m = values.shape
    advantages = np.zeros_like(values)
    for b in range(batch):
        tokens = [(t, i) for t in range(t_len) for i in range(m) if mask[t, b, i] > 0]
        next_value, running = float(last_value[b]), 0.0
        for t, i in reversed(tokens):
            ends_message = i + 1 == m or mask[t, b, i + 1] == 0
            if ends_message and terminated[t, b]:
                next_value, running = 0.0, 0.0
            elif ends_message and truncated[t, b]:
                next_value, running = float(bootstrap[t, b]), 0.0
            delta = rewards[t, b, i] + gamma * next_value - values[t, b, i]
            running = delta + gamma * lam * running
            advantages[t, b, i] = running
            next_value = float(values[t, b, i])
    return advantages, (advantages + values) * mask


def random_token_case(seed: int, t_len: int = 7, batch: int = 5, m: int = 4) -> dict:
    """Responses of 1..m tokens (prefix masks), invalid rows (all-zero masks), terminations and
    truncations (sometimes both) anywhere; rewards and values everywhere, masked or not."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, m + 1, (t_len, batch))
    valid = rng.random((t_len, batch)) > 0.2
    mask = ((np.arange(m) < lengths[..., None]) & valid[..., None]).astype(np.float32)
    # Ends on valid rows only, as the actor writes padding rows (an end on a faulted row is
    # `test_token_gae_cuts_at_an_end_on_a_padding_row`).
    terminated = (rng.random((t_len, batch)) < 0.2) & valid
    truncated = (rng.random((t_len, batch)) < 0.2) & valid
    case = {
        "token_rewards": rng.normal(size=(t_len, batch, m)).astype(np.float32),
        "values": rng.normal(size=(t_len, batch, m)).astype(np.float32),
        "mask": mask,
        "terminated": terminated,
        "truncated": truncated,
        "bootstrap_value": rng.normal(size=(t_len, batch)).astype(np.float32),
        "last_value": rng.normal(size=batch).astype(np.float32),
    }
    # The case covers what it is meant to: ends in the middle of the segment, padding rows.
    inner = valid[1:-1]
    assert (terminated[1:-1] & inner).any() and (truncated[1:-1] & ~terminated[1:-1] & inner).any()
    assert (~valid).any() and (lengths < m).any()
    return case


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_token_gae_matches_numpy_reference(seed):
    case = random_token_case(seed)
    gamma, lam = 0.97, 0.8
    advantages, returns = token_gae_jit(*case.values(), gamma, lam)
    ref_adv, ref_ret = numpy_token_gae(*case.values(), gamma, lam)
    np.testing.assert_allclose(advantages, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, ref_ret, rtol=1e-5, atol=1e-5)
    masked = case["mask"] == 0
    assert np.all(np.asarray(advantages)[masked] == 0) and np.all(np.asarray(returns)[masked] == 0)


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        # Tokens in order: v = 0.5, 1.0 (reward 1), 2.0 (reward 2), then last_value 4:
        # delta_2 = 2 + 0.9 * 4 - 2 = 3.6, A_2 = 3.6; delta_1 = 1 + 0.9 * 2 - 1 = 1.8,
        # A_1 = 1.8 + 0.45 * 3.6 = 3.42; delta_0 = 0.9 * 1 - 0.5 = 0.4, A_0 = 0.4 + 0.45 * 3.42.
        ("none", [0.4 + 0.45 * 3.42, 3.42, 3.6]),
        # Message 0 ends the episode: A_1 = 1 + 0 - 1 = 0, A_0 = 0.4 + 0.45 * 0.
        ("terminated", [0.4, 0.0, 3.6]),
        # Truncated with V(final obs) = 3: A_1 = 1 + 0.9 * 3 - 1 = 2.7, A_0 = 0.4 + 0.45 * 2.7.
        ("truncated", [0.4 + 0.45 * 2.7, 2.7, 3.6]),
    ],
)
def test_token_gae_hand_computed(end, expected):
    # T=2 messages, B=1, M=2: message 0 has two tokens, message 1 one (its second is masked,
    # with a value of 7 that must not be read). gamma 0.9, lambda 0.5.
    rewards = np.array([[[0.0, 1.0]], [[2.0, 5.0]]], np.float32)
    values = np.array([[[0.5, 1.0]], [[2.0, 7.0]]], np.float32)
    mask = np.array([[[1.0, 1.0]], [[1.0, 0.0]]], np.float32)
    terminated = np.array([[end == "terminated"], [False]])
    truncated = np.array([[end == "truncated"], [False]])
    bootstrap = np.array([[3.0], [0.0]], np.float32)
    advantages, returns = token_gae(
        rewards, values, mask, terminated, truncated, bootstrap, np.array([4.0]), 0.9, 0.5
    )
    got = np.asarray(advantages)[:, 0].ravel()
    np.testing.assert_allclose(got[[0, 1, 2]], expected, rtol=1e-6, atol=1e-6)
    assert got[3] == 0.0
    np.testing.assert_allclose(
        np.asarray(returns)[:, 0].ravel(),
        [expected[0] + 0.5, expected[1] + 1.0, 5.6, 0.0],
        rtol=1e-6,
    )


@pytest.mark.parametrize("end", ["terminated", "truncated"])
def test_token_gae_cuts_at_an_end_on_a_padding_row(end):
    # One token per message; message 1 is padding that ended the episode, as a faulted step
    # is (`envs.faults` reports truncated, the actor marks the row invalid). Message 0's
    # advantage must not depend on message 2, the next episode's first. PPO's GAE over the
    # same rows gives it 1 + 0 - 0 = 1 with termination (gamma = lambda = 1); skipping the
    # padding row together with its end would give 1 + 10 + (5 - 10) = 6.
    def advantage_of_message_0(next_episode_reward: float) -> float:
        ends = np.array([[False], [True], [False]])
        no_ends = np.zeros((3, 1), bool)
        advantages, _ = token_gae(
            np.array([1.0, 0.0, next_episode_reward], np.float32).reshape(3, 1, 1),
            np.array([0.0, 0.0, 10.0], np.float32).reshape(3, 1, 1),
            np.array([1.0, 0.0, 1.0], np.float32).reshape(3, 1, 1),
            ends if end == "terminated" else no_ends,
            ends if end == "truncated" else no_ends,
            np.zeros((3, 1), np.float32),
            np.zeros(1, np.float32),
            1.0,
            1.0,
        )
        return float(advantages[0, 0, 0])

    assert advantage_of_message_0(5.0) == advantage_of_message_0(-50.0)
    if end == "terminated":
        assert advantage_of_message_0(5.0) == pytest.approx(1.0)


def test_last_token_mask():
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]], jnp.float32)
    expected = [[0, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]]
    np.testing.assert_array_equal(last_token_mask(mask), expected)
    # Leading axes are batch axes: [T, B, M].
    np.testing.assert_array_equal(
        last_token_mask(mask.reshape(2, 2, 3)), np.reshape(expected, (2, 2, 3))
    )


# -- group advantages and the KL estimator -----------------------------------------------------


def test_group_advantages_hand_computed():
    # Groups of 3 envs, two messages. Row 0: [1, 0, 0] has mean 1/3 and std sqrt(2) / 3, so
    # (2/3) / (sqrt(2)/3) = sqrt(2) and -(1/3) / (sqrt(2)/3) = -1/sqrt(2); [2, 2, 2] scored
    # alike -> 0. Row 1: [1, 0, 5] with the 5 invalid -> statistics of [1, 0] (mean 0.5,
    # std 0.5) -> [1, -1, 0]; [3, -1, 4] with only the 3 valid -> std 0 -> 0.
    reward = np.array([[1.0, 0.0, 0.0, 2.0, 2.0, 2.0], [1.0, 0.0, 5.0, 3.0, -1.0, 4.0]], np.float32)
    valid = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 0]], np.uint8)
    got = np.asarray(jax.jit(group_advantages, static_argnums=2)(reward, valid, 3))
    s = math.sqrt(2.0)
    expected = [[s, -1 / s, -1 / s, 0.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0, 0.0, 0.0]]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_group_advantages_invalid_rows_do_not_enter_the_statistics():
    rng = np.random.default_rng(4)
    reward = rng.normal(size=(3, 8)).astype(np.float32)
    valid = np.ones((3, 8), bool)
    valid[:, [1, 6]] = False
    base = np.asarray(group_advantages(reward, valid, 4))
    changed = reward.copy()
    changed[:, [1, 6]] = 1e3  # whatever an invalid row holds changes nothing
    np.testing.assert_allclose(group_advantages(changed, valid, 4), base, rtol=1e-6, atol=1e-6)
    assert np.all(base[:, [1, 6]] == 0)
    # The valid answers of a group are standardized: mean 0, std 1.
    for group in (slice(0, 4), slice(4, 8)):
        kept = base[:, group][valid[:, group]].reshape(3, 3)
        np.testing.assert_allclose(kept.mean(-1), 0.0, atol=1e-5)
        np.testing.assert_allclose(kept.std(-1), 1.0, atol=1e-4)


def test_kl_k3_is_non_negative_and_zero_for_equal_log_probs():
    rng = np.random.default_rng(5)
    log_prob = -rng.exponential(size=1000).astype(np.float32)
    ref = -rng.exponential(size=1000).astype(np.float32)
    assert np.all(np.asarray(kl_k3(log_prob, ref)) >= 0)
    np.testing.assert_array_equal(kl_k3(log_prob, log_prob), 0.0)
    # ref - logp = log 2: 2 - log 2 - 1.
    got = float(kl_k3(jnp.log(0.25), jnp.log(0.5)))
    assert got == pytest.approx(1.0 - math.log(2.0), rel=1e-6)


# -- the update ------------------------------------------------------------------------------


def text_config(learning_rate: float = 1e-3, **algorithm) -> ExperimentConfig:
    """A text-env experiment with the tiny transformer (d_model 64) and a short PPO update."""
    ppo = dataclasses.replace(
        PPOConfig(),
        rollout_length=T_LEN,
        num_epochs=4,
        num_minibatches=2,
        learning_rate=learning_rate,
        lr_schedule="constant",
        **algorithm,
    )
    return ExperimentConfig(
        env=EnvConfig(id="agentenv_jax/Arithmetic-v0", global_num_envs=BATCH),
        network=NetworkConfig(language_model=LanguageModelConfig(size="tiny")),
        algorithm=ppo,
    )


def score_rows(lm: LanguageModel, params, rollout: dict) -> tuple[np.ndarray, ...]:
    """`lm.score` of every message of a rollout: `(log_probs, values, mask)`, each `[T, B, M]`."""
    t_len, batch = rollout["reward"].shape
    scores = _score_jit(
        lm,
        params,
        rollout["obs"].reshape(t_len * batch, -1),
        rollout["action"].reshape(t_len * batch, -1),
    )
    shape = (t_len, batch, -1)
    return tuple(
        np.asarray(x).reshape(shape) for x in (scores.log_probs, scores.values, scores.mask)
    )


def make_text_rollout(lm: LanguageModel, params, seed: int, reward=REWARD) -> dict:
    """A well-formed `[T, B]` rollout of single-turn answers: contexts left-padded with a BOS
    prompt, responses ending at EOS (or filling all M tokens) with PAD after it, and the
    behaviour log-probs and values `lm.score` gives `params` (so the first epoch's ratio is 1)."""
    rng = np.random.default_rng(seed)
    t_len, batch = reward.shape
    obs = np.full((t_len, batch, CONTEXT), PAD, np.int32)
    action = np.full((t_len, batch, RESPONSE), PAD, np.int32)
    for t in range(t_len):
        for b in range(batch):
            prompt = rng.integers(0, CONTEXT)
            obs[t, b, CONTEXT - prompt - 1] = BOS
            obs[t, b, CONTEXT - prompt :] = rng.integers(0, 256, prompt)
            end = rng.integers(0, RESPONSE + 1)  # EOS at `end`, or none when it is RESPONSE
            action[t, b, : min(end + 1, RESPONSE)] = rng.integers(0, 256, min(end + 1, RESPONSE))
            if end < RESPONSE:
                action[t, b, end] = EOS
    rollout = {
        "obs": obs,
        "action": action,
        "reward": np.asarray(reward, np.float32),
        "terminated": np.ones((t_len, batch), np.uint8),
        "truncated": np.zeros((t_len, batch), np.uint8),
        "valid": np.ones((t_len, batch), np.uint8),
        "bootstrap_value": np.zeros((t_len, batch), np.float32),
        "last_value": rng.normal(scale=0.02, size=batch).astype(np.float32),
        "last_obs": obs[-1].copy(),
    }
    return rescored(lm, params, rollout)


def rescored(lm: LanguageModel, params, rollout: dict) -> dict:
    """The rollout with the behaviour log-probs and values of `params`."""
    log_prob, value, _ = score_rows(lm, params, rollout)
    return rollout | {"log_prob": log_prob, "value": value}


def answer_log_prob(lm: LanguageModel, params, rollout: dict, rows: np.ndarray) -> float:
    """The mean over the messages `rows` (`[T, B]` bool) of their responses' log-probability."""
    log_prob, _, _ = score_rows(lm, params, rollout)
    return float(log_prob.sum(-1)[rows].mean())


@functools.cache
def scoring_model(config: LanguageModelConfig) -> LanguageModel:
    """The transformer `language_model_training` builds for `config`, made once so that
    `score_rows` compiles once for every update config."""
    return language_model_for(config, TEXT)


@functools.cache
def built(**algorithm):
    """`(lm, jitted update, initial state)` of `text_config(**algorithm)`, as the learner builds
    them (rows unconstrained: one device)."""
    config = text_config(**algorithm)
    config.validate()
    parts = language_model_training(config, TEXT, total_updates=10, constrain_rows=lambda x: x)
    model = OnPolicyModel(*parts)
    lm = scoring_model(config.network.language_model)
    assert lm.spec.d_model == 64 and lm.spec.max_length == CONTEXT + RESPONSE
    params = model.init_params(jax.random.key(0))
    state = jax.jit(model.train_state)(params, jax.random.key(1))
    return lm, jax.jit(model.update), state


def _max_change(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)))


@pytest.mark.slow
def test_update_raises_the_log_prob_of_rewarded_answers():
    lm, update, state = built()
    rollout = make_text_rollout(lm, state.params, seed=0)
    rewarded = REWARD > 0
    before = answer_log_prob(lm, state.params, rollout, rewarded)
    unrewarded_before = answer_log_prob(lm, state.params, rollout, ~rewarded)
    new_state, metrics = update(state, rollout)
    assert int(new_state.update_count) == 1
    assert answer_log_prob(lm, new_state.params, rollout, rewarded) > before + 0.05
    assert answer_log_prob(lm, new_state.params, rollout, ~rewarded) < unrewarded_before
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert float(metrics["grad_norm"]) > 0 and "loss/value" in metrics
    assert {"value_error", "value_target_mean", "explained_variance"} <= set(metrics)
    assert "loss/kl" not in metrics  # kl_coef 0
    assert float(metrics["approx_kl"]) >= 0


@pytest.mark.slow
def test_kl_to_reference_is_zero_at_first_and_grows_with_training():
    lm, update, state = built()
    ref = jax.tree.map(np.array, state.ref_params)
    rollout = make_text_rollout(lm, state.params, seed=1)
    state, metrics = update(state, rollout)
    assert abs(float(metrics["kl_to_reference"])) < 1e-5  # behaviour == reference
    for _ in range(3):
        state, metrics = update(state, rescored(lm, state.params, rollout))
    # The next rollout's rewarded answers, as the trained policy would report them.
    rewarded = REWARD > 0
    later = rescored(lm, state.params, rollout) | {"valid": rewarded.astype(np.uint8)}
    _, metrics = update(state, later)
    log_prob, _, mask = score_rows(lm, state.params, later)
    ref_log_prob, _, _ = score_rows(lm, ref, later)
    mask = mask * rewarded[..., None]
    by_hand = ((log_prob - ref_log_prob) * mask).sum() / mask.sum()
    assert by_hand > 0.05
    assert float(metrics["kl_to_reference"]) == pytest.approx(by_hand, rel=1e-3, abs=1e-5)
    # ref_params never move.
    for got, want in zip(jax.tree.leaves(state.ref_params), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(got, want)
    assert _max_change(state.params, ref) > 0


@pytest.mark.slow
def test_trained_tokens_and_rows_count_the_valid_response_tokens():
    lm, update, state = built()
    rollout = make_text_rollout(lm, state.params, seed=2)
    rollout["valid"][0, 1] = rollout["valid"][1, 3] = 0
    _, metrics = update(state, rollout)
    tokens = 0
    for t in range(T_LEN):
        for b in range(BATCH):
            eos_at = np.flatnonzero(rollout["action"][t, b] == EOS)
            length = eos_at[0] + 1 if len(eos_at) else RESPONSE
            tokens += length * int(rollout["valid"][t, b])
    assert 0 < tokens < T_LEN * BATCH * RESPONSE
    assert int(metrics["trained_tokens"]) == tokens
    assert int(metrics["trained_rows"]) == T_LEN * BATCH - 2
    assert float(metrics["response_length_mean"]) == pytest.approx(tokens / (T_LEN * BATCH - 2))


@pytest.mark.slow
def test_grpo_group_advantage_and_kl_loss():
    """GRPO's setting: group-standardized rewards instead of a critic, the k3 KL to the
    reference as a loss term."""
    lm, update, state = built(advantage="group", group_size=2, kl_coef=0.1, kl_penalty="loss")
    rollout = make_text_rollout(lm, state.params, seed=3)
    rewarded = REWARD > 0
    before = answer_log_prob(lm, state.params, rollout, rewarded)
    new_state, metrics = update(state, rollout)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert answer_log_prob(lm, new_state.params, rollout, rewarded) > before + 0.05
    # No critic: no value loss or value statistics, and the value head gets no gradient.
    assert not {"loss/value", "value_error", "value_target_mean", "explained_variance"} & set(
        metrics
    )
    np.testing.assert_array_equal(
        new_state.params["value_head"]["kernel"], state.params["value_head"]["kernel"]
    )
    # The KL term: 0 at the reference, where every minibatch of the first epoch starts, and
    # positive once the policy has moved within the update.
    assert 0 < float(metrics["loss/kl"]) < 0.5
    for got, want in zip(
        jax.tree.leaves(new_state.ref_params), jax.tree.leaves(state.ref_params), strict=True
    ):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_bfloat16_parameters_train_with_float32_adam_moments():
    """`param_dtype: bfloat16` keeps the parameters and the frozen reference in bfloat16 (half
    the bytes) while Adam's moments stay float32, and an update still trains."""
    import optax

    config = text_config()
    language_model = dataclasses.replace(
        config.network.language_model, param_dtype="bfloat16", dtype="bfloat16"
    )
    config = dataclasses.replace(
        config, network=dataclasses.replace(config.network, language_model=language_model)
    )
    model = OnPolicyModel(*language_model_training(config, TEXT, 10, lambda x: x))
    assert {leaf.dtype for leaf in jax.tree.leaves(model.param_shapes)} == {jnp.dtype(jnp.bfloat16)}
    state = jax.jit(model.train_state)(model.init_params(jax.random.key(0)), jax.random.key(1))
    count = sum(leaf.size for leaf in jax.tree.leaves(state.params))
    for tree in (state.params, state.ref_params):
        assert {leaf.dtype for leaf in jax.tree.leaves(tree)} == {jnp.dtype(jnp.bfloat16)}
        assert sum(leaf.nbytes for leaf in jax.tree.leaves(tree)) == 2 * count
    adam = [
        s
        for s in jax.tree.leaves(
            state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
        )
        if isinstance(s, optax.ScaleByAdamState)
    ]
    assert len(adam) == 1
    moments = jax.tree.leaves((adam[0].mu, adam[0].nu))
    assert {leaf.dtype for leaf in moments} == {jnp.dtype(jnp.float32)}
    assert sum(leaf.size for leaf in moments) == 2 * count

    lm = language_model_for(language_model, TEXT)
    rollout = make_text_rollout(lm, state.params, seed=0)
    new_state, metrics = jax.jit(model.update)(jax.tree.map(jnp.copy, state), rollout)
    assert {leaf.dtype for leaf in jax.tree.leaves(new_state.params)} == {jnp.dtype(jnp.bfloat16)}
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert _max_change(new_state.params, state.params) > 0
    np.testing.assert_array_equal(
        np.asarray(jax.tree.leaves(new_state.ref_params)[0], np.float32),
        np.asarray(jax.tree.leaves(state.ref_params)[0], np.float32),
    )
