"""Sequence packing (`networks.packing`): messages of mixed lengths laid end to end in rows
without padding give the scores, and token-level PPO the losses and gradients, of the padded
batch, for the from-scratch transformer and for a Llama-family policy with LoRA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_grpo_losses import hyperparams
from test_llama_policy import sharpened as sharpened_llama
from test_lora import adapted_policy, with_moved_adapters

from agentenv_jax.algorithms.token_ppo import make_token_ppo_loss
from agentenv_jax.networks.language_model import language_model_spec, make_language_model
from agentenv_jax.networks.packing import (
    pack_rows,
    segment_allowed,
    segment_positions,
    token_counts,
)

CONTEXT, RESPONSE = 10, 6


def mixed_messages(vocab: int, pad: int, bos: int, eos: int, rows: int = 7):
    """`rows` messages of 2-10 context tokens (left-padded) and responses of 1-6 tokens, some
    ending in EOS, some cut at the response length; the ids after EOS are noise, as a
    generation's padding need not be."""
    rng = np.random.default_rng(4)
    special = {pad, bos, eos}
    ordinary = np.array([t for t in range(vocab) if t not in special])
    context = np.full((rows, CONTEXT), pad, np.int32)
    response = rng.choice(ordinary, size=(rows, RESPONSE)).astype(np.int32)
    for i in range(rows):
        length = 2 + (3 * i) % (CONTEXT - 1)
        context[i, CONTEXT - length] = bos
        context[i, CONTEXT - length + 1 :] = rng.choice(ordinary, size=length - 1)
        if i % 3 != 2:  # ends with EOS after 1-5 tokens
            response[i, i % 5] = eos
    return context, response


def test_pack_rows_places_each_message_whole_in_fewer_rows():
    pad, eos = 0, 2
    context, response = mixed_messages(20, pad, 1, eos)
    packed = pack_rows(context, response, pad, eos, row_length=CONTEXT + RESPONSE)
    context_tokens, response_tokens = token_counts(context, response, pad, eos)
    lengths = context_tokens + response_tokens
    assert packed.tokens.shape[0] < len(context)  # fewer rows than messages
    assert (packed.segments > 0).sum() == lengths.sum()  # no padding placed, nothing lost
    for i in range(len(context)):
        row = packed.rows[i]
        # The message's tokens are the context's real ones then the response to its EOS; its
        # last token follows the column that predicts it.
        end = packed.columns[i, response_tokens[i] - 1] + 2
        whole = np.concatenate(
            [context[i, CONTEXT - context_tokens[i] :], response[i, : response_tokens[i]]]
        )
        np.testing.assert_array_equal(packed.tokens[row, end - lengths[i] : end], whole)
        assert len(set(packed.segments[row, end - lengths[i] : end])) == 1
    with pytest.raises(ValueError, match="a message of 14 tokens does not fit a packed row of 12"):
        pack_rows(context, response, pad, eos, row_length=12)


