"""Sampling responses from a `LanguageModel`, with or without its KV cache, as one pure function."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agentenv_jax.networks.language_model import MASKED_SCORE, LanguageModel, policy_logits

# The lowest temperature sampled at (0 asks for it): the most likely token wins unless two
# logits are within ~1e-4 of each other.
GREEDY_TEMPERATURE = 1e-4


class Generation(NamedTuple):
    """A batch of sampled responses, all `[B, M]`: `tokens` int32 (`pad_id` after a row's first
    EOS); float32 `log_probs` of each token under the policy, `values` of the state before it,
    and `mask` (1 up to and including the first EOS). `log_probs` and `values` are 0 where `mask`
    is 0. They equal `lm.score(params, context, tokens, pad_id, eos_id)`'s.
    `sampler_log_probs`: each token's log-prob under the distribution it was drawn from (the
    policy's at temperature `t` and nucleus `top_p`); `log_probs` where those are 1."""

    tokens: jax.Array
    log_probs: jax.Array
    values: jax.Array
    mask: jax.Array
    sampler_log_probs: jax.Array


def sample_categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """`jax.random.categorical(key, logits, axis=-1)`, the same draw (Gumbel noise, then the
    first index of the maximum), as two plain reductions: XLA's CPU backend fuses the noise
    into argmax's index-carrying reduction and runs it unvectorized (12 ms against 4 ms for
    `[16, 49152]` logits here, a sixth of a SmolLM2 decoding step). `logits` `[B, V]` -> `[B]`
    int32, always in `[0, V)`.

    A NaN logit (a diverged or overflowing model) counts as the largest, so a row with one draws
    its first NaN, as argmax and so `jax.random.categorical` do: an id the env can take (never
    a masked one such as PAD), while the row's log-probs, NaN too, carry the fault to the
    learner, whose non-finite guard stops the run."""
    noisy = logits + jax.random.gumbel(key, logits.shape, logits.dtype)
    # NOTE: left in, a NaN makes the maximum NaN, which equals no entry (the row got V), or,
    # in some compiled programs (the actor's, here), is passed over by the maximum (the row got
    # PAD, the largest of the rest); as +inf it is the maximum either way.
    noisy = jnp.where(jnp.isnan(noisy), jnp.inf, noisy)
    top = jnp.max(noisy, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, noisy.shape, noisy.ndim - 1)
    return jnp.min(jnp.where(noisy == top, index, logits.shape[-1]), axis=-1)


# The likeliest tokens a nucleus is first looked for among: picking them out of 16 rows of
# SmolLM2's 49,152 logits took 1/46 of the time of sorting the rows (13 against 605 ms, timed
# together on a busy 2-core CPU); only a nucleus wider than them sorts the whole vocabulary.
NUCLEUS_CANDIDATES = 256


