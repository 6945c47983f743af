"""The transformer actor-critic: KV-cached generation, scoring, padding, causality, sizes, weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.checkpoint.pretrained import load_language_model, save_language_model
from agentenv_jax.checkpoint.store import CheckpointError
from agentenv_jax.config.errors import MeshError
from agentenv_jax.networks.generation import (
    NUCLEUS_CANDIDATES,
    Generation,
    generate,
    nucleus_logits,
    sample_categorical,
)
from agentenv_jax.networks.language_model import (
    LM_SIZES,
    LanguageModel,
    count_params,
    language_model_spec,
    make_language_model,
    response_mask,
)
from agentenv_jax.parallel.partitioning import check_model_axis_divides

VOCAB, PAD, BOS, EOS = 260, 256, 257, 258
RESPONSE_LENGTH = 12

generate_jit = jax.jit(
    generate, static_argnames=("lm", "response_length", "pad_id", "eos_id", "use_cache")
)
score_jit = jax.jit(lambda lm, *args: lm.score(*args), static_argnums=(0, 4, 5))


def sharpened(lm: LanguageModel, seed: int) -> dict:
    """Tiny-model parameters scaled up so outputs depend strongly on the tokens (random init is
    near uniform, which would let misaligned positions pass), values are O(1), and EOS is likely
    enough (~14% a step) that most rows end inside the response."""
    params = jax.tree.map(np.array, lm.init(jax.random.key(seed)))
    for trunk in lm.spec.trunks:
        params[trunk]["token_embedding"] *= 5.0
        params[trunk]["position_embedding"] *= 5.0
        for layer in range(lm.spec.num_layers):
            params[trunk][f"block_{layer}"]["qkv"]["kernel"] *= 3.0
    eos_row = params["policy"]["token_embedding"][EOS]
    # The tied LM head reads the final norm's output, so shifting its bias along the EOS
    # embedding raises the EOS logit by 4.5 whatever the context.
    params["policy"]["final_norm"]["bias"] += 4.5 * eos_row / np.dot(eos_row, eos_row)
    params["value_head"]["kernel"] *= 50.0
    return params


def padded_contexts() -> np.ndarray:
    """`[4, 7]` contexts, left-padded by 0, 2, 4 and 6 tokens."""
    rng = np.random.default_rng(3)
    context = np.full((4, 7), PAD, np.int32)
    for row, pad in enumerate((0, 2, 4, 6)):
        context[row, pad] = BOS
        context[row, pad + 1 :] = rng.integers(0, 256, 7 - pad - 1)
    return context


@pytest.fixture(scope="module", params=["shared", "separate"])
def generated(request: pytest.FixtureRequest) -> tuple:
    lm = make_language_model(language_model_spec("tiny", VOCAB, critic=request.param))
    params = sharpened(lm, seed=11)
    context = jnp.asarray(padded_contexts())
    key = jax.random.key(5)
    runs = {
        use_cache: generate_jit(
            lm,
            params,
            context,
            key,
            response_length=RESPONSE_LENGTH,
            pad_id=PAD,
            eos_id=EOS,
            use_cache=use_cache,
        )
        for use_cache in (True, False)
    }
    return lm, params, context, runs[True], runs[False]


@pytest.mark.slow
def test_cached_generation_matches_uncached(generated: tuple) -> None:
    lm, params, context, cached, uncached = generated
    assert isinstance(cached, Generation)
    assert cached.tokens.shape == (4, RESPONSE_LENGTH) and cached.tokens.dtype == jnp.int32
    np.testing.assert_array_equal(cached.tokens, uncached.tokens)
    np.testing.assert_array_equal(cached.mask, uncached.mask)
    np.testing.assert_allclose(cached.log_probs, uncached.log_probs, atol=1e-5)
    np.testing.assert_allclose(cached.values, uncached.values, atol=1e-5)
    # The case is not degenerate: rows differ, some end early, values vary along a response.
    assert len({tuple(row) for row in np.asarray(cached.tokens)}) == 4
    assert 0 < cached.mask.sum() < cached.mask.size
    assert np.std(np.asarray(cached.values)[cached.mask > 0]) > 0.05


@pytest.mark.slow
def test_generation_agrees_with_score(generated: tuple) -> None:
    lm, params, context, cached, _ = generated
    tokens, mask = np.asarray(cached.tokens), np.asarray(cached.mask)
    for row in range(tokens.shape[0]):
        eos_at = np.flatnonzero(tokens[row] == EOS)
        end = eos_at[0] + 1 if len(eos_at) else RESPONSE_LENGTH
        np.testing.assert_array_equal(mask[row, :end], 1.0)
        np.testing.assert_array_equal(mask[row, end:], 0.0)
        np.testing.assert_array_equal(tokens[row, end:], PAD)
    np.testing.assert_array_equal(np.asarray(cached.log_probs)[mask == 0], 0.0)
    np.testing.assert_array_equal(np.asarray(cached.values)[mask == 0], 0.0)

    scores = score_jit(lm, params, context, cached.tokens, PAD, EOS)
    np.testing.assert_array_equal(scores.mask, cached.mask)
    np.testing.assert_allclose(scores.log_probs, cached.log_probs, atol=1e-5)
    np.testing.assert_allclose(scores.values, cached.values, atol=1e-5)
    assert np.all(np.asarray(scores.log_probs)[mask > 0] < 0)
    assert np.all(np.asarray(scores.entropy)[mask > 0] > 0)
    np.testing.assert_array_equal(np.asarray(scores.entropy)[mask == 0], 0.0)
    np.testing.assert_allclose(
        lm.context_value(params, context, PAD), scores.values[:, 0], atol=1e-5
    )


@pytest.mark.slow
def test_tempered_samples_report_the_policy_log_probs(generated: tuple) -> None:
    lm, params, context, cached, _ = generated
    cold = generate_jit(
        lm,
        params,
        context,
        jax.random.key(5),
        response_length=RESPONSE_LENGTH,
        pad_id=PAD,
        eos_id=EOS,
        temperature=0.5,
    )
    assert not np.array_equal(cold.tokens, cached.tokens)
    scores = score_jit(lm, params, context, cold.tokens, PAD, EOS)
    np.testing.assert_allclose(scores.log_probs, cold.log_probs, atol=1e-5)


def _numpy_nucleus(logits: np.ndarray, top_p: float) -> np.ndarray:
    """The nucleus by its definition, one row at a time: sort by probability, keep the most
    likely token, then tokens while the mass before them is below top_p."""
    out = np.full_like(logits, -1e30)
    for row, x in enumerate(logits):
        p = np.exp(x - x.max())
        p /= p.sum()
        mass = 0.0
        for token in np.argsort(-p, kind="stable"):
            if mass > 0 and mass >= top_p and top_p < 1.0:
                break
            out[row, token] = x[token]
            mass += p[token]
    return out


@pytest.mark.parametrize("top_p", [0.0, 0.3, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("vocab", [50, 2000])
def test_the_nucleus_keeps_the_fewest_likeliest_tokens_reaching_top_p(top_p, vocab) -> None:
    """Over a vocabulary smaller and larger than the candidates the nucleus is first looked
    for among (`NUCLEUS_CANDIDATES`), with a nearly flat row, whose nucleus is wider."""
    rng = np.random.default_rng(7)
    logits = (rng.normal(size=(6, vocab)) * 3).astype(np.float32)
    logits[5] *= 0.01
    got = np.asarray(nucleus_logits(jnp.asarray(logits), jnp.full((6,), top_p)))
    want = _numpy_nucleus(logits, top_p)
    np.testing.assert_array_equal(got, want)
    kept = (want > -1e30).sum(-1)
    if vocab > NUCLEUS_CANDIDATES and top_p == 0.9:
        assert kept[5] > NUCLEUS_CANDIDATES > kept[:5].max()  # both ways of finding it


@pytest.mark.slow
def test_each_row_samples_at_its_own_temperature_and_top_p(generated: tuple) -> None:
    """A batch of rows at different temperatures and nuclei draws, row by row, what each row
    generated alone at its sampling draws; `sampler_log_probs` are those of the tempered,
    cut distribution (numpy, from the model's logits), `log_probs` still the policy's."""
    lm, params, context, _, _ = generated
    keys = jax.random.split(jax.random.key(9), context.shape[0])
    temperature = jnp.asarray([1.0, 0.5, 2.0, 0.0])
    top_p = jnp.asarray([1.0, 1.0, 0.6, 1.0])
    kwargs = dict(response_length=RESPONSE_LENGTH, pad_id=PAD, eos_id=EOS)
    batch = generate_jit(lm, params, context, keys, temperature=temperature, top_p=top_p, **kwargs)
    for row in range(context.shape[0]):
        alone = generate_jit(
            lm,
            params,
            context[row : row + 1],
            keys[row : row + 1],
            temperature=temperature[row : row + 1],
            top_p=top_p[row : row + 1],
            **kwargs,
        )
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row])
    tokens, mask = np.asarray(batch.tokens), np.asarray(batch.mask)
    scores = score_jit(lm, params, context, batch.tokens, PAD, EOS)
    np.testing.assert_allclose(batch.log_probs, scores.log_probs, atol=1e-5)
    # The policy's logits before each response token, as `score` reads them.
    logits, _ = lm.apply(
        params,
        jnp.concatenate([context, batch.tokens], axis=1),
        jnp.concatenate([context != PAD, mask > 0], axis=1),
        slice(context.shape[1] - 1, context.shape[1] + RESPONSE_LENGTH - 1),
    )
    logits = np.asarray(logits).copy()
    logits[..., PAD] = -1e30
    for row, (t, p) in enumerate(zip([1.0, 0.5, 2.0, 1e-4], [1.0, 1.0, 0.6, 1.0], strict=True)):
        drawn_from = _numpy_nucleus(logits[row] / np.float32(t), p).astype(np.float64)
        log_policy = drawn_from - np.logaddexp.reduce(drawn_from, axis=-1, keepdims=True)
        want = np.take_along_axis(log_policy, tokens[row][:, None], axis=-1)[:, 0] * mask[row]
        np.testing.assert_allclose(batch.sampler_log_probs[row], want, atol=2e-4)
    # Row 3 (temperature 0) is greedy: each token its step's most likely one.
    real = mask[3] > 0
    np.testing.assert_array_equal(tokens[3][real], logits[3].argmax(-1)[real])
    assert not np.allclose(batch.sampler_log_probs[1], batch.log_probs[1])


def test_sampling_draws_what_jax_random_categorical_draws() -> None:
    """The same token for the same key, with masked (-inf) entries, a flat row (the noise alone
    decides), a certain token, and a vocabulary of SmolLM2's size."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(16, 49152)).astype(np.float32)
    logits[:, :100] = -np.inf
    logits[3] = 0.0
    logits[5, 7] = 50.0  # one certain token
    sample = jax.jit(sample_categorical)
    reference = jax.jit(lambda key, x: jax.random.categorical(key, x, axis=-1))
    for seed in range(20):
        key = jax.random.key(seed)
        got = np.asarray(sample(key, logits))
        np.testing.assert_array_equal(got, np.asarray(reference(key, logits)))
        masked_rows = np.delete(got, [3, 5])
        assert got.dtype == np.int32 and got[5] == 7 and np.all(masked_rows >= 100)


def test_nan_logits_draw_an_id_in_range() -> None:
    """A NaN policy must not hand the env id V: a row of NaN logits, or a row with one NaN, draws
    its first NaN (the PAD entry masked to a finite score is never it), as
    `jax.random.categorical` does; rows without NaN are unchanged."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, VOCAB)).astype(np.float32)
    logits[0] = np.nan
    logits[1, 17] = np.nan
    logits[2] = np.nan
    logits[2, :3] = -1e30  # as `policy_logits` masks PAD
    logits[3, :] = -np.inf
    sample = jax.jit(sample_categorical)
    reference = jax.jit(lambda key, x: jax.random.categorical(key, x, axis=-1))
    for seed in range(5):
        key = jax.random.key(seed)
        got = np.asarray(sample(key, logits))
        np.testing.assert_array_equal(got, np.asarray(reference(key, logits)))
        assert got[:3].tolist() == [0, 17, 3]
        assert np.all((got >= 0) & (got < VOCAB))


def test_a_nan_policy_generates_ids_in_range_and_nan_log_probs() -> None:
    """Generation from NaN parameters gives the env valid ids and the learner NaN log-probs and
    values, which its non-finite guard stops on."""
    lm = make_language_model(language_model_spec("tiny", VOCAB))
    params = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), lm.init(jax.random.key(0)))
    out = generate_jit(
        lm,
        params,
        jnp.asarray(padded_contexts()),
        jax.random.key(1),
        response_length=4,
        pad_id=PAD,
        eos_id=EOS,
    )
    tokens = np.asarray(out.tokens)
    assert np.all((tokens >= 0) & (tokens < VOCAB) & (tokens != PAD)), tokens
    assert np.all(np.isnan(np.asarray(out.log_probs)[:, 0]))
    assert np.all(np.isnan(np.asarray(out.values)[:, 0]))


def test_generation_stops_once_every_row_has_answered() -> None:
    """Decoding ends with the longest answer, not after `response_length` tokens; the steps not
    run are the fill a finished row emits."""
    base = make_language_model(language_model_spec("tiny", VOCAB))
    params = sharpened(base, seed=11)
    eos_row = params["policy"]["token_embedding"][EOS]
    params["policy"]["final_norm"]["bias"] += 2.0 * eos_row / np.dot(eos_row, eos_row)
    decodes = []

    def counted_decode(*args, **kwargs):
        jax.debug.callback(lambda: decodes.append(1))
        return base.decode(*args, **kwargs)

    lm = base._replace(decode=counted_decode)
    context = jnp.asarray(padded_contexts())
    key = jax.random.key(5)
    free = generate_jit(
        lm, params, context, key, response_length=RESPONSE_LENGTH, pad_id=PAD, eos_id=EOS
    )
    longest = int(np.asarray(free.mask).sum(axis=1).max())
    assert len(decodes) == longest, (len(decodes), longest)
    assert 1 < longest < RESPONSE_LENGTH  # the case is not degenerate: some rows end early
    tail = np.asarray(free.tokens)[:, longest:]
    np.testing.assert_array_equal(tail, PAD)
    np.testing.assert_array_equal(np.asarray(free.mask)[:, longest:], 0.0)
    np.testing.assert_array_equal(np.asarray(free.log_probs)[:, longest:], 0.0)


def test_a_rows_token_limit_ends_it_with_the_tokens_it_gets_without_one() -> None:
    """`max_new_tokens` per row (a request's `max_tokens`): each row keeps the first tokens of
    its unlimited answer, up to its limit, and decoding stops at the largest limit instead of
    the longest answer."""
    base = make_language_model(language_model_spec("tiny", VOCAB))
    params = sharpened(base, seed=11)  # EOS about one step in seven: answers of mixed lengths
    decodes = []

    def counted_decode(*args, **kwargs):
        jax.debug.callback(lambda: decodes.append(1))
        return base.decode(*args, **kwargs)

    lm = base._replace(decode=counted_decode)
    context, key = jnp.asarray(padded_contexts()), jax.random.key(5)
    settings = dict(response_length=RESPONSE_LENGTH, pad_id=PAD, eos_id=EOS)
    free = generate_jit(lm, params, context, key, **settings)
    lengths = np.asarray(free.mask).sum(axis=1).astype(int)
    limits = np.array([1, 3, 2, RESPONSE_LENGTH], np.int32)[: len(lengths)]
    decodes.clear()
    limited = generate_jit(lm, params, context, key, max_new_tokens=limits, **settings)
    kept = np.minimum(lengths, limits)
    assert np.any(kept < lengths)  # some row is cut by its limit
    steps = np.arange(RESPONSE_LENGTH)[None, :]
    within = steps < kept[:, None]
    for field in ("tokens", "log_probs", "sampler_log_probs", "values"):
        got, whole = np.asarray(getattr(limited, field)), np.asarray(getattr(free, field))
        np.testing.assert_array_equal(got[within], whole[within], err_msg=field)
    np.testing.assert_array_equal(np.asarray(limited.tokens)[~within], PAD)
    np.testing.assert_array_equal(np.asarray(limited.mask), within.astype(np.float32))
    assert len(decodes) == kept.max(), (len(decodes), kept)
    uncached = generate_jit(
        lm, params, context, key, max_new_tokens=limits, use_cache=False, **settings
    )
    np.testing.assert_array_equal(np.asarray(uncached.tokens), np.asarray(limited.tokens))
    # Every row limited below its answer: the loop ends at the largest limit.
    decodes.clear()
    short = generate_jit(lm, params, context, key, max_new_tokens=2, **settings)
    np.testing.assert_array_equal(np.asarray(short.mask).sum(axis=1), np.minimum(lengths, 2))
    assert len(decodes) == 2


@pytest.mark.parametrize("raw", [False, True], ids=["typed_keys", "raw_keys"])
def test_a_key_per_row_draws_what_each_row_alone_would(raw: bool) -> None:
    """Env ranks and the central server key each env's answer by the env, not by the batch it
    is answered in: one batched generation with a key per row gives every row the answer it
    would get alone."""
    lm = make_language_model(language_model_spec("tiny", VOCAB))
    params = sharpened(lm, seed=11)
    context = jnp.asarray(padded_contexts())
    keys = (
        jax.random.split(jax.random.PRNGKey(9), 4)
        if raw
        else jax.random.split(jax.random.key(9), 4)
    )
    settings = dict(response_length=RESPONSE_LENGTH, pad_id=PAD, eos_id=EOS)
    batched = generate_jit(lm, params, context, keys, **settings)
    assert len({tuple(row) for row in np.asarray(batched.tokens)}) == 4
    for row in range(4):
        alone = generate_jit(lm, params, context[row : row + 1], keys[row], **settings)
        np.testing.assert_array_equal(batched.tokens[row], alone.tokens[0])
        np.testing.assert_allclose(batched.log_probs[row], alone.log_probs[0], atol=1e-5)
        np.testing.assert_allclose(batched.values[row], alone.values[0], atol=1e-5)


def test_response_mask_ends_after_the_first_eos() -> None:
    response = jnp.array([[5, EOS, PAD, PAD], [EOS, 3, EOS, PAD], [1, 2, 3, 4]])
    expected = [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    np.testing.assert_array_equal(response_mask(response, EOS), expected)


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_left_padding_does_not_change_outputs(critic: str) -> None:
    lm = make_language_model(language_model_spec("tiny", VOCAB, critic=critic))
    params = sharpened(lm, seed=21)
    row = np.array([BOS, 10, 200, 33, 7], np.int32)
    tokens = np.full((2, 9), PAD, np.int32)
    tokens[0, 4:] = row
    tokens[1, 1:6] = row  # more padding on the left, and padding after the row
    mask = np.zeros((2, 9), np.int32)
    mask[0, 4:] = 1
    mask[1, 1:6] = 1
    logits, values = jax.jit(lm.apply)(params, tokens, mask)
    np.testing.assert_allclose(logits[1, 1:6], logits[0, 4:], atol=1e-4)
    np.testing.assert_allclose(values[1, 1:6], values[0, 4:], atol=1e-5)
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(values))
    # Positions matter, so the equality above is not trivially true of any model.
    shifted, _ = lm.apply(params, tokens[:1, 1:6], np.ones((1, 5), np.int32))
    unshifted, _ = lm.apply(params, tokens[:1, 4:], np.ones((1, 5), np.int32))
    np.testing.assert_allclose(unshifted[0], logits[0, 4:], atol=1e-4)
    assert np.abs(np.asarray(shifted) - np.asarray(unshifted)).max() > 0.1


@pytest.mark.slow
def test_changing_a_later_token_leaves_earlier_outputs() -> None:
    lm = make_language_model(language_model_spec("tiny", VOCAB, critic="separate"))
    params = sharpened(lm, seed=31)
    tokens = np.array([[BOS, 4, 90, 17, 250, 3, 61, 8]], np.int32)
    changed = tokens.copy()
    changed[0, 5] = 199
    mask = np.ones_like(tokens)
    logits, values = lm.apply(params, tokens, mask)
    logits_changed, values_changed = lm.apply(params, changed, mask)
    np.testing.assert_array_equal(logits[:, :5], logits_changed[:, :5])
    np.testing.assert_array_equal(values[:, :5], values_changed[:, :5])
    assert np.abs(np.asarray(logits[:, 5:]) - np.asarray(logits_changed[:, 5:])).min() > 0
    assert np.all(np.asarray(values[:, 5:]) != np.asarray(values_changed[:, 5:]))


@pytest.mark.slow
def test_init_is_a_pure_function_of_the_key() -> None:
    lm = make_language_model(language_model_spec("tiny", VOCAB))
    first, again = lm.init(jax.random.key(0)), lm.init(jax.random.key(0))
    other = lm.init(jax.random.key(1))
    shapes = lm.param_shapes()
    assert jax.tree.structure(first) == jax.tree.structure(shapes)
    for leaf, twin, shape in zip(
        jax.tree.leaves(first), jax.tree.leaves(again), jax.tree.leaves(shapes), strict=True
    ):
        assert leaf.shape == shape.shape and leaf.dtype == np.float32
        np.testing.assert_array_equal(leaf, twin)
    kernel = first["policy"]["block_0"]["qkv"]["kernel"]
    assert abs(float(np.std(kernel)) - 0.02) < 0.002
    assert not np.array_equal(kernel, other["policy"]["block_0"]["qkv"]["kernel"])
    np.testing.assert_array_equal(first["policy"]["block_0"]["mlp_norm"]["scale"], 1.0)
    _, values = lm.apply(first, np.full((2, 6), 5, np.int32), np.ones((2, 6), np.int32))
    assert np.abs(np.asarray(values)).max() < 0.1


@pytest.mark.parametrize(
    ("size", "low", "high"),
    [("tiny", 1e5, 5e5), ("small", 2e6, 1e7), ("base", 9e7, 1.2e8), ("large", 0.9e9, 1.2e9)],
)
def test_preset_parameter_counts(size: str, low: float, high: float) -> None:
    shared = count_params(make_language_model(language_model_spec(size, VOCAB)).param_shapes())
    separate = count_params(
        make_language_model(language_model_spec(size, VOCAB, critic="separate")).param_shapes()
    )
    assert low <= shared <= high
    d_model = LM_SIZES[size]["d_model"]
    assert separate == 2 * shared - (d_model + 1)  # a second trunk, still one value head


@pytest.mark.parametrize("size", ["tiny", "base"])
def test_every_matrix_shards_under_the_fsdp_rule(size: str) -> None:
    for critic in ("shared", "separate"):
        shapes = make_language_model(language_model_spec(size, VOCAB, critic=critic)).param_shapes()
        matrices = [leaf.shape for leaf in jax.tree.leaves(shapes) if len(leaf.shape) >= 2]
        assert len(matrices) >= 4 * LM_SIZES[size]["num_layers"]  # qkv, out, mlp in and out
        assert all(max(shape) % 4 == 0 for shape in matrices)
        check_model_axis_divides(shapes, 4)
        if size == "base":
            check_model_axis_divides(shapes, 8)
        else:
            # The vocabulary (260) is the tiny embedding's largest dimension; 8 does not divide it.
            with pytest.raises(MeshError, match="token_embedding"):
                check_model_axis_divides(shapes, 8)


def test_pretrained_round_trip(tmp_path) -> None:
    lm = make_language_model(language_model_spec("tiny", VOCAB, critic="separate"))
    params = lm.init(jax.random.key(7))
    save_language_model(tmp_path / "weights", params)
    loaded = load_language_model(tmp_path / "weights", lm.param_shapes())
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    for saved, restored in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
        assert restored.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(restored), saved)
    with pytest.raises(CheckpointError, match="exists"):
        save_language_model(tmp_path / "weights", params)


def test_mismatched_checkpoints_raise(tmp_path) -> None:
    lm = make_language_model(language_model_spec("tiny", VOCAB))
    path = save_language_model(tmp_path / "weights", lm.init(jax.random.key(0)))
    wider = make_language_model(language_model_spec("tiny", VOCAB, mlp_dim=128))
    with pytest.raises(CheckpointError) as error:
        load_language_model(path, wider.param_shapes())
    message = str(error.value)
    assert "leaf ['policy']['block_0']['mlp_in']['bias'] has shape [256], expected [128]" in message
    assert str(path) in message
    separate = make_language_model(language_model_spec("tiny", VOCAB, critic="separate"))
    with pytest.raises(CheckpointError, match=r"leaf \['critic'\].* is missing"):
        load_language_model(path, separate.param_shapes())
    with pytest.raises(CheckpointError, match="not a parameter of this model"):
        load_language_model(path, {"policy": lm.param_shapes()["policy"]})
    with pytest.raises(CheckpointError, match="no language-model checkpoint"):
        load_language_model(tmp_path / "missing", lm.param_shapes())


@pytest.mark.slow
def test_bfloat16_compute_stays_close_to_float32() -> None:
    spec32 = language_model_spec("tiny", VOCAB)
    lm32 = make_language_model(spec32)
    lm16 = make_language_model(language_model_spec("tiny", VOCAB, dtype="bfloat16"))
    params = lm32.init(jax.random.key(2))
    context = jnp.asarray(padded_contexts())
    scores32 = lm32.score(params, context, context[:, ::-1], PAD, EOS)
    scores16 = lm16.score(params, context, context[:, ::-1], PAD, EOS)
    assert scores16.log_probs.dtype == jnp.float32
    np.testing.assert_allclose(scores16.log_probs, scores32.log_probs, atol=0.05)
    np.testing.assert_allclose(scores16.values, scores32.values, atol=0.01)
