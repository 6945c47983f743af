"""A decoder-only transformer actor-critic over token ids, with a KV cache for generation.

The model is written as pure functions over a nested dict of parameters rather than as flax
modules: generation threads an explicit KV cache through `prefill` and `decode` (flax would keep
it in a mutable `cache` collection), and every parameter's shape and initializer is a static
table (`_param_table`), so `param_shapes` needs no trace at all and `init` draws the values on
the host in numpy, seeded by the key and each parameter's path, as `networks.initializers` does
for the other networks: initializing compiles nothing.

Architecture: learned token and position embeddings, pre-LayerNorm blocks of causal multi-head
self-attention and a GELU MLP, a final LayerNorm, and an LM head *tied* to the token embedding
(`logits = hidden @ token_embedding.T`). Every kernel is a 2-D `[in, out]` matrix (qkv
`[d, 3d]`, attention out `[d, d]`, MLP `[d, mlp]` and `[mlp, d]`) so the FSDP rule of
`parallel.partitioning` shards each along a dimension the layer widths make divisible. With
`critic="shared"` the value head reads the policy trunk's final hidden state; with "separate" a
second trunk of the same size (its own embeddings; its LM head is never used) feeds it, so the
policy trunk gets no value gradient.

Token conventions: a context `[B, L]` is left-padded (newest token at L-1, at least one real
token per row); positions are `cumsum(mask) - 1`, so left padding does not shift them. A response
`[B, M]` ends at its first EOS (which counts as a response token) and is padded after it.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.networks.packing import PackedRows, segment_allowed, segment_positions

Params = dict[str, Any]

# Presets of the trunk's dimensions (the vocabulary comes from the tokenizer). Every width is a
# multiple of 8 so a 4- or 8-way `model` mesh axis divides each matrix's largest dimension (the
# embedding's largest is the vocabulary when it exceeds d_model: 260 for the byte tokenizer,
# which 4 divides and 8 does not). Parameter counts at vocab 260, shared critic: tiny 1.3e5,
# small 3.3e6, base 1.0e8, large 1.0e9 (which needs a model-sharded mesh to train).
LM_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 64, "num_layers": 2, "num_heads": 4, "mlp_dim": 256, "max_length": 256},
    "small": {"d_model": 256, "num_layers": 4, "num_heads": 8, "mlp_dim": 1024, "max_length": 512},
    "base": {
        "d_model": 768,
        "num_layers": 14,
        "num_heads": 12,
        "mlp_dim": 3072,
        "max_length": 1024,
    },
    "large": {
        "d_model": 2048,
        "num_layers": 20,
        "num_heads": 16,
        "mlp_dim": 8192,
        "max_length": 2048,
    },
}

_DTYPES = ("float32", "bfloat16", "float16")
_INIT_STD = 0.02  # GPT-2's kernel and embedding scale
MASKED_SCORE = -1e30  # finite, so a query with no key to attend to gets finite (uniform) weights
_NORM_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class LanguageModelSpec:
    """The static shape of a `LanguageModel`."""

    vocab_size: int  # token ids are int32 in [0, vocab_size)
    max_length: int  # rows of the position embedding: the longest sequence (context + response)
    d_model: int  # width of the residual stream
    num_layers: int  # transformer blocks per trunk
    num_heads: int  # attention heads (must divide d_model)
    mlp_dim: int  # hidden width of each block's MLP
    critic: Literal["shared", "separate"]  # value head on the policy trunk, or on its own trunk
    dtype: str = "float32"  # compute dtype of the matmuls, whatever the parameters are kept in

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_length", "d_model", "num_layers", "num_heads", "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"LanguageModelSpec.{name} must be >= 1, got {getattr(self, name)}"
                )
        if self.d_model % self.num_heads:
            raise ValueError(
                f"LanguageModelSpec.num_heads = {self.num_heads} must divide "
                f"d_model = {self.d_model}"
            )
        if self.critic not in ("shared", "separate"):
            raise ValueError(
                f"LanguageModelSpec.critic must be shared or separate, got {self.critic!r}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"LanguageModelSpec.dtype must be one of {_DTYPES}, got {self.dtype!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def trunks(self) -> tuple[str, ...]:
        """The parameter groups holding a transformer trunk (each has its own KV cache)."""
        return ("policy", "critic") if self.critic == "separate" else ("policy",)


def language_model_spec(
    size: str,
    vocab_size: int,
    critic: Literal["shared", "separate"] = "shared",
    dtype: str = "float32",
    **overrides: int,
) -> LanguageModelSpec:
    """The spec of preset `size` (a key of `LM_SIZES`), with `overrides` of its dimensions
    (`d_model`, `num_layers`, `num_heads`, `mlp_dim`, `max_length`)."""
    if size not in LM_SIZES:
        raise ValueError(f"unknown language-model size {size!r}; choose one of {list(LM_SIZES)}")
    unknown = set(overrides) - set(LM_SIZES[size])
    if unknown:
        raise ValueError(f"unknown language-model dimensions {sorted(unknown)}")
    dims = {**LM_SIZES[size], **overrides}
    return LanguageModelSpec(vocab_size=vocab_size, critic=critic, dtype=dtype, **dims)


class KVCache(NamedTuple):
    """Keys and values of the tokens seen so far, per trunk (`"policy"`, and `"critic"` with a
    separate critic): `[num_layers, B, length, num_heads, head_dim]` in the compute dtype; and
    `mask` `[B, length]` int32, 1 at the slots that hold real tokens."""

    keys: dict[str, jax.Array]
    values: dict[str, jax.Array]
    mask: jax.Array


class TokenScores(NamedTuple):
    """Per-token outputs of `score`, all `[B, M]` float32 and 0 where `mask` is 0: `log_probs` of
    each response token, `values` of the state before it, `entropy` of the policy there."""

    log_probs: jax.Array
    values: jax.Array
    entropy: jax.Array
    mask: jax.Array


class LanguageModel(NamedTuple):
    """Pure functions of a decoder-only actor-critic (made by `make_language_model`).

    - `init(key) -> params`: numpy float32 arrays drawn on the host (`key` must be concrete).
    - `param_shapes() -> pytree of jax.ShapeDtypeStruct`, shaped like `init`'s result.
    - `apply(params, tokens [B, S], mask [B, S], read=slice(None)) -> (logits [B, S', V],
      values [B, S'])` at the positions `read` selects (all S by default).
    - `init_cache(batch, length) -> KVCache` (empty).
    - `prefill(params, tokens [B, L], mask [B, L], cache) -> (cache, logits [B, V], value [B])`.
    - `decode(params, cache, token [B], index, mask [B] | None) -> (cache, logits, value)`.
    - `score(params, context [B, L], response [B, M], pad_id, eos_id) -> TokenScores`.
    - `context_value(params, context [B, L], pad_id) -> [B]`.
    - `packed_apply(params, tokens [R, P], segments [R, P], rows [N], columns [N, K]) ->
      (logits [N, K, V], values [N, K])`: a pass over packed rows (`networks.packing`), each
      segment computed as it is alone, the heads read at `columns` of row `rows[i]`.
    - `packed_score(params, packed: PackedRows, response [N, M], pad_id, eos_id) ->
      TokenScores`: `score` of the messages `packed` holds, computed without their padding.
    """

    spec: Any  # LanguageModelSpec, or a pretrained family's (`networks.llama_policy`)
    init: Callable[[jax.Array], Params]
    param_shapes: Callable[[], Any]
    apply: Callable[..., tuple[jax.Array, jax.Array]]
    init_cache: Callable[[int, int], KVCache]
    prefill: Callable[..., tuple[KVCache, jax.Array, jax.Array]]
    decode: Callable[..., tuple[KVCache, jax.Array, jax.Array]]
    score: Callable[..., TokenScores]
    context_value: Callable[[Params, jax.Array, int], jax.Array]
    packed_apply: Callable[..., tuple[jax.Array, jax.Array]]
    packed_score: Callable[..., TokenScores]


# -- parameters ------------------------------------------------------------------------------


class _Draw(NamedTuple):
    """How `init` draws one float32 parameter: normal with standard deviation `std` if it is
    positive, else every entry `fill`."""

    shape: tuple[int, ...]
    std: float = 0.0
    fill: float = 0.0


def _dense(d_in: int, d_out: int, std: float) -> dict[str, _Draw]:
    return {"kernel": _Draw((d_in, d_out), std), "bias": _Draw((d_out,))}


def _norm(d: int) -> dict[str, _Draw]:
    return {"scale": _Draw((d,), fill=1.0), "bias": _Draw((d,))}


def _trunk_table(spec: LanguageModelSpec) -> dict[str, Any]:
    d = spec.d_model
    # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * layers), so
    # the stream's variance at init does not grow with depth.
    residual_std = _INIT_STD / math.sqrt(2 * spec.num_layers)
    table: dict[str, Any] = {
        "token_embedding": _Draw((spec.vocab_size, d), _INIT_STD),
        "position_embedding": _Draw((spec.max_length, d), _INIT_STD),
        "final_norm": _norm(d),
    }
    for layer in range(spec.num_layers):
        table[f"block_{layer}"] = {
            "attention_norm": _norm(d),
            "qkv": _dense(d, 3 * d, _INIT_STD),
            "attention_out": _dense(d, d, residual_std),
            "mlp_norm": _norm(d),
            "mlp_in": _dense(d, spec.mlp_dim, _INIT_STD),
            "mlp_out": _dense(spec.mlp_dim, d, residual_std),
        }
    return table


def _param_table(spec: LanguageModelSpec) -> dict[str, Any]:
    # The value head reads a LayerNormed hidden state (entries of variance ~1), so a kernel std of
    # 0.02 / sqrt(d) starts the values at about +-0.02 whatever the width.
    table = {trunk: _trunk_table(spec) for trunk in spec.trunks}
    table["value_head"] = _dense(spec.d_model, 1, _INIT_STD / math.sqrt(spec.d_model))
    return table


def _is_draw(x: Any) -> bool:
    return isinstance(x, _Draw)


def _init_on_host(spec: LanguageModelSpec, key: jax.Array) -> Params:
    words = np.asarray(jax.random.key_data(key), np.uint32).ravel().tolist()

    def draw(path: Any, leaf: _Draw) -> np.ndarray:
        if leaf.std <= 0:
            return np.full(leaf.shape, leaf.fill, np.float32)
        # Seeded by the parameter's path as well as the key: the draw of one parameter does not
        # depend on how many others come before it.
        name = jax.tree_util.keystr(path)
        rng = np.random.default_rng([*words, zlib.crc32(name.encode())])
        return (rng.standard_normal(leaf.shape, np.float32) * np.float32(leaf.std)).astype(
            np.float32
        )

    return jax.tree_util.tree_map_with_path(draw, _param_table(spec), is_leaf=_is_draw)


def count_params(params: Any) -> int:
    """The number of scalars in a parameter pytree (arrays or `jax.ShapeDtypeStruct`s)."""
    return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)))


def policy_logits(logits: jax.Array, pad_id: int) -> jax.Array:
    """The policy's logits `[..., V]`: `pad_id` is never generated (a PAD inside a dialogue
    would read as padding in the next context), so its logit is masked out."""
    return logits.at[..., pad_id].set(MASKED_SCORE)


def response_mask(response: jax.Array, eos_id: int) -> jax.Array:
    """`[B, M]` float32: 1 for the tokens of `response` `[B, M]` up to and including its first
    `eos_id` (every token if it has none), 0 after."""
    is_eos = (response == eos_id).astype(jnp.int32)
    eos_before = jnp.cumsum(is_eos, axis=1) - is_eos
    return (eos_before == 0).astype(jnp.float32)


def prefilled(cache: KVCache, kv: dict[str, tuple[jax.Array, jax.Array]], mask: jax.Array):
    """`cache` with a context's keys and values `kv` (per trunk, `[layers, B, L, ...]`) and its
    `mask` `[B, L]` written into slots `[0, L)`."""
    at = (0,) * cache.keys[next(iter(kv))].ndim
    return KVCache(
        keys={
            n: jax.lax.dynamic_update_slice(cache.keys[n], kv[n][0].astype(cache.keys[n].dtype), at)
            for n in kv
        },
        values={
            n: jax.lax.dynamic_update_slice(
                cache.values[n], kv[n][1].astype(cache.values[n].dtype), at
            )
            for n in kv
        },
        mask=jax.lax.dynamic_update_slice(cache.mask, mask.astype(jnp.int32), (0, 0)),
    )


def decode_slots(
    cache: KVCache, index: jax.Array | int, mask: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """For a `decode` of one token per row at slot `index` (one slot for every row, or each
    row's own `[B]`): the cache's updated key mask `[B, S]`, the slots each row's token attends
    to `[B, S]` (bool), and its position `[B, 1]`. `mask` `[B]` (None: all 1) says which rows'
    tokens are real."""
    batch, length = cache.mask.shape
    real = jnp.ones((batch,), jnp.int32) if mask is None else mask.astype(jnp.int32)
    index = jnp.asarray(index)
    if index.ndim == 0:
        key_mask = jax.lax.dynamic_update_slice(cache.mask, real[:, None], (0, index))
    else:
        here = jnp.arange(length)[None] == index[:, None]
        key_mask = jnp.where(here, real[:, None], cache.mask)
    # Slots after `index` are empty in a cache filled in order; masking them as well keeps a
    # cache reused out of order causal.
    seen = (jnp.arange(length)[None] <= jnp.reshape(index, (-1, 1))) & (key_mask == 1)
    # The position `apply` would give: cumsum(mask) - 1 up to this token.
    position = jnp.maximum(jnp.sum(seen, axis=1) - 1, 0)[:, None]
    return key_mask, seen, position


def write_slots(
    cache: jax.Array, new: jax.Array, layer: jax.Array | int, index: jax.Array | int
) -> jax.Array:
    """One kind of a trunk's cache, keys or values `[layers, B, S, H, Dh]`, with `new`
    `[B, T, H, Dh]` written into layer `layer` at slots `index...`: the same slots for every
    row (`index` a scalar), or each row's own (`[B]`, T = 1: rows decoding at different steps,
    as the slots of continuous batching do)."""
    new = new.astype(cache.dtype)
    index = jnp.asarray(index)
    if index.ndim == 0:
        return jax.lax.dynamic_update_slice(cache, new[None], (layer, 0, index, 0, 0))
    return cache.at[layer, jnp.arange(new.shape[0]), index].set(new[:, 0])


def cache_row(cache: KVCache, row: jax.Array | int, source: KVCache) -> KVCache:
    """`cache` with its row `row` replaced by the one row of `source` (a cache of batch 1 and
    the same length): every trunk's keys and values, and the key mask, so that nothing of the
    row's earlier occupant stays in view."""

    def put(whole: jax.Array, one: jax.Array, axis: int) -> jax.Array:
        return jax.lax.dynamic_update_index_in_dim(whole, one, row, axis)

    return KVCache(
        keys={n: put(cache.keys[n], source.keys[n][:, 0], 1) for n in cache.keys},
        values={n: put(cache.values[n], source.values[n][:, 0], 1) for n in cache.values},
        mask=put(cache.mask, source.mask[0], 0),
    )