def nucleus_logits(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """`logits` `[B, V]` with every token outside each row's nucleus masked: the fewest most
    likely tokens whose probabilities sum to at least `top_p` `[B]` (Holtzman et al., 2020),
    ties at the boundary kept. The most likely token is always kept (`top_p` 0 keeps it
    alone); `top_p` 1 keeps every token."""
    probs = jax.nn.softmax(logits, axis=-1)

    def smallest_kept(ranked: jax.Array) -> jax.Array:  # `ranked`: the likeliest, in order
        # A token ranked k is in the nucleus if the tokens ranked above it sum to less.
        inside = (jnp.cumsum(ranked, axis=-1) - ranked) < top_p[:, None]
        inside = inside.at[:, 0].set(True)
        return jnp.min(jnp.where(inside, ranked, jnp.inf), axis=-1, keepdims=True)

    candidates = jax.lax.top_k(probs, min(NUCLEUS_CANDIDATES, probs.shape[-1]))[0]
    narrow = (jnp.cumsum(candidates, axis=-1)[:, -1] >= top_p) | (top_p >= 1.0)
    threshold = jax.lax.cond(
        jnp.all(narrow),
        smallest_kept,
        lambda _: smallest_kept(-jnp.sort(-probs, axis=-1)),
        candidates,
    )
    threshold = jnp.where(top_p[:, None] >= 1.0, -jnp.inf, threshold)
    return jnp.where(probs >= threshold, logits, MASKED_SCORE)


def sampler_logits(logits: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """The logits tokens are drawn from: `logits` `[B, V]` over each row's `temperature` `[B]`,
    cut to its nucleus `top_p` `[B]` (computed only if some row's is below 1: sorting a
    vocabulary per token is costly)."""
    scaled = logits / temperature[:, None]
    return jax.lax.cond(
        jnp.all(top_p >= 1.0), lambda x: x, lambda x: nucleus_logits(x, top_p), scaled
    )


def generate(
    lm: LanguageModel,
    params: Any,
    context: jax.Array,
    key: jax.Array,
    *,
    response_length: int,
    pad_id: int,
    eos_id: int,
    temperature: float | jax.Array = 1.0,
    top_p: float | jax.Array = 1.0,
    max_new_tokens: int | jax.Array | None = None,
    use_cache: bool = True,
    slots: int | None = None,
) -> Generation:
    """Sample `response_length` (M) tokens after each row of `context` `[B, L]` (int32, left-padded
    with `pad_id`).

    Token i is drawn from `softmax(logits / temperature)`, cut to its nucleus `top_p`, with key
    `fold_in(key, i)`, on both paths, so for a fixed key the cached and uncached paths give the
    same tokens. `temperature` and `top_p` are one number for the batch or one per row (`[B]`).
    `key` is one key for the batch, or one per row (`[B]` typed keys, `[B, 2]` raw ones): then
    row b draws the noise that generating it alone with `key[b]` would, whatever rows share its
    batch, and the batch is still one computation. `log_probs` are always those of the policy
    itself (temperature 1), as `score` computes them; `sampler_log_probs` are those of the
    distribution each token was drawn from. At temperature 1 and `top_p` 1 the two agree and are
    the behaviour log-probs PPO needs; otherwise the samples are off-policy, and only
    `sampler_log_probs` make a correct importance ratio for them. `temperature` 0 (or
    below `GREEDY_TEMPERATURE`) samples at `GREEDY_TEMPERATURE`; `top_p` is in [0, 1] (0 keeps
    the most likely token alone). `max_new_tokens` (one number, or one per row `[B]`; default
    `response_length`) ends a row after that many tokens as its EOS would: the tokens it gets
    are the first ones it gets without the limit, and decoding stops once every row has ended
    one way or the other, so a batch of rows asked for few tokens costs few steps.

    `use_cache=True`: one `prefill` of the context into a KV cache of length L + M, then one
    `decode` per token in a `lax.while_loop` that ends when every row has emitted EOS (or after
    M tokens). `use_cache=False`: each step reruns `apply` over the whole
    `[B, L + M]` buffer (the tokens so far, the rest masked) — the reference the cache is tested
    against. After a row's first EOS it emits `pad_id`, with log-prob, value and mask 0.

    `slots` (S < B, with the cache and a key per row): continuous batching. S rows decode at
    a time, each at its own step, in a KV cache of S rows; a row that ends hands its slot to
    the next row waiting, whose context is prefilled into it inside the same loop, so the
    decode steps run while any row is answering rather than each batch of S to its longest.
    Each row gets the tokens it gets generated alone with its key (up to float rounding).

    Jit with `lm`, `response_length`, `pad_id`, `eos_id`, `use_cache` and `slots` static.
    """
    batch, context_length = context.shape
    # The policy's own distribution (a Python 1.0 for both): its log-probs are the sampler's.
    plain = all(isinstance(x, int | float) and x == 1.0 for x in (temperature, top_p))
    sampling = _row_sampling(key, temperature, top_p, max_new_tokens, batch, response_length)
    emit, ended = _emitter(sampling, pad_id, eos_id, plain)

    if slots is not None and slots < batch:
        if not (use_cache and sampling.per_row_keys):
            raise ValueError("generate(slots=...) needs use_cache=True and a key per row")
        return _generate_in_slots(
            lm, params, context, slots, response_length, pad_id, emit, ended, sampling.limit
        )
    if use_cache:
        state = _prefilled_state(lm, params, context, sampling, response_length, pad_id, 0)
        state = _decode_until(lm, params, state, response_length, emit, ended, 0)
        return decoded(state)

    # Steps run while a row is still answering, at most `response_length` (see
    # `_decode_until`): the steps skipped would emit pad_id with log-prob, value and mask 0.
    tokens = jnp.concatenate(
        [context, jnp.full((batch, response_length), pad_id, context.dtype)], axis=1
    ).astype(jnp.int32)
    mask = jnp.concatenate(
        [(context != pad_id).astype(jnp.int32), jnp.zeros((batch, response_length), jnp.int32)],
        axis=1,
    )

    def uncached_step(carry: tuple) -> tuple:
        step, done, outputs, tokens, mask = carry
        all_logits, all_values = lm.apply(params, tokens, mask)
        here = context_length - 1 + step  # the position that predicts token `step`
        logits = jax.lax.dynamic_index_in_dim(all_logits, here, axis=1, keepdims=False)
        value = jax.lax.dynamic_index_in_dim(all_values, here, axis=1, keepdims=False)
        token, log_prob, sampler_log_prob, value, alive = emit(step, logits, value, done)
        at = (0, context_length + step)
        tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], at)
        mask = jax.lax.dynamic_update_slice(mask, alive.astype(jnp.int32)[:, None], at)
        outputs = _record(outputs, step, (token, log_prob, sampler_log_prob, value, alive))
        return step + 1, done | ended(step, token), outputs, tokens, mask

    def answering(carry: tuple) -> jax.Array:
        step, done = carry[0], carry[1]
        return (step < response_length) & ~jnp.all(done)

    start = jnp.zeros((), jnp.int32)
    done = jnp.zeros((batch,), bool)
    carry = (start, done, _empty_outputs(response_length, batch, pad_id), tokens, mask)
    _, _, outputs, *_ = jax.lax.while_loop(answering, uncached_step, carry)
    return _generation(tuple(x.T for x in outputs))  # written [M, B], step by step


