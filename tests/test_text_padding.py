"""Trimming text envs' token arrays of padding (`algorithm.length_bucket`): the lengths by
hand, generation from trimmed contexts equal to generation from whole ones, and the token-level
PPO update on trimmed messages equal to the update on the whole ones, for a from-scratch
transformer and a Llama-family (Qwen2-shaped) policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentenv_jax.actor.text_policy import TextPolicy
from agentenv_jax.algorithms.token_ppo import TokenTrainState, make_token_ppo_update
from agentenv_jax.config.schema import PPOConfig
from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.envs.text.padding import (
    context_length_needed,
    generation_utilisation,
    message_lengths,
    trim_text_rollout,
    trimmed_lengths,
    update_padding_fraction,
)
from agentenv_jax.learner.text_training import token_ppo_hyperparams
from agentenv_jax.networks.flat_params import FlatLayout
from agentenv_jax.networks.language_model import language_model_spec, make_language_model
from agentenv_jax.networks.llama import spec_from_config
from agentenv_jax.networks.llama_policy import LlamaPolicySpec, make_llama_policy

VOCAB, PAD, BOS, EOS = 40, 0, 1, 2
CONTEXT, RESPONSE = 12, 8
T, B = 2, 4  # 2 rounds of 4 envs: groups of 2 answers


def test_lengths_are_the_used_columns_rounded_up_to_the_bucket():
    obs = np.zeros((2, 3, 12), np.int32)
    obs[0, 1, 7:] = 5  # the longest context: 5 tokens
    obs[1, 2, 9:] = 5
    action = np.zeros((2, 3, 8), np.int32)
    action[1, 0, :3] = [4, 4, EOS]  # the longest answer: 3 tokens
    action[0, 2, :1] = EOS
    assert trimmed_lengths(obs, action, PAD, 4) == (8, 4)
    assert trimmed_lengths(obs, action, PAD, 1) == (5, 3)
    assert trimmed_lengths(obs, action, PAD, 5) == (5, 5)
    assert trimmed_lengths(obs, action, PAD, 2) == (6, 4)
    assert trimmed_lengths(obs, action, PAD, 16) == (12, 8)  # never beyond the configured
    empty = np.zeros_like(action)
    assert trimmed_lengths(np.zeros_like(obs), empty, PAD, 4) == (4, 4)  # at least a bucket


def test_padding_is_measured_in_what_generation_and_the_update_compute():
    """By hand: answers of 3, 1, 8 (no EOS) and 2 tokens, the last a padding step."""
    action = np.zeros((1, 4, 8), np.int32)
    action[0, 0, :3] = [4, 4, EOS]
    action[0, 1, 0] = EOS
    action[0, 2] = 4
    action[0, 3, :2] = [4, EOS]
    valid = np.array([[1, 1, 1, 0]])
    np.testing.assert_array_equal(message_lengths(action, EOS, PAD), [[3, 1, 8, 2]])
    # A row that generation stopped at its token limit (2) is padded after its last token.
    limited = np.array([4, 4, PAD, PAD, PAD, PAD, PAD, PAD], np.int32)
    assert message_lengths(limited, EOS, PAD) == 2
    # One generation of 4 answers decodes 8 steps (its longest): 32 tokens, 12 of them needed.
    assert generation_utilisation([(action, valid)], EOS, PAD) == (12, 32)
    # Two env ranks of two answers each: 2 x 3 + 2 x 8 steps computed.
    halves = [(action[:, :2], valid[:, :2]), (action[:, 2:], valid[:, 2:])]
    assert generation_utilisation(halves, EOS, PAD) == (12, 22)
    # Continuous batching over 2 slots: 3 | 1, then 8 in the slot that frees at 1 and 2 in the
    # one that frees at 3: 9 steps of 2 rows.
    assert generation_utilisation([(action, valid)], EOS, PAD, slots=2) == (12, 18)
    obs = np.zeros((1, 4, 6), np.int32)
    obs[0, :, 2:] = 5  # contexts of 4 tokens in 6
    # 4 rows x 14 columns computed; the valid rows need 3 x 4 context + 12 answer tokens.
    assert update_padding_fraction(obs, action, valid, PAD, EOS) == pytest.approx(1 - 24 / 56)


def test_trimming_cuts_context_on_the_left_and_answers_on_the_right():
    rollout = {
        "obs": np.arange(2 * 12).reshape(1, 2, 12),
        "last_obs": np.arange(12).reshape(1, 12),
        "action": np.arange(2 * 8).reshape(1, 2, 8),
        "log_prob": np.ones((1, 2, 8)),
        "value": np.ones((1, 2, 8)),
        "reward": np.ones((1, 2)),
    }
    trimmed = trim_text_rollout(rollout, (5, 3))
    np.testing.assert_array_equal(trimmed["obs"], rollout["obs"][..., 7:])
    np.testing.assert_array_equal(trimmed["last_obs"], rollout["last_obs"][..., 7:])
    for name in ("action", "log_prob", "value"):
        np.testing.assert_array_equal(trimmed[name], rollout[name][..., :3])
    assert trimmed["reward"] is rollout["reward"]


def _from_scratch():
    lm = make_language_model(language_model_spec("tiny", VOCAB, max_length=CONTEXT + RESPONSE))
    return lm, lm.init(jax.random.key(1))


def _qwen2():
    config = {
        "model_type": "qwen2",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 1000.0,
    }
    lm = make_llama_policy(LlamaPolicySpec(spec_from_config(config), max_length=CONTEXT + RESPONSE))
    return lm, lm.init(jax.random.key(1))


def _rollout(lm, params) -> dict:
    """Messages of 3 to 6 context tokens and answers of 1 to 3 ending with EOS (an answer
    without EOS fills all `RESPONSE` tokens, and then nothing is trimmed), scored by the policy
    itself (its behaviour log-probs and values)."""
    rng = np.random.default_rng(4)
    obs = np.full((T, B, CONTEXT), PAD, np.int32)
    action = np.full((T, B, RESPONSE), PAD, np.int32)
    for t in range(T):
        for b in range(B):
            n = rng.integers(3, 7)
            obs[t, b, CONTEXT - n] = BOS
            obs[t, b, CONTEXT - n + 1 :] = rng.integers(3, VOCAB, n - 1)
            m = rng.integers(1, 4)
            action[t, b, :m] = rng.integers(3, VOCAB, m)
            action[t, b, m - 1] = EOS
    scores = lm.score(params, obs.reshape(T * B, -1), action.reshape(T * B, -1), PAD, EOS)
    return {
        "obs": obs,
        "last_obs": obs[-1],
        "action": action,
        "log_prob": np.asarray(scores.log_probs).reshape(T, B, -1),
        "value": np.asarray(scores.values).reshape(T, B, -1),
        "reward": rng.integers(0, 2, (T, B)).astype(np.float32),
        "terminated": np.ones((T, B), bool),
        "truncated": np.zeros((T, B), bool),
        "valid": np.ones((T, B), np.uint8),
        "bootstrap_value": np.zeros((T, B), np.float32),
        "last_value": np.zeros((B,), np.float32),
    }


@pytest.mark.slow  # four compiles of generation: ~15 s
@pytest.mark.parametrize("model", [_from_scratch, _qwen2], ids=["from_scratch", "qwen2"])
def test_a_policy_generates_from_trimmed_contexts_what_it_does_from_whole_ones(model):
    lm, params = model()
    text = TextSpec(VOCAB, CONTEXT, RESPONSE, PAD, BOS, EOS)
    layout = FlatLayout(lm.param_shapes())
    flat = np.asarray(layout.ravel(params))
    obs = _rollout(lm, params)["obs"][0]  # 4 contexts of 3 to 6 tokens in 12
    assert context_length_needed(obs, PAD, 4) == 8
    answers = []
    for bucket in (0, 4):
        policy = TextPolicy(lm, layout.unravel, text, 3, 0, B, length_bucket=bucket)
        policy.set_params(flat)
        answers.append(policy.act(obs))
    (tokens, log_probs, values), (cut_tokens, cut_log_probs, cut_values) = answers
    np.testing.assert_array_equal(cut_tokens, tokens)
    np.testing.assert_allclose(cut_log_probs, log_probs, atol=1e-5)
    np.testing.assert_allclose(cut_values, values, atol=1e-5)
    assert (tokens != PAD).sum() > B  # answers of more than one token


LOSSES = {
    "dr_grpo_overlong": PPOConfig(
        advantage="group",
        group_size=2,
        scale_group_rewards=False,
        loss_aggregation="constant",
        overlong_buffer=6,
        kl_coef=0.1,
        kl_penalty="loss",
        num_minibatches=2,
    ),
    "gae_token": PPOConfig(kl_coef=0.1, num_minibatches=2, num_epochs=2),
    "gspo": PPOConfig(
        advantage="group", group_size=2, importance_ratio="sequence", loss_aggregation="sequence"
    ),
}


@pytest.mark.slow  # six compiles of an update: ~45 s
@pytest.mark.parametrize("model", [_from_scratch, _qwen2], ids=["from_scratch", "qwen2"])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_update_on_trimmed_messages_is_the_update_on_whole_ones(model, loss):
    lm, params = model()
    hp = token_ppo_hyperparams(LOSSES[loss], TextSpec(VOCAB, CONTEXT, RESPONSE, PAD, BOS, EOS))

    def score(params, context, response):
        return tuple(lm.score(params, context, response, PAD, EOS))

    optimizer = optax.sgd(0.05)  # Adam would magnify rounding in near-0 gradients
    update = jax.jit(make_token_ppo_update(score, optimizer, hp))

    def state():
        return TokenTrainState(
            params=params,
            ref_params=jax.tree.map(jnp.copy, params),
            opt_state=optimizer.init(params),
            update_count=jnp.zeros((), jnp.int32),
            key=jax.random.key(0),
        )

    rollout = _rollout(lm, params)
    lengths = trimmed_lengths(rollout["obs"], rollout["action"], PAD, 4)
    assert lengths == (8, 4)  # the case trims: 6 + 3 tokens needed of 12 + 8
    whole_state, whole = update(state(), rollout)
    trimmed_state, trimmed = update(state(), trim_text_rollout(rollout, lengths))
    assert set(whole) == set(trimmed)
    for name in whole:
        np.testing.assert_allclose(trimmed[name], whole[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert np.isfinite(float(whole["loss/total"]))
    assert float(whole["approx_kl"]) > 1e-6  # the second minibatch sees a policy that moved
    for a, b in zip(
        jax.tree.leaves(trimmed_state.params), jax.tree.leaves(whole_state.params), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # compiles generation twice: ~5 s
def test_a_frozen_opponent_plays_with_the_first_parameters_the_policy_was_given():
    lm, params = _from_scratch()
    text = TextSpec(VOCAB, CONTEXT, RESPONSE, PAD, BOS, EOS)
    layout = FlatLayout(lm.param_shapes())
    first = np.asarray(layout.ravel(params))
    later = first + np.random.default_rng(0).normal(0, 1.0, first.shape).astype(np.float32)
    obs = _rollout(lm, params)["obs"][0]
    rows = np.array([1, 3])

    def opponent_moves(*loads):
        policy = TextPolicy(lm, layout.unravel, text, 3, 0, B)
        move = policy.frozen_opponent()
        for flat in loads:
            policy.set_params(flat)
        return move(obs[rows], rows)

    kept = opponent_moves(first, later)
    assert kept.shape == (2, RESPONSE)
    np.testing.assert_array_equal(kept, opponent_moves(first))
    assert (kept != opponent_moves(later)).any()