def test_segments_restart_positions_and_never_attend_across():
    segments = jnp.asarray([[1, 1, 1, 2, 2, 0], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(
        segment_positions(segments), [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]
    )
    allowed = np.asarray(segment_allowed(segments))
    assert allowed[0, 4].tolist() == [False, False, False, True, True, False]
    assert allowed[0, 2].tolist() == [True, True, True, False, False, False]
    assert not allowed[0, :, 5].any() and not allowed[1, :, :2].any()


def _scratch_model(critic: str):
    vocab, pad, bos, eos = 40, 36, 37, 38
    lm = make_language_model(
        language_model_spec("tiny", vocab, critic=critic, max_length=CONTEXT + RESPONSE)
    )
    params = jax.tree.map(np.array, lm.init(jax.random.key(2)))
    for trunk in lm.spec.trunks:  # outputs that depend strongly on tokens and positions
        params[trunk]["token_embedding"] *= 5.0
        params[trunk]["position_embedding"] *= 5.0
    params["value_head"]["kernel"] *= 50.0
    return lm, params, (vocab, pad, bos, eos)


def _llama_with_lora(critic: str):
    from test_llama_policy import BOS, EOS, PAD, VOCAB

    lm = adapted_policy(critic)
    params = with_moved_adapters(sharpened_llama(lm, seed=1), seed=3)
    return lm, params, (VOCAB, PAD, BOS, EOS)


# Each family once, each critic once (a trunk's packed pass does not depend on which it is).
MODELS = {
    "scratch-separate-critic": lambda: _scratch_model("separate"),
    "llama-lora-shared-critic": lambda: _llama_with_lora("shared"),
}


@pytest.mark.parametrize("model", list(MODELS))
def test_packed_scores_losses_and_gradients_equal_the_padded_batchs(model):
    """Rows of 16 tokens hold the 7 messages in fewer rows; the log-probs, values and
    entropies of every response token, token-level PPO's loss (GRPO's group advantage, the KL
    term) and its gradient with respect to every trained parameter (LoRA's adapters and the
    value head, or all weights) equal the padded batch's."""
    lm, params, (vocab, pad, bos, eos) = MODELS[model]()
    context, response = mixed_messages(vocab, pad, bos, eos)
    packed = pack_rows(context, response, pad, eos, row_length=CONTEXT + RESPONSE)
    assert packed.tokens.shape[0] < len(context)
    padded = jax.jit(lambda p: lm.score(p, context, response, pad, eos))(params)
    packed_scores = jax.jit(lambda p: lm.packed_score(p, packed, response, pad, eos))(params)
    mask = np.asarray(padded.mask)
    assert 0 < mask.sum() < mask.size  # mixed lengths: some tokens past EOS
    for name in ("log_probs", "values", "entropy", "mask"):
        np.testing.assert_allclose(
            getattr(packed_scores, name), getattr(padded, name), atol=2e-5, err_msg=name
        )
    assert float(np.abs(np.asarray(padded.log_probs)).max()) > 0.5  # far from uniform

    rng = np.random.default_rng(0)
    n = len(context)
    batch = {
        "obs": context,
        "action": response,
        "log_prob": np.asarray(padded.log_probs) + rng.normal(0, 0.05, mask.shape) * mask,
        "value": np.zeros(mask.shape, np.float32),
        "ref_log_prob": np.asarray(padded.log_probs) - 0.1 * mask,
        "advantage": rng.normal(size=(n, 1)).astype(np.float32) * mask,
        "return": np.zeros(mask.shape, np.float32),
        "mask": mask,
    }
    hp = hyperparams(group_size=1, kl_coef=0.1, kl_penalty="loss", ent_coef=0.01)
    padded_loss = make_token_ppo_loss(
        lambda p, obs, action: tuple(lm.score(p, obs, action, pad, eos)), hp
    )
    packed_loss = make_token_ppo_loss(
        lambda p, obs, action: tuple(lm.packed_score(p, packed, action, pad, eos)), hp
    )
    clip = jnp.float32(0.2)
    grad = jax.jit(jax.grad(lambda f, p: f(p, batch, clip)[0], argnums=1), static_argnums=0)
    want = grad(padded_loss, params)
    got = grad(packed_loss, params)
    assert float(packed_loss(params, batch, clip)[0]) == pytest.approx(
        float(padded_loss(params, batch, clip)[0]), abs=1e-5
    )
    leaves = jax.tree_util.tree_leaves_with_path(want)
    for (path, value), packed_value in zip(leaves, jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_allclose(
            packed_value,
            value,
            atol=1e-5 + 1e-4 * float(np.abs(value).max()),
            err_msg=jax.tree_util.keystr(path),
        )
    assert max(float(np.abs(value).max()) for _, value in leaves) > 1e-3


def test_a_packed_update_takes_the_padded_updates_steps():
    """Two epochs of two minibatches over 2 x 4 messages (one of them a padding step, which
    packing leaves out): the update on packed minibatches moves the parameters as the update
    on the same minibatches padded does, and packs each into fewer rows than it has messages;
    the reference policy's pass, over all 8 messages packed at once, gives the same KL."""
    import optax

    from agentenv_jax.algorithms.token_ppo import TokenTrainState, make_token_ppo_update
    from agentenv_jax.envs.text.padding import message_lengths
    from agentenv_jax.networks.packing import packed_minibatches

    lm, params, (vocab, pad, bos, eos) = _scratch_model("shared")
    context, response = mixed_messages(vocab, pad, bos, eos, rows=8)
    t, b = 2, 4
    scores = lm.score(params, context, response, pad, eos)
    valid = np.ones((t, b), np.float32)
    valid[1, 2] = 0.0
    rollout = {
        "obs": context.reshape(t, b, CONTEXT),
        "action": response.reshape(t, b, RESPONSE),
        "log_prob": np.asarray(scores.log_probs).reshape(t, b, RESPONSE),
        "value": np.zeros((t, b, RESPONSE), np.float32),
        "reward": np.array([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 1.0]], np.float32),
        "terminated": np.ones((t, b), bool),
        "truncated": np.zeros((t, b), bool),
        "valid": valid,
        "bootstrap_value": np.zeros((t, b), np.float32),
        "last_value": np.zeros((b,), np.float32),
        "response_tokens": message_lengths(response, eos, pad).reshape(t, b),
    }
    hp = hyperparams(num_epochs=2, num_minibatches=2, kl_coef=0.05, ent_coef=0.01)

    def score(p, obs, action):
        return tuple(lm.score(p, obs, action, pad, eos))

    traced = []  # the packed rows' shapes the packed update's steps were compiled for

    def packed_score(p, packed, action):
        traced.append(packed.tokens.shape)
        return tuple(lm.packed_score(p, packed, action, pad, eos))

    optimizer = optax.sgd(0.05)  # Adam would magnify float noise in gradients near 0
    update = jax.jit(make_token_ppo_update(score, optimizer, hp, packed_score_fn=packed_score))
    plan = packed_minibatches(
        context,
        response,
        valid.reshape(-1) > 0,
        pad,
        eos,
        CONTEXT + RESPONSE,
        2,
        2,
        np.random.default_rng(0),
        row_bucket=1,
    )
    assert plan["packed_tokens"].shape[2] < 4  # rows per minibatch of 4 messages
    assert plan["all_packed_tokens"].shape[0] < 7  # rows for the 7 valid messages

    def state():
        copy = jax.tree.map(jnp.asarray, params)
        return TokenTrainState(copy, copy, optimizer.init(copy), jnp.int32(0), jax.random.key(0))

    orders = {"minibatch_orders": plan["minibatch_orders"]}
    padded, padded_metrics = update(state(), rollout | orders)
    assert not traced
    packed, packed_metrics = update(state(), rollout | plan)
    assert set(traced) == {plan["packed_tokens"].shape[2:], plan["all_packed_tokens"].shape}
    for name in ("loss/total", "loss/policy", "loss/kl", "approx_kl", "kl_to_reference"):
        assert float(packed_metrics[name]) == pytest.approx(float(padded_metrics[name]), abs=1e-5)
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), padded.params, params)
    assert max(jax.tree_util.tree_leaves(moved)) > 1e-3
    for a, b in zip(
        jax.tree_util.tree_leaves(packed.params),
        jax.tree_util.tree_leaves(padded.params),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=2e-5)