class RowSampling(NamedTuple):
    """How each of a generation's B rows samples: its key (`key` one for the batch, or one per
    row), temperature, top_p and most tokens, all `[B]`."""

    key: jax.Array
    temperature: jax.Array
    top_p: jax.Array
    limit: jax.Array

    @property
    def per_row_keys(self) -> bool:
        """A key per row: `[B]` typed keys or `[B, 2]` raw ones (`jax.random.PRNGKey`)."""
        typed = jnp.issubdtype(self.key.dtype, jax.dtypes.prng_key)
        return self.key.ndim == (1 if typed else 2)


def _row_sampling(
    key: jax.Array,
    temperature: float | jax.Array,
    top_p: float | jax.Array,
    max_new_tokens: int | jax.Array | None,
    batch: int,
    response_length: int,
) -> RowSampling:
    return RowSampling(
        key=key,
        temperature=jnp.broadcast_to(
            jnp.maximum(jnp.asarray(temperature, jnp.float32), GREEDY_TEMPERATURE), (batch,)
        ),
        top_p=jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (batch,)),
        limit=jnp.broadcast_to(
            jnp.asarray(response_length if max_new_tokens is None else max_new_tokens, jnp.int32),
            (batch,),
        ),
    )


def _emitter(sampling: RowSampling, pad_id: int, eos_id: int, plain: bool) -> tuple:
    """`(emit, ended)` of a generation sampling as `sampling` says (`plain`: every row at
    temperature 1 and top_p 1, known when tracing)."""
    key, per_row_keys = sampling.key, sampling.per_row_keys

    def ended(step: jax.Array, token: jax.Array, row_limit: jax.Array = sampling.limit):
        """Rows whose token `step` (just emitted; one step, or each row's) ends them: EOS, or
        their last allowed."""
        return (token == eos_id) | (step + 1 >= row_limit)

    def emit(
        step: jax.Array,
        logits: jax.Array,
        value: jax.Array,
        done: jax.Array,
        rows: jax.Array | None = None,
    ) -> tuple:
        """Sample token `step` from `logits` `[B, V]`: `(token, log_prob, sampler log_prob,
        value, alive)`. `rows` `[S]`: the rows whose keys and settings the S logits' rows
        take, each at its own `step` `[S]` (continuous batching's slots); None: row b's."""
        row_keys, row_temperature, row_top_p = key, sampling.temperature, sampling.top_p
        if rows is not None:
            row_keys, row_temperature, row_top_p = key[rows], row_temperature[rows], row_top_p[rows]
        logits = policy_logits(logits, pad_id)
        drawn_from = logits if plain else sampler_logits(logits, row_temperature, row_top_p)
        if per_row_keys:  # each row's draw as generating that row alone would make it
            sampled = jax.vmap(
                lambda row_key, row_step, row: sample_categorical(
                    jax.random.fold_in(row_key, row_step), row[None]
                )[0]
            )(row_keys, jnp.broadcast_to(step, drawn_from.shape[:1]), drawn_from)
        else:
            sampled = sample_categorical(jax.random.fold_in(key, step), drawn_from)

        def log_prob_of(x: jax.Array) -> jax.Array:
            return jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), sampled[:, None], axis=-1)[
                :, 0
            ]

        log_prob = log_prob_of(logits)
        if plain:
            sampler_log_prob = log_prob
        else:  # a second log-softmax only where some row samples otherwise
            sampler_log_prob = jax.lax.cond(
                jnp.all((row_temperature == 1.0) & (row_top_p >= 1.0)),
                lambda: log_prob,
                lambda: log_prob_of(drawn_from),
            )
        alive = ~done
        return (
            jnp.where(alive, sampled, pad_id).astype(jnp.int32),
            jnp.where(alive, log_prob, 0.0),
            jnp.where(alive, sampler_log_prob, 0.0),
            jnp.where(alive, value, 0.0),
            alive,
        )

    return emit, ended