def _token_scores(
    logits: jax.Array, values: jax.Array, response: jax.Array, mask: jax.Array, pad_id: int
) -> TokenScores:
    """`TokenScores` of `response` `[B, M]` from the logits `[B, M, V]` and values `[B, M]`
    read before each of its tokens."""
    log_policy = jax.nn.log_softmax(policy_logits(logits, pad_id), axis=-1)
    log_probs = jnp.take_along_axis(log_policy, response[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_policy) * log_policy, axis=-1)
    real = mask > 0
    return TokenScores(
        log_probs=jnp.where(real, log_probs, 0.0),
        values=jnp.where(real, values, 0.0),
        entropy=jnp.where(real, entropy, 0.0),
        mask=mask,
    )


def scoring_functions(
    apply: Callable[..., tuple[jax.Array, jax.Array]],
) -> tuple[Callable[..., TokenScores], Callable[[Params, jax.Array, int], jax.Array]]:
    """A `LanguageModel`'s `score` and `context_value`, from its `apply` (any model family)."""

    def score(
        params: Params, context: jax.Array, response: jax.Array, pad_id: int, eos_id: int
    ) -> TokenScores:
        """Log-probs, values and entropies of `response` `[B, M]` after `context` `[B, L]` (one
        pass over both): entry i is read at the position that predicts response token i (L - 1
        for i = 0), so `values[:, i]` is the value of the state before token i."""
        context_length, response_length = context.shape[1], response.shape[1]
        mask = response_mask(response, eos_id)
        tokens = jnp.concatenate([context, response], axis=1)
        token_mask = jnp.concatenate(
            [(context != pad_id).astype(jnp.int32), mask.astype(jnp.int32)], axis=1
        )
        # The heads read only the positions that predict a response token.
        before = slice(context_length - 1, context_length + response_length - 1)
        logits, values = apply(params, tokens, token_mask, before)
        return _token_scores(logits, values, response, mask, pad_id)

    def context_value(params: Params, context: jax.Array, pad_id: int) -> jax.Array:
        """`[B]` float32: the value of the state after `context` `[B, L]` (score's values[:, 0])."""
        _, values = apply(params, context, context != pad_id, slice(-1, None))
        return values[:, -1]

    return score, context_value


