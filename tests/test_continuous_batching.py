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

from agentenv_jax.envs.text.padding import decode_steps
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
    # The slots decode while any row answers, each row taking the slot that frees first, as
    # the learner's generation_utilisation counts them; static batches of SLOTS rows would
    # each decode to their longest answer.
    assert slotted_steps == decode_steps(lengths, SLOTS)
    static = sum(lengths[i : i + SLOTS].max() for i in range(0, ROWS, SLOTS))
    assert slotted_steps < static, (slotted_steps, static, lengths)


def test_decode_steps_hand_each_answer_the_slot_that_frees_first():
    # Slot 0: the 5 (ends at 5); slot 1: 1, 2, 1, then the 4, which it gets at 4 (ends at 8).
    assert decode_steps(np.array([5, 1, 2, 1, 4]), 2) == 8
    assert decode_steps(np.array([5, 1, 2, 1, 4]), 0) == 5  # one batch: the longest
    assert decode_steps(np.array([5, 1, 2, 1, 4]), 5) == 5
    assert decode_steps(np.array([3, 3, 3, 3]), 1) == 12
    assert decode_steps(np.array([0, 2]), 1) == 3  # an answer is a token at least


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


def test_an_env_ranks_policy_generates_through_its_slots():
    """`TextPolicy(generation_slots=4)`, as env ranks and central inference build it from
    `network.language_model.generation_slots`: the answers of the policy without slots, in
    the decode steps of 4 slots rather than the longest answer's over all 9 rows."""
    from jax.flatten_util import ravel_pytree

    from agentenv_jax.actor.text_policy import TextPolicy
    from agentenv_jax.envs.spaces import TextSpec

    lm, params, pad, eos, bos, vocab, response_length = family("scratch")
    text = TextSpec(scratch.VOCAB, CONTEXT, response_length, pad, bos, eos)
    flat, unravel = ravel_pytree(params)
    decodes = []

    def counted_decode(*args, **kwargs):
        jax.debug.callback(lambda: decodes.append(1))
        return lm.decode(*args, **kwargs)

    counted = lm._replace(decode=counted_decode)
    obs = mixed_contexts(pad, bos, vocab)
    answers, steps = {}, {}
    for slots in (0, 4):
        policy = TextPolicy(counted, unravel, text, 0, 0, ROWS, generation_slots=slots)
        policy.set_params(flat)
        decodes.clear()
        answers[slots] = policy.act(obs)
        steps[slots] = len(decodes)
    for static, slotted in zip(answers[0], answers[4], strict=True):
        np.testing.assert_allclose(slotted, static, atol=2e-4)
    lengths = (answers[0][0] != pad).sum(axis=1)
    assert len(set(lengths)) > 2, lengths
    assert steps == {0: lengths.max(), 4: decode_steps(lengths, 4)}, (steps, lengths)


@pytest.mark.slow
def test_a_run_with_generation_slots_trains_on_the_answers_it_gets_without(tmp_path):
    """`network.language_model.generation_slots`: an env rank's 16 answers (of up to 8 tokens,
    from weights whose EOS is likely enough that they end at mixed lengths) go through 4 slots.
    Each row keeps its key, so the run gets the answers and losses of the run without slots;
    less of what generation computes is padding."""
    from agentenv_jax.checkpoint.pretrained import save_language_model
    from agentenv_jax.config import load_config
    from agentenv_jax.envs.text import BYTE_TOKENIZER
    from agentenv_jax.metrics.logger import read_metrics
    from agentenv_jax.networks.text_models import language_model_for
    from agentenv_jax.runtime.launch import train

    settings = ["env.global_num_envs=16", "env.kwargs.response_length=8"]
    settings += ["algorithm.rollout_length=2", "run.total_env_steps=64", "run.progress=false"]
    settings += [f"network.language_model.init_from={tmp_path / 'weights'}"]
    text = BYTE_TOKENIZER.text_spec(8, 8)
    lm = language_model_for(
        load_config("arithmetic_ppo", settings[:2]).network.language_model, text
    )
    weights = jax.tree.map(np.array, lm.init(jax.random.key(3)))
    eos_row = weights["policy"]["token_embedding"][text.eos_id]
    # The tied LM head reads the final norm's output: its bias along the EOS embedding raises
    # the EOS logit by 4.5 whatever the context (EOS about one step in four).
    weights["policy"]["final_norm"]["bias"] += 4.5 * eos_row / np.dot(eos_row, eos_row)
    save_language_model(tmp_path / "weights", weights)

    records = {}
    for slots in (0, 4):
        config = load_config(
            "arithmetic_ppo",
            [*settings, f"run.run_dir={tmp_path}", f"run.name=slots{slots}"]
            + [f"network.language_model.generation_slots={slots}"],
        )
        result = train(config)
        assert result.accounting["reconciles"], result.accounting
        records[slots] = read_metrics(result.run_dir / "metrics.jsonl")
    assert len(records[0]) == len(records[4]) == 2
    for static, slotted in zip(records[0], records[4], strict=True):
        assert 2 < static["response_length_mean"] < 7  # mixed lengths
        for name in ("tokens_generated", "response_length_mean", "loss/policy", "loss/value"):
            assert slotted[name] == pytest.approx(static[name], rel=1e-4, abs=1e-6), name
        assert slotted["generation_utilisation"] > static["generation_utilisation"]


def test_a_negative_slot_count_is_refused_naming_the_field():
    from agentenv_jax.config import load_config
    from agentenv_jax.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"network\.language_model\.generation_slots.*-2.*0 \("):
        load_config("arithmetic_ppo", ["network.language_model.generation_slots=-2"])