def _empty_outputs(response_length: int, batch: int, pad_id: int) -> tuple:
    """`(tokens, log_probs, sampler_log_probs, values, alive)`, each `[M, B]`: the fill of the
    steps no row decodes (PAD, with log-prob, value and mask 0)."""
    return (
        jnp.full((response_length, batch), pad_id, jnp.int32),
        jnp.zeros((response_length, batch), jnp.float32),
        jnp.zeros((response_length, batch), jnp.float32),
        jnp.zeros((response_length, batch), jnp.float32),
        jnp.zeros((response_length, batch), bool),
    )


def _generation(outputs: tuple) -> Generation:
    """The `Generation` of outputs `(tokens, log_probs, sampler_log_probs, values, alive)`,
    each `[B, M]`."""
    tokens, log_probs, sampler_log_probs, values, alive = outputs
    return Generation(
        tokens=tokens,
        log_probs=log_probs,
        values=values.astype(jnp.float32),
        mask=alive.astype(jnp.float32),
        sampler_log_probs=sampler_log_probs,
    )


def _record(outputs: tuple, step: jax.Array, emitted: tuple) -> tuple:
    return tuple(
        jax.lax.dynamic_update_index_in_dim(out, new.astype(out.dtype), step, axis=0)
        for out, new in zip(outputs, emitted, strict=True)
    )


class DecodingState(NamedTuple):
    """A KV-cached generation between calls (`start_decoding`, `continue_decoding`): `step`
    tokens decoded so far, the rows `done`, the outputs so far `[M, B]` (tokens, log-probs,
    sampler log-probs, values, alive) and each token's parameter `versions` `[M, B]` int32,
    the cache, the logits and value `[B]` the next token is drawn from and the version of the
    parameters that computed them, and the rows' sampling."""

    step: jax.Array
    done: jax.Array
    outputs: tuple
    versions: jax.Array
    cache: Any
    logits: jax.Array
    value: jax.Array
    logits_version: jax.Array
    sampling: RowSampling

    @property
    def context_length(self) -> int:
        """L: the cache holds the context and the M tokens of the response."""
        return self.cache.mask.shape[1] - self.outputs[0].shape[0]


