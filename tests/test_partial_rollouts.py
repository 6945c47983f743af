"""Partial rollouts: a KV-cached generation decoded in parts (`start_decoding`,
`continue_decoding`) whose parameters change between parts, as answers in flight continue under
parameters that arrive meanwhile. Undivided it is `generate`; divided with new parameters, each
token keeps the log-prob and the version of the parameters whose distribution it was drawn
from."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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
