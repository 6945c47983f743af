"""A Llama-family model as a text policy: its KV-cached generation equals the uncached one,
agrees with `score` (the learner's log-probs and values), keeps the plain forward pass's logits,
and ignores left padding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.networks.generation import generate
from agentenv_jax.networks.language_model import count_params
from agentenv_jax.networks.llama import logits as llama_logits
from agentenv_jax.networks.llama import spec_from_config
from agentenv_jax.networks.llama_policy import LlamaPolicySpec, make_llama_policy

VOCAB, PAD, BOS, EOS = 97, 0, 1, 2
RESPONSE_LENGTH = 10
CONFIG = {
    "model_type": "qwen2",  # q/k/v biases, grouped-query attention
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 1000.0,
}

generate_jit = jax.jit(
    generate, static_argnames=("lm", "response_length", "pad_id", "eos_id", "use_cache")
)


def sharpened(lm, seed: int) -> dict:
    """Random weights scaled up so outputs depend strongly on the tokens (std-0.02 weights give
    near-uniform outputs that would let a misplaced position pass), with values of order one
    and EOS likely enough that rows end inside the response."""
    params = jax.tree.map(np.array, lm.init(jax.random.key(seed)))
    for trunk in lm.spec.base_trunks:
        params[trunk]["embed_tokens"] *= 50.0
        # A constant first coordinate: the normed final state keeps a positive entry there,
        # which the EOS column of the output head reads.
        params[trunk]["embed_tokens"][:, 0] = 2.0
        for name in ("q_proj", "k_proj", "gate_proj", "up_proj"):
            params[trunk]["layers"][name] *= 15.0
    params["policy"]["lm_head"] *= 10.0
    params["policy"]["lm_head"][0, EOS] = 3.0
    params["value_head"]["kernel"] *= 50.0
    return params


def padded_contexts() -> np.ndarray:
    rng = np.random.default_rng(3)
    context = np.full((4, 7), PAD, np.int32)
    for row, pad in enumerate((0, 2, 4, 6)):
        context[row, pad] = BOS
        context[row, pad + 1 :] = rng.integers(3, VOCAB, 7 - pad - 1)
    return context


def policy(critic: str = "shared"):
    model = spec_from_config(CONFIG)
    return make_llama_policy(LlamaPolicySpec(model, max_length=32, critic=critic))


@pytest.fixture(scope="module", params=["shared", "separate"])
def generated(request: pytest.FixtureRequest) -> tuple:
    lm = policy(request.param)
    params = sharpened(lm, seed=4)
    context = jnp.asarray(padded_contexts())
    runs = {
        use_cache: generate_jit(
            lm,
            params,
            context,
            jax.random.key(5),
            response_length=RESPONSE_LENGTH,
            pad_id=PAD,
            eos_id=EOS,
            use_cache=use_cache,
        )
        for use_cache in (True, False)
    }
    return lm, params, context, runs[True], runs[False]


def test_cached_generation_matches_uncached_and_score(generated: tuple) -> None:
    lm, params, context, cached, uncached = generated
    np.testing.assert_array_equal(cached.tokens, uncached.tokens)
    np.testing.assert_array_equal(cached.mask, uncached.mask)
    np.testing.assert_allclose(cached.log_probs, uncached.log_probs, atol=1e-4)
    np.testing.assert_allclose(cached.values, uncached.values, atol=1e-4)
    # Not degenerate: rows differ, some end early, values vary along a response.
    assert len({tuple(row) for row in np.asarray(cached.tokens)}) == 4
    assert 0 < cached.mask.sum() < cached.mask.size
    assert np.std(np.asarray(cached.values)[cached.mask > 0]) > 0.05

    scores = jax.jit(lm.score, static_argnums=(3, 4))(params, context, cached.tokens, PAD, EOS)
    np.testing.assert_array_equal(scores.mask, cached.mask)
    np.testing.assert_allclose(scores.log_probs, cached.log_probs, atol=1e-4)
    np.testing.assert_allclose(scores.values, cached.values, atol=1e-4)
    np.testing.assert_allclose(
        lm.context_value(params, context, PAD), scores.values[:, 0], atol=1e-4
    )


def test_policy_logits_are_the_models_and_ignore_left_padding() -> None:
    lm = policy()
    params = sharpened(lm, seed=6)
    context = padded_contexts()
    mask = (context != PAD).astype(np.int32)
    logits, values = lm.apply(params, context, mask)
    expected = llama_logits(lm.spec.model, params["policy"], context, mask)
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    # Row 1 (two pads) equals the same tokens without padding.
    alone_logits, alone_values = lm.apply(params, context[1:2, 2:], mask[1:2, 2:])
    np.testing.assert_allclose(logits[1, 2:], alone_logits[0], atol=1e-4)
    np.testing.assert_allclose(values[1, 2:], alone_values[0], atol=1e-4)


def test_parameter_shapes_count_every_weight() -> None:
    shared, separate = policy("shared"), policy("separate")
    trunk = count_params(shared.param_shapes()["policy"])
    head = 64 + 1
    assert count_params(shared.param_shapes()) == trunk + head
    assert count_params(separate.param_shapes()) == 2 * trunk + head
    params = shared.init(jax.random.key(0))
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, shared.param_shapes())


def test_recomputed_blocks_give_the_same_gradients() -> None:
    """`remat` recomputes each block in the backward pass (`jax.checkpoint` inside the scan over
    layers): the same loss and gradients, and the backward pass holds one block's activations."""
    model = spec_from_config(CONFIG)
    context = jnp.asarray(padded_contexts())
    response = jnp.asarray(np.random.default_rng(1).integers(3, VOCAB, (4, 5)), jnp.int32)
    results = {}
    for remat in (False, True):
        lm = make_llama_policy(LlamaPolicySpec(model, max_length=32, remat=remat))
        params = sharpened(lm, seed=2)

        def loss(params, lm=lm):
            scores = lm.score(params, context, response, PAD, EOS)
            return -jnp.sum(scores.log_probs) + jnp.sum(jnp.square(scores.values))

        grad = jax.jit(jax.value_and_grad(loss))
        results[remat] = grad(params)
        jaxpr = str(jax.make_jaxpr(grad)(params))
        assert ("checkpoint" in jaxpr or "remat" in jaxpr) == remat
    (plain_loss, plain_grads), (remat_loss, remat_grads) = results[False], results[True]
    np.testing.assert_allclose(remat_loss, plain_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(plain_grads), jax.tree.leaves(remat_grads), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5)  # recomputed in another order
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(plain_grads)) > 0