def _prefilled_state(
    lm: LanguageModel,
    params: Any,
    context: jax.Array,
    sampling: RowSampling,
    response_length: int,
    pad_id: int,
    version: int | jax.Array,
) -> DecodingState:
    batch, context_length = context.shape
    cache = lm.init_cache(batch, context_length + response_length)
    context_mask = (context != pad_id).astype(jnp.int32)
    cache, logits, value = lm.prefill(params, context, context_mask, cache)
    return DecodingState(
        step=jnp.zeros((), jnp.int32),
        done=jnp.zeros((batch,), bool),
        outputs=_empty_outputs(response_length, batch, pad_id),
        versions=jnp.full((response_length, batch), -1, jnp.int32),
        cache=cache,
        logits=logits,
        value=value,
        logits_version=jnp.asarray(version, jnp.int32),
        sampling=sampling,
    )


def _decode_until(
    lm: LanguageModel,
    params: Any,
    state: DecodingState,
    stop: int | jax.Array,
    emit: Any,
    ended: Any,
    version: int | jax.Array,
) -> DecodingState:
    """`state` decoded by `params` (of `version`) while a row is still answering, up to token
    `stop` (at most the response length): a batch of short answers ("5<|im_end|>") stops after
    its longest one instead of decoding M tokens. Each token is drawn from the logits of the
    step before, so it carries the version of the parameters that computed them."""
    response_length = state.outputs[0].shape[0]
    version = jnp.asarray(version, jnp.int32)

    def answering(carry: tuple) -> jax.Array:
        step, done = carry[0], carry[1]
        return (step < jnp.minimum(stop, response_length)) & ~jnp.all(done)

    def cached_step(carry: tuple) -> tuple:
        step, done, outputs, versions, cache, logits, value, logits_version = carry
        token, log_prob, sampler_log_prob, value, alive = emit(step, logits, value, done)
        # The decode after the last token is wasted work, but keeps every step the same
        # program (the cache has room for it: slot L + M - 1).
        cache, logits, next_value = lm.decode(
            params, cache, token, state.context_length + step, alive
        )
        outputs = _record(outputs, step, (token, log_prob, sampler_log_prob, value, alive))
        versions = jax.lax.dynamic_update_index_in_dim(
            versions, jnp.where(alive, logits_version, -1), step, axis=0
        )
        done = done | ended(step, token)
        return step + 1, done, outputs, versions, cache, logits, next_value, version

    carry = (
        state.step,
        state.done,
        state.outputs,
        state.versions,
        state.cache,
        state.logits,
        state.value,
        state.logits_version,
    )
    step, done, outputs, versions, cache, logits, value, logits_version = jax.lax.while_loop(
        answering, cached_step, carry
    )
    return state._replace(
        step=step,
        done=done,
        outputs=outputs,
        versions=versions,
        cache=cache,
        logits=logits,
        value=value,
        logits_version=logits_version,
    )


def decoded(state: DecodingState) -> Generation:
    """The `Generation` of the tokens `state` holds (its outputs, written `[M, B]` step by
    step); `decoded_versions(state)` gives each token's parameter version."""
    return _generation(tuple(x.T for x in state.outputs))


def decoded_versions(state: DecodingState) -> jax.Array:
    """`int32 [B, M]`: the version of the parameters that computed each token's distribution
    (-1 after a row's end)."""
    return state.versions.T


def start_decoding(
    lm: LanguageModel,
    params: Any,
    context: jax.Array,
    key: jax.Array,
    *,
    response_length: int,
    pad_id: int,
    temperature: float | jax.Array = 1.0,
    top_p: float | jax.Array = 1.0,
    max_new_tokens: int | jax.Array | None = None,
    version: int | jax.Array = 0,
) -> DecodingState:
    """The first half of `generate`'s cached path, for a generation decoded in parts
    (`continue_decoding`) whose parameters may change between them: `context` prefilled by
    `params` (of `version`), nothing decoded yet. The arguments are `generate`'s."""
    sampling = _row_sampling(
        key, temperature, top_p, max_new_tokens, context.shape[0], response_length
    )
    return _prefilled_state(lm, params, context, sampling, response_length, pad_id, version)


