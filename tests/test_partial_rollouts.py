"""Partial rollouts: a KV-cached generation decoded in parts (`start_decoding`,
`continue_decoding`) whose parameters change between parts, as answers in flight continue under
parameters that arrive meanwhile. Undivided it is `generate`; divided with new parameters, each
token keeps the log-prob and the version of the parameters whose distribution it was drawn
from."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_language_model as scratch

from agentenv_jax.networks.generation import (
    continue_decoding,
    decoded,
    decoded_versions,
    generate,
    start_decoding,
)
from agentenv_jax.networks.language_model import language_model_spec, make_language_model

LM = make_language_model(language_model_spec("tiny", scratch.VOCAB))
SETTINGS = dict(response_length=scratch.RESPONSE_LENGTH, pad_id=scratch.PAD)

start_jit = jax.jit(start_decoding, static_argnames=("lm", "response_length", "pad_id"))
continue_jit = jax.jit(continue_decoding, static_argnames=("lm", "pad_id", "eos_id"))
generate_jit = jax.jit(generate, static_argnames=("lm", "response_length", "pad_id", "eos_id"))
score_jit = jax.jit(lambda *args: LM.score(*args), static_argnums=(3, 4))


def in_parts(param_versions: list[tuple[dict, int]], part: int, context, keys, **sampling):
    """A generation decoded `part` tokens at a time, part i by `param_versions[i]` (the last
    for the rest)."""
    params, version = param_versions[0]
    state = start_jit(LM, params, context, keys, version=version, **SETTINGS, **sampling)
    i = 0
    while int(state.step) < scratch.RESPONSE_LENGTH and not bool(np.all(state.done)):
        params, version = param_versions[min(i, len(param_versions) - 1)]
        state = continue_jit(
            LM, params, state, steps=part, pad_id=scratch.PAD, eos_id=scratch.EOS, version=version
        )
        i += 1
    return state


def test_decoded_in_parts_by_the_same_parameters_it_is_generate():
    params = scratch.sharpened(LM, seed=11)
    context = jnp.asarray(scratch.padded_contexts())
    keys = jax.random.split(jax.random.key(9), context.shape[0])
    sampling = dict(temperature=jnp.array([1.0, 0.7, 1.0, 0.0]), top_p=jnp.array([1, 1, 0.9, 1.0]))
    whole = generate_jit(LM, params, context, keys, eos_id=scratch.EOS, **SETTINGS, **sampling)
    state = in_parts([(params, 7)], 3, context, keys, **sampling)
    parts = decoded(state)
    np.testing.assert_array_equal(parts.tokens, whole.tokens)
    np.testing.assert_array_equal(parts.mask, whole.mask)
    for field in ("log_probs", "sampler_log_probs", "values"):
        np.testing.assert_allclose(getattr(parts, field), getattr(whole, field), atol=1e-5)
    versions = np.asarray(decoded_versions(state))
    np.testing.assert_array_equal(versions, np.where(np.asarray(whole.mask) > 0, 7, -1))


def test_tokens_after_new_parameters_carry_their_log_probs_and_version():
    """Two versions that differ in the final norm alone (the keys and values of the tokens, and
    so the cache, are the same under both): tokens 0-2 are drawn from version 1's logits (the
    first part's 2 steps, and the third from the logits its last step computed), the rest
    from version 2's; each token's log-prob is `score` under the version it carries."""
    first = scratch.sharpened(LM, seed=11)
    second = jax.tree.map(np.array, first)
    rng = np.random.default_rng(0)
    second["policy"]["final_norm"]["bias"] += rng.normal(
        0, 1.5, second["policy"]["final_norm"]["bias"].shape
    )
    context = jnp.asarray(scratch.padded_contexts())
    keys = jax.random.split(jax.random.key(2), context.shape[0])
    state = in_parts([(first, 1), (second, 2)], 2, context, keys)
    out = decoded(state)
    mask = np.asarray(out.mask) > 0
    assert mask[:, 4].sum() >= 2  # rows that run past the change
    versions = np.asarray(decoded_versions(state))
    expected = np.where(np.arange(scratch.RESPONSE_LENGTH) < 3, 1, 2)[None]
    np.testing.assert_array_equal(versions, np.where(mask, expected, -1))
    tokens = jnp.asarray(out.tokens)
    under = {
        v: score_jit(p, context, tokens, scratch.PAD, scratch.EOS)
        for v, p in [(1, first), (2, second)]
    }
    for version in (1, 2):
        here = mask & (versions == version)
        np.testing.assert_allclose(
            np.asarray(out.log_probs)[here], np.asarray(under[version].log_probs)[here], atol=1e-4
        )
    # The change is not a no-op: version 2's tokens are unlikely under version 1.
    later = mask & (versions == 2)
    assert not np.allclose(
        np.asarray(under[1].log_probs)[later], np.asarray(out.log_probs)[later], atol=1e-2
    )


def test_an_env_ranks_policy_continues_its_answers_under_parameters_that_arrive():
    """`TextPolicy(partial_rollout_steps=2)` as an env rank runs it: between parts it asks for
    parameters (`between_parts`, which the env rank's Actor sets), and the answers in flight
    continue under the version it gets; `token_versions` and the behaviour log-probs say which
    version drew each token."""
    from jax.flatten_util import ravel_pytree

    from agentenv_jax.actor.text_policy import TextPolicy
    from agentenv_jax.envs.spaces import TextSpec

    first = scratch.sharpened(LM, seed=11)
    second = jax.tree.map(np.array, first)
    bias = second["policy"]["final_norm"]["bias"]
    bias += np.random.default_rng(0).normal(0, 1.5, bias.shape)
    flat_first, unravel = ravel_pytree(first)
    flat_second, _ = ravel_pytree(second)
    context = scratch.padded_contexts()
    text = TextSpec(
        scratch.VOCAB, context.shape[1], scratch.RESPONSE_LENGTH, scratch.PAD, 257, scratch.EOS
    )
    policy = TextPolicy(LM, unravel, text, 0, 0, context.shape[0], partial_rollout_steps=2)
    policy.set_params(flat_first)
    policy.version = 1
    calls = []

    def between_parts() -> int:  # version 2 arrives after the first part
        calls.append(1)
        if len(calls) == 1:
            policy.set_params(flat_second)
            return 2
        return 2

    policy.between_parts = between_parts
    tokens, log_probs, _ = policy.act(context)
    versions = policy.token_versions
    mask = tokens != scratch.PAD
    assert calls and mask[:, 4].sum() >= 2  # answers in flight when version 2 came
    expected = np.where(np.arange(scratch.RESPONSE_LENGTH) < 3, 1, 2)[None]
    np.testing.assert_array_equal(versions, np.where(mask, expected, -1))
    for version, params in [(1, first), (2, second)]:
        scores = score_jit(
            params, jnp.asarray(context), jnp.asarray(tokens), scratch.PAD, scratch.EOS
        )
        here = mask & (versions == version)
        np.testing.assert_allclose(log_probs[here], np.asarray(scores.log_probs)[here], atol=1e-4)


@pytest.mark.slow
def test_a_run_with_partial_rollouts_reconciles_with_its_tokens_lag_bounded(run_dir):
    """`mpiexec -n 2` (a learner, an env rank running one update ahead), answers of 8 tokens
    decoded 2 at a time: the parameters that arrive while the env rank generates are taken
    between parts. Every token trained is at most `max_policy_lag` updates old, whichever
    part it was drawn in; transitions, tokens and episodes reconcile."""
    from test_text_training import _metrics, _mpiexec_train, _summary

    run = _mpiexec_train(
        run_dir,
        "arithmetic_ppo",
        "partial",
        "env.global_num_envs=8",
        "env.kwargs.response_length=8",
        "env.kwargs.context_length=8",
        "algorithm.rollout_length=4",
        "algorithm.max_policy_lag=1",
        "algorithm.partial_rollout_steps=2",
        "run.total_env_steps=256",
        ranks=2,
    )
    records = _metrics(run)
    assert len(records) == 8
    assert all(0 <= r["token_lag_max"] <= 1 for r in records), [r["token_lag_max"] for r in records]
    assert all(0.0 <= r["token_lag_mean"] <= 1.0 for r in records)
    summary = _summary(run)
    # (The env rank's segment generated ahead for a ninth update arrives late, counted apart.)
    for name in ("accounting", "token_accounting", "episode_accounting"):
        assert summary[name]["reconciles"], (name, summary[name])
    assert summary["accounting"]["trained"] == 256
    print("answers across versions", [r["answers_across_versions"] for r in records])


def test_an_env_rank_takes_parameters_between_parts_and_stamps_each_token():
    """The env rank's `Actor` with a text policy decoding in parts (max_policy_lag 1): version 1
    arrives at its first look for parameters, between the first two parts of the first
    answers. Those answers' tokens carry 0 then 1, their row keeps version 0 (its oldest
    token's, which the staleness bound goes by), and the next rows are version 1's alone."""
    from jax.flatten_util import ravel_pytree
    from test_actor import ScheduledChannel

    from agentenv_jax.actor.loop import Actor
    from agentenv_jax.actor.text_policy import TextPolicy
    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.envs.factory import vector_env_spaces
    from agentenv_jax.envs.text import BYTE_TOKENIZER, make_text_vector_env
    from agentenv_jax.transport.messages import param_message_spec

    env_id, envs, rollout = "agentenv_jax/Arithmetic-v0", 4, 3
    kwargs = {"max_operand": 4, "context_length": 8, "response_length": scratch.RESPONSE_LENGTH}
    vector_env = make_text_vector_env(env_id, envs, kwargs, BYTE_TOKENIZER)
    spaces = vector_env_spaces(env_id, vector_env)
    params = scratch.sharpened(LM, seed=11)
    # EOS made rarer (answers that run past the first part), and a second version.
    eos_row = params["policy"]["token_embedding"][scratch.EOS]
    params["policy"]["final_norm"]["bias"] -= 3.0 * eos_row / np.dot(eos_row, eos_row)
    flat, unravel = ravel_pytree(params)
    param_spec = param_message_spec(flat.size, spaces.normalizer_dim)

    def message(version: int, flat_params: np.ndarray) -> np.ndarray:
        buffer = param_spec.allocate()
        fields = param_spec.views(buffer)
        fields["version"][0] = version
        fields["params"][:] = flat_params
        return buffer

    later = flat + np.random.default_rng(0).normal(0, 0.05, flat.shape).astype(np.float32)
    policy = TextPolicy(LM, unravel, spaces.text, 0, 0, envs, partial_rollout_steps=2)
    segment_spec = on_policy_segment_spec(spaces, rollout, envs)
    actor = Actor(
        vector_env,
        spaces,
        policy,
        ScheduledChannel({1: message(1, later)}),
        segment_spec,
        param_spec,
        seed=0,
        env_offset=0,
        rollout_length=rollout,
        gamma=1.0,
        normalize_obs=False,
        normalize_reward=False,
        clip_obs=10.0,
        clip_reward=10.0,
        max_inflight_segments=1,
        max_policy_lag=1,
        timeout_s=10.0,
    )
    actor._load_params(message(0, flat))
    fields = segment_spec.views(segment_spec.allocate())
    actor._fill_segment(fields)
    versions, action = fields["token_version"], fields["action"]
    real = action != scratch.PAD
    first = real[0]
    assert first[:, 2].any()  # answers still in flight after the first part
    # The first answers: tokens 0-2 drawn under version 0 (2 steps, and the third from the
    # logits the second computed), the rest under 1.
    expected = np.where(np.arange(scratch.RESPONSE_LENGTH) < 3, 0, 1)
    np.testing.assert_array_equal(versions[0], np.where(first, expected[None], -1))
    assert fields["policy_version"][0].tolist() == [0] * envs
    np.testing.assert_array_equal(versions[1:], np.where(real[1:], 1, -1))
    assert (fields["policy_version"][1:] == 1).all()
    vector_env.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ([], "algorithm.max_policy_lag > 0 (got 0)"),
        (["algorithm.max_policy_lag=1", "topology.inference=learner"], "topology.inference"),
        (
            ["algorithm.max_policy_lag=1", "network.language_model.generation_slots=4"],
            "network.language_model.generation_slots 0 (got 4)",
        ),
    ],
    ids=["synchronous", "central_inference", "slots"],
)
def test_partial_rollouts_without_what_they_need_are_a_start_up_error(run_dir, settings, named):
    from agentenv_jax.config import load_config
    from agentenv_jax.envs.factory import EnvError
    from agentenv_jax.runtime.launch import train

    config = load_config(
        "arithmetic_ppo",
        ["algorithm.partial_rollout_steps=2", f"run.run_dir={run_dir}", "run.progress=false"]
        + settings,
    )
    with pytest.raises(EnvError, match=re.escape(named)):
        train(config)
