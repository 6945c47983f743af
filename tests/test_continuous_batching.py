"""Continuous batching (`generate(..., slots=S)`): more rows than slots of KV cache, each slot
handed to the next row when its row ends. Every row gets the tokens, log-probs and values it
gets generated alone with its key, in both model families (the from-scratch transformer, and a
Llama-family model with LoRA adapters), with per-row sampling settings and token limits; and
the decode steps are those the rows need, not each batch of S rows run to its longest."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_language_model as scratch
import test_llama_policy as llama
from test_lora import adapted_policy, with_moved_adapters

from agentenv_jax.networks.generation import generate
from agentenv_jax.networks.language_model import language_model_spec, make_language_model

ROWS, SLOTS, CONTEXT = 9, 3, 7

generate_jit = jax.jit(
    generate,
    static_argnames=("lm", "response_length", "pad_id", "eos_id", "use_cache", "slots"),
)


def mixed_contexts(pad_id: int, bos_id: int, vocab: int) -> np.ndarray:
    """`[ROWS, CONTEXT]` contexts left-padded by 0 to 6 tokens."""
    rng = np.random.default_rng(4)
    context = np.full((ROWS, CONTEXT), pad_id, np.int32)
    for row in range(ROWS):
        pad = row % CONTEXT
        context[row, pad] = bos_id
        context[row, pad + 1 :] = rng.integers(3, vocab - 4, CONTEXT - pad - 1)
    return context


def family(name: str):
    """`(lm, params, pad, eos, bos, vocab, response_length)` of a sharpened tiny model: EOS
    likely enough that answers end at mixed lengths inside the response."""
    if name == "scratch":
        lm = make_language_model(language_model_spec("tiny", scratch.VOCAB))
        params = scratch.sharpened(lm, seed=11)
        return lm, params, scratch.PAD, scratch.EOS, scratch.BOS, 256, scratch.RESPONSE_LENGTH
    lm = adapted_policy()
    params = with_moved_adapters(llama.sharpened(lm, seed=3), seed=4)
    return lm, params, llama.PAD, llama.EOS, llama.BOS, llama.VOCAB, llama.RESPONSE_LENGTH


@pytest.mark.parametrize("name", ["scratch", "llama_lora"])
def test_each_row_gets_what_it_gets_generated_alone(name):
    lm, params, pad, eos, bos, vocab, response_length = family(name)
    context = jnp.asarray(mixed_contexts(pad, bos, vocab))
    keys = jax.random.split(jax.random.key(9), ROWS)
    rng = np.random.default_rng(0)
    temperature = jnp.asarray(rng.choice([0.0, 0.7, 1.0], ROWS), jnp.float32)
    top_p = jnp.asarray(rng.choice([0.9, 1.0], ROWS), jnp.float32)
    limits = jnp.asarray(rng.integers(2, response_length + 1, ROWS), jnp.int32)
    settings = dict(response_length=response_length, pad_id=pad, eos_id=eos)
    decodes = []

    def counted_decode(*args, **kwargs):
        jax.debug.callback(lambda: decodes.append(1))
        return lm.decode(*args, **kwargs)

    counted = lm._replace(decode=counted_decode)
    sampling = dict(temperature=temperature, top_p=top_p, max_new_tokens=limits)
    slotted = generate_jit(counted, params, context, keys, slots=SLOTS, **settings, **sampling)
    slotted_steps = len(decodes)
    lengths = np.asarray(slotted.mask).sum(axis=1).astype(int)
    assert lengths.min() >= 1 and len(set(lengths)) > 2, lengths  # answers of mixed lengths
    for row in range(ROWS):
        alone = generate_jit(
            lm,
            params,
            context[row : row + 1],
            keys[row : row + 1],
            temperature=temperature[row : row + 1],
            top_p=top_p[row : row + 1],
            max_new_tokens=limits[row : row + 1],
            **settings,
        )
        np.testing.assert_array_equal(slotted.tokens[row], alone.tokens[0], err_msg=f"row {row}")
        np.testing.assert_array_equal(slotted.mask[row], alone.mask[0])
        for field in ("log_probs", "sampler_log_probs", "values"):
            np.testing.assert_allclose(
                getattr(slotted, field)[row], getattr(alone, field)[0], atol=2e-4, err_msg=field
            )
    # Static batches of SLOTS rows each decode to their longest answer; the slots decode while
    # any row answers: at most the rows' tokens over the slots, and one step per row handed a
    # slot late (the step its predecessor ends on).
    static = sum(lengths[i : i + SLOTS].max() for i in range(0, ROWS, SLOTS))
    assert slotted_steps <= -(-lengths.sum() // SLOTS) + ROWS - SLOTS
    assert slotted_steps < static, (slotted_steps, static, lengths)


def test_slots_need_a_key_per_row():
    lm, params, pad, eos, bos, vocab, response_length = family("scratch")
    context = jnp.asarray(mixed_contexts(pad, bos, vocab))
    with pytest.raises(ValueError, match="a key per row"):
        generate(
            lm,
            params,
            context,
            jax.random.key(0),
            response_length=response_length,
            pad_id=pad,
            eos_id=eos,
            slots=SLOTS,
        )