def continue_decoding(
    lm: LanguageModel,
    params: Any,
    state: DecodingState,
    *,
    steps: int | jax.Array,
    pad_id: int,
    eos_id: int,
    version: int | jax.Array,
) -> DecodingState:
    """`state` decoded for up to `steps` more tokens by `params` of `version` (or until every
    row has ended). Parameters that change between parts (a partial rollout: the answers in
    flight continue under new parameters) keep the cache the earlier ones wrote; each token
    keeps the log-prob and the version of the parameters whose logits it was drawn from (the
    first token of a part, the previous part's). Undivided (`steps` = M), a generation gives
    `generate`'s tokens, log-probs and values. Jit with `lm`, `pad_id` and `eos_id` static."""
    emit, ended = _emitter(state.sampling, pad_id, eos_id, plain=False)
    return _decode_until(lm, params, state, state.step + steps, emit, ended, version)


def _generate_in_slots(
    lm: LanguageModel,
    params: Any,
    context: jax.Array,
    slots: int,
    response_length: int,
    pad_id: int,
    emit: Any,
    ended: Any,
    limit: jax.Array,
) -> Generation:
    """`generate`'s continuous batching: the B rows of `context` through `slots` (S) rows of
    KV cache, `emit` and `ended` being `generate`'s for the whole batch (`emit` takes the rows
    a slot holds)."""
    from agentenv_jax.networks.language_model import cache_row

    batch, context_length = context.shape
    total = context_length + response_length
    context_mask = (context != pad_id).astype(jnp.int32)
    none = batch  # a slot's row when it holds none (past the last row)

    # The first S rows, prefilled together.
    cache = lm.init_cache(slots, total)
    cache, logits, value = lm.prefill(params, context[:slots], context_mask[:slots], cache)
    slot_row = jnp.arange(slots, dtype=jnp.int32)
    slot_step = jnp.zeros((slots,), jnp.int32)
    # [B, M]: written at each slot's row and step.
    outputs = tuple(x.T for x in _empty_outputs(response_length, batch, pad_id))

    def refill(state: tuple) -> tuple:
        """The next waiting row prefilled into the first free slot."""
        slot_row, slot_step, next_row, free, cache, logits, value = state
        slot = jnp.argmax(free)
        one = lm.init_cache(1, total)
        row_tokens = jax.lax.dynamic_slice_in_dim(context, next_row, 1)
        row_mask = jax.lax.dynamic_slice_in_dim(context_mask, next_row, 1)
        one, row_logits, row_value = lm.prefill(params, row_tokens, row_mask, one)
        return (
            slot_row.at[slot].set(next_row),
            slot_step.at[slot].set(0),
            next_row + 1,
            free.at[slot].set(False),
            cache_row(cache, slot, one),
            logits.at[slot].set(row_logits[0]),
            value.at[slot].set(row_value[0]),
        )

    def can_refill(state: tuple) -> jax.Array:
        next_row, free = state[2], state[3]
        return (next_row < batch) & jnp.any(free)

    def step(carry: tuple) -> tuple:
        slot_row, slot_step, next_row, outputs, cache, logits, value = carry
        active = slot_row < none
        rows = jnp.minimum(slot_row, batch - 1)
        emitted = emit(slot_step, logits, value, ~active, rows)
        # Written at (row, step) of the slots holding a row; a free slot's write is dropped.
        at = (jnp.where(active, slot_row, none), slot_step)
        outputs = tuple(
            out.at[at].set(new.astype(out.dtype), mode="drop")
            for out, new in zip(outputs, emitted, strict=True)
        )
        token = emitted[0]
        # (A free slot's step runs on; its writes stay inside the cache until a row replaces
        # them.)
        index = context_length + jnp.minimum(slot_step, response_length - 1)
        cache, logits, value = lm.decode(params, cache, token, index, active)
        finished = active & ended(slot_step, token, limit[rows])
        slot_row = jnp.where(finished, none, slot_row)
        slot_step = slot_step + 1
        state = (slot_row, slot_step, next_row, slot_row == none, cache, logits, value)
        slot_row, slot_step, next_row, _, cache, logits, value = jax.lax.while_loop(
            can_refill, refill, state
        )
        return slot_row, slot_step, next_row, outputs, cache, logits, value

    def answering(carry: tuple) -> jax.Array:
        return jnp.any(carry[0] < none)

    carry = (slot_row, slot_step, jnp.int32(slots), outputs, cache, logits, value)
    return _generation(jax.lax.while_loop(answering, step, carry)[3])