def packed_application(
    hidden_states: Callable[..., dict[str, jax.Array]],
    heads: Callable[[Params, dict[str, jax.Array]], tuple[jax.Array, jax.Array]],
) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """A `LanguageModel`'s `packed_apply` (any model family), from its trunks' final hidden
    states `hidden_states(params, tokens, positions, allowed) -> {trunk: [B, T, d]}` and its
    `heads(params, {trunk: hidden}) -> (logits, values)`. A row may be longer than the model's
    `max_length`: positions count from each message's start, and no message is longer."""

    def packed_apply(
        params: Params,
        tokens: jax.Array,
        segments: jax.Array,
        rows: jax.Array,
        columns: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        positions, allowed = segment_positions(segments), segment_allowed(segments)
        hidden = hidden_states(params, tokens, positions, allowed)
        # The heads (a vocabulary-wide matmul) run only where response tokens are predicted.
        return heads(params, {name: h[rows[:, None], columns] for name, h in hidden.items()})

    return packed_apply


def packed_scoring(
    packed_apply: Callable[..., tuple[jax.Array, jax.Array]],
) -> Callable[..., TokenScores]:
    """A `LanguageModel`'s `packed_score`, from its `packed_apply` (any model family)."""

    def packed_score(
        params: Params, packed: PackedRows, response: jax.Array, pad_id: int, eos_id: int
    ) -> TokenScores:
        """`score` of the messages `packed` holds (`networks.packing.pack_rows` of a context and
        this `response` `[N, M]`), their padding never computed: equal to `score` of the
        unpacked batch up to float rounding."""
        logits, values = packed_apply(
            params, packed.tokens, packed.segments, packed.rows, packed.columns
        )
        return _token_scores(logits, values, response, response_mask(response, eos_id), pad_id)

    return packed_score


# -- the forward pass ------------------------------------------------------------------------


def _layer_norm(x: jax.Array, norm: dict[str, jax.Array]) -> jax.Array:
    """LayerNorm over the last axis, in float32."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + _NORM_EPS) * norm["scale"] + norm["bias"]


def _linear(x: jax.Array, dense: dict[str, jax.Array], dtype: jnp.dtype) -> jax.Array:
    """`x @ kernel + bias` with the matmul in `dtype`, accumulated and returned in float32."""
    y = jnp.matmul(
        x.astype(dtype), dense["kernel"].astype(dtype), preferred_element_type=jnp.float32
    )
    return y + dense["bias"]


def _attend(
    q: jax.Array, keys: jax.Array, values: jax.Array, allowed: jax.Array, dtype: jnp.dtype
) -> jax.Array:
    """Multi-head attention of queries `[B, S, H, Dh]` over keys and values `[B, T, H, Dh]`
    where `allowed` `[B, S, T]` (bool) is true; `[B, S, H * Dh]` float32."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = jnp.einsum(
        "bshd,bthd->bhst",
        q.astype(dtype),
        keys.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    scores = jnp.where(allowed[:, None], scores * scale, MASKED_SCORE)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum(
        "bhst,bthd->bshd",
        weights.astype(dtype),
        values.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    return out.reshape(*out.shape[:2], -1)


def _positions(mask: jax.Array) -> jax.Array:
    """`cumsum(mask) - 1` along the sequence `[B, S]` (left padding does not shift positions),
    at least 0 (padding before the first real token)."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def _run_trunk(
    spec: LanguageModelSpec,
    trunk: Params,
    tokens: jax.Array,
    positions: jax.Array,
    allowed: jax.Array,
    cache: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One trunk over `tokens` and `positions` `[B, S]`: `(hidden [B, S, d] float32, keys,
    values)`. Without `cache` a query attends over the S tokens themselves (`allowed`
    `[B, S, S]`) and keys/values are the fresh ones `[layers, B, S, H, Dh]`; with `cache =
    (keys, values, index)` (`[layers, B, T, H, Dh]`; a slot, or one per row) the tokens' keys
    and values are written at slots `index...` and a query attends over the T slots (`allowed`
    `[B, S, T]`), and keys/values are the updated cache."""
    dtype = jnp.dtype(spec.dtype)
    batch, length = tokens.shape
    x = jnp.asarray(trunk["token_embedding"])[tokens]
    x = x + jnp.asarray(trunk["position_embedding"])[positions]
    fresh_keys, fresh_values = [], []
    if cache is not None:
        cache_keys, cache_values, index = cache
    for layer in range(spec.num_layers):
        block = trunk[f"block_{layer}"]
        qkv = _linear(_layer_norm(x, block["attention_norm"]), block["qkv"], dtype)
        qkv = qkv.reshape(batch, length, 3, spec.num_heads, spec.head_dim).astype(dtype)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if cache is None:
            fresh_keys.append(k)
            fresh_values.append(v)
            keys, values = k, v
        else:
            cache_keys = write_slots(cache_keys, k, layer, index)
            cache_values = write_slots(cache_values, v, layer, index)
            keys, values = cache_keys[layer], cache_values[layer]
        attended = _attend(q, keys, values, allowed, dtype)
        x = x + _linear(attended, block["attention_out"], dtype)
        hidden = jax.nn.gelu(_linear(_layer_norm(x, block["mlp_norm"]), block["mlp_in"], dtype))
        x = x + _linear(hidden, block["mlp_out"], dtype)
    x = _layer_norm(x, trunk["final_norm"])
    if cache is None:
        return x, jnp.stack(fresh_keys), jnp.stack(fresh_values)
    return x, cache_keys, cache_values


def _heads(
    spec: LanguageModelSpec, params: Params, hidden: dict[str, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """Logits `[..., V]` (tied LM head on the policy trunk) and values `[...]`, float32."""
    dtype = jnp.dtype(spec.dtype)
    embedding = params["policy"]["token_embedding"]
    logits = jnp.matmul(
        hidden["policy"].astype(dtype),
        embedding.T.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    value_trunk = "critic" if spec.critic == "separate" else "policy"
    values = _linear(hidden[value_trunk], params["value_head"], dtype)[..., 0]
    return logits, values


def _check_length(spec: LanguageModelSpec, length: int, what: str) -> None:
    if length > spec.max_length:
        raise ValueError(
            f"{what} of length {length} is longer than the model's max_length = {spec.max_length} "
            "positions (raise LanguageModelSpec.max_length)"
        )


def make_language_model(spec: LanguageModelSpec) -> LanguageModel:
    """The pure functions of the decoder-only actor-critic `spec` describes (see
    `LanguageModel`)."""

    def init(key: jax.Array) -> Params:
        return _init_on_host(spec, key)

    def param_shapes() -> Any:
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.float32),
            _param_table(spec),
            is_leaf=_is_draw,
        )

    def forward(
        params: Params, tokens: jax.Array, mask: jax.Array, read: slice = slice(None)
    ) -> tuple[Any, ...]:
        """`(logits, values, {trunk: (keys, values)})` of the full causal pass, the heads read
        at the positions `read` selects."""
        _check_length(spec, tokens.shape[1], "a token sequence")
        mask = mask.astype(bool)
        length = tokens.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        allowed = causal[None] & mask[:, None, :]
        positions = _positions(mask)
        hidden, kv = {}, {}
        for name in spec.trunks:
            hidden[name], keys, values = _run_trunk(spec, params[name], tokens, positions, allowed)
            hidden[name] = hidden[name][:, read]
            kv[name] = (keys, values)
        logits, values = _heads(spec, params, hidden)
        return logits, values, kv

    def apply(
        params: Params, tokens: jax.Array, mask: jax.Array, read: slice = slice(None)
    ) -> tuple[jax.Array, jax.Array]:
        """Logits `[B, S, V]` and values `[B, S]` (float32) of tokens `[B, S]` int32 where `mask`
        `[B, S]` marks the real ones: a query attends to the real keys at or before it. Outputs
        at masked positions are finite but meaningless. `read` (a static slice) keeps only the
        positions it selects, and the heads (the vocabulary-wide LM head above all) run on
        those alone."""
        logits, values, _ = forward(params, tokens, mask, read)
        return logits, values

    def hidden_states(
        params: Params, tokens: jax.Array, positions: jax.Array, allowed: jax.Array
    ) -> dict[str, jax.Array]:
        return {
            name: _run_trunk(spec, params[name], tokens, positions, allowed)[0]
            for name in spec.trunks
        }

    packed_apply = packed_application(
        hidden_states,
        lambda params, hidden: _heads(spec, params, hidden),
    )

    def init_cache(batch: int, length: int) -> KVCache:
        """An empty cache for `batch` rows of up to `length` tokens (context + response)."""
        _check_length(spec, length, "a KV cache")
        shape = (spec.num_layers, batch, length, spec.num_heads, spec.head_dim)
        dtype = jnp.dtype(spec.dtype)
        return KVCache(
            keys={name: jnp.zeros(shape, dtype) for name in spec.trunks},
            values={name: jnp.zeros(shape, dtype) for name in spec.trunks},
            mask=jnp.zeros((batch, length), jnp.int32),
        )

    def prefill(
        params: Params, tokens: jax.Array, mask: jax.Array, cache: KVCache
    ) -> tuple[KVCache, jax.Array, jax.Array]:
        """Run the context `tokens` `[B, L]` (`mask` `[B, L]`) into slots `[0, L)` of `cache`:
        `(cache, logits [B, V], value [B])` at the last position, L - 1."""
        logits, values, kv = forward(params, tokens, mask, slice(-1, None))
        return prefilled(cache, kv, mask), logits[:, -1], values[:, -1]

    def decode(
        params: Params,
        cache: KVCache,
        token: jax.Array,
        index: jax.Array | int,
        mask: jax.Array | None = None,
    ) -> tuple[KVCache, jax.Array, jax.Array]:
        """Append `token` `[B]` at slot `index` (L + i for the i-th generated token: a scalar,
        or one per row `[B]`) of `cache`: `(cache, logits [B, V], value [B])` after it. `mask`
        `[B]` (default all 1) says which rows' tokens are real; a masked token is never
        attended to, and its outputs are meaningless."""
        key_mask, seen, position = decode_slots(cache, index, mask)
        hidden, keys, values = {}, {}, {}
        for name in spec.trunks:
            hidden[name], keys[name], values[name] = _run_trunk(
                spec,
                params[name],
                token[:, None],
                position,
                seen[:, None, :],
                (cache.keys[name], cache.values[name], index),
            )
        logits, value = _heads(spec, params, hidden)
        return KVCache(keys, values, key_mask), logits[:, 0], value[:, 0]

    score, context_value = scoring_functions(apply)
    return LanguageModel(
        spec=spec,
        init=init,
        param_shapes=param_shapes,
        apply=apply,
        init_cache=init_cache,
        prefill=prefill,
        decode=decode,
        score=score,
        context_value=context_value,
        packed_apply=packed_apply,
        packed_score=packed_scoring(packed_apply),
    )
