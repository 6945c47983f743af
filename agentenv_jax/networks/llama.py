"""The Llama family of decoder-only transformers (Llama 2 and 3, SmolLM2, Qwen2, Qwen3) as pure
JAX functions, configured by a Hugging Face checkpoint's own `config.json`.

What the members differ in is a field of `LlamaSpec`: grouped-query attention (fewer key/value
heads than query heads), q/k/v biases (Qwen2), RMS norms of each head's queries and keys
(Qwen3), tied or separate output embeddings, and the rotary embedding's base and scaling
(Llama 3's). The parameters are a pytree of arrays named after the checkpoint's tensors, with
the layers stacked on a leading axis so that one `lax.scan` runs them (one layer compiled, not
`num_layers`); matrices are stored `[in, out]`, the transpose of torch's `Linear.weight`.

Positions are counted over the real tokens of each row (`mask`), so a left-padded prompt has
the same positions as the unpadded one: the convention of `transformers`' `generate`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.networks.language_model import write_slots

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_ROPE_TYPES = ("default", "linear", "llama3")

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """How the rotary embedding's frequencies are rescaled for long contexts: "linear"
    divides every frequency by `factor`; "llama3" divides only the low ones, blending between
    `low_freq_factor` and `high_freq_factor` wavelengths of the original context."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class LlamaSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    qkv_bias: bool  # biases on the query, key and value projections
    output_bias: bool  # a bias on the attention's output projection (Llama's attention_bias)
    mlp_bias: bool
    qk_norm: bool  # RMS norms of each head's queries and keys, before the rotation (Qwen3)
    tie_word_embeddings: bool
    max_position_embeddings: int


def _setting(config: Mapping[str, Any], field: str, default: Any = None) -> Any:
    """`config[field]`, or `default` where it is missing or null."""
    value = config.get(field)
    return default if value is None else value


def _positive_int(value: Any, field: str, where: str) -> int:
    """`value` if a positive integer, else `ConfigError` naming `field` and the value (None:
    missing)."""
    if value is None:
        raise ConfigError(f"{where}: {field} is missing; allowed: a positive integer")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{where}: {field} = {value!r} is not allowed; allowed: a positive integer"
        )
    return value


def _positive_number(value: Any, field: str, where: str) -> float:
    """`value` as a float if a finite number > 0, else `ConfigError` naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{where}: {field} = {value!r} is not allowed; allowed: a number > 0")
    return float(value)


def _head_sizes(config: Mapping[str, Any], where: str) -> tuple[int, int, int, int]:
    """`(hidden_size, num_heads, num_kv_heads, head_dim)` of `config`, each a positive integer,
    checked against each other: key/value heads divide the query heads (each is shared by an
    equal group of them), a head's size comes from `head_dim` or divides `hidden_size`, and it
    is even (the rotary embedding turns pairs of its dimensions)."""
    hidden = _positive_int(config.get("hidden_size"), "hidden_size", where)
    heads = _positive_int(config.get("num_attention_heads"), "num_attention_heads", where)
    kv_heads = _positive_int(
        _setting(config, "num_key_value_heads", heads), "num_key_value_heads", where
    )
    if heads % kv_heads:
        divisors = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ConfigError(
            f"{where}: num_key_value_heads = {kv_heads} does not divide num_attention_heads = "
            f"{heads} (each key/value head serves an equal group of query heads); allowed: "
            f"{', '.join(map(str, divisors))}"
        )
    if config.get("head_dim") is not None:
        head_dim = _positive_int(config["head_dim"], "head_dim", where)
        field = f"head_dim = {head_dim}"
    elif hidden % heads:
        raise ConfigError(
            f"{where}: hidden_size = {hidden} is not divisible by num_attention_heads = {heads}, "
            "and there is no head_dim to give each head's size; allowed: a multiple of "
            f"{heads}, or a head_dim"
        )
    else:
        head_dim = hidden // heads
        field = f"head_dim = hidden_size / num_attention_heads = {hidden} / {heads} = {head_dim}"
    if head_dim % 2:
        raise ConfigError(
            f"{where}: {field} is odd; the rotary embedding turns pairs of a head's dimensions: "
            "allowed: an even head size"
        )
    return hidden, heads, kv_heads, head_dim


def _rope_settings(config: Mapping[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    """The rotary embedding's base and scaling, checked: a supported type, and numbers its
    frequencies can be computed from."""
    # transformers 5 writes `rope_parameters`; checkpoints saved before it, `rope_theta` and
    # `rope_scaling` at the top level.
    parameters = dict(config.get("rope_parameters") or {})
    theta_field = "rope_parameters.rope_theta" if "rope_theta" in parameters else "rope_theta"
    theta = _positive_number(
        parameters.pop("rope_theta", _setting(config, "rope_theta", 10000.0)), theta_field, where
    )
    block = "rope_parameters" if parameters else "rope_scaling"
    scaling = parameters or dict(config.get("rope_scaling") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ConfigError(
            f"{where}: rope type {rope_type!r} is not supported; supported: "
            f"{', '.join(_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    fields = {f.name for f in dataclasses.fields(RopeScaling)}
    rope = RopeScaling(
        **{k: v for k, v in scaling.items() if k in fields} | {"rope_type": rope_type}
    )
    _positive_number(rope.factor, f"{block}.factor", where)
    if rope_type == "llama3":
        low = _positive_number(rope.low_freq_factor, f"{block}.low_freq_factor", where)
        high = _positive_number(rope.high_freq_factor, f"{block}.high_freq_factor", where)
        if high <= low:
            raise ConfigError(
                f"{where}: {block}.high_freq_factor = {high} is not above low_freq_factor = "
                f"{low} (Llama 3's rope scaling blends between the two); allowed: a "
                "high_freq_factor > low_freq_factor"
            )
        _positive_int(
            rope.original_max_position_embeddings,
            f"{block}.original_max_position_embeddings",
            where,
        )
    return theta, rope


def require_supported(model_type: Any, where: str, field: str = "model_type") -> str:
    """`model_type` if this module implements it, else `ConfigError` naming the supported."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{where}: {field} {model_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model_type


def spec_from_config(config: Mapping[str, Any], where: str = "config.json") -> LlamaSpec:
    """The spec of a checkpoint's `config.json` (as a dict); `ConfigError` naming `where`, the
    field, its value and what is allowed for a model type or setting this module does not
    implement, or sizes that do not fit together. Every field the parameters' shapes depend on
    is checked here, before any weight is read."""
    model_type = require_supported(config.get("model_type"), where)
    activation = config.get("hidden_act", "silu")
    if activation != "silu":
        raise ConfigError(f"{where}: hidden_act {activation!r} is not supported; supported: silu")
    hidden, heads, kv_heads, head_dim = _head_sizes(config, where)
    theta, scaling = _rope_settings(config, where)
    attention_bias = bool(config.get("attention_bias", False))
    return LlamaSpec(
        model_type=model_type,
        vocab_size=_positive_int(config.get("vocab_size"), "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=_positive_int(
            config.get("intermediate_size"), "intermediate_size", where
        ),
        num_layers=_positive_int(config.get("num_hidden_layers"), "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_positive_number(
            _setting(config, "rms_norm_eps", 1e-6), "rms_norm_eps", where
        ),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=model_type == "qwen2" or attention_bias,
        output_bias=model_type == "llama" and attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=_positive_int(
            _setting(config, "max_position_embeddings", 2048), "max_position_embeddings", where
        ),
    )


def parameter_shapes(spec: LlamaSpec) -> Params:
    """The shape of every parameter, in the layout `forward` takes."""
    d, hd, layers = spec.hidden_size, spec.head_dim, spec.num_layers
    q, kv, inner = spec.num_heads * hd, spec.num_kv_heads * hd, spec.intermediate_size
    layer: dict[str, tuple[int, ...]] = {
        "input_layernorm": (d,),
        "q_proj": (d, q),
        "k_proj": (d, kv),
        "v_proj": (d, kv),
        "o_proj": (q, d),
        "post_attention_layernorm": (d,),
        "gate_proj": (d, inner),
        "up_proj": (d, inner),
        "down_proj": (inner, d),
    }
    if spec.qkv_bias:
        layer |= {"q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,)}
    if spec.output_bias:
        layer |= {"o_bias": (d,)}
    if spec.mlp_bias:
        layer |= {"gate_bias": (inner,), "up_bias": (inner,), "down_bias": (d,)}
    if spec.qk_norm:
        layer |= {"q_norm": (hd,), "k_norm": (hd,)}
    shapes: Params = {
        "embed_tokens": (spec.vocab_size, d),
        "layers": {name: (layers, *shape) for name, shape in layer.items()},
        "norm": (d,),
    }
    if not spec.tie_word_embeddings:
        shapes["lm_head"] = (d, spec.vocab_size)
    return shapes


def rope_frequencies(spec: LlamaSpec) -> np.ndarray:
    """The rotary embedding's `head_dim / 2` angular frequencies, rescaled as the spec says."""
    exponents = np.arange(0, spec.head_dim, 2, dtype=np.float64) / spec.head_dim
    frequencies = 1.0 / spec.rope_theta**exponents
    scaling = spec.rope_scaling
    if scaling is None:
        return frequencies.astype(np.float32)
    if scaling.rope_type == "linear":
        return (frequencies / scaling.factor).astype(np.float32)
    original = scaling.original_max_position_embeddings
    wavelengths = 2 * math.pi / frequencies
    low_wavelength = original / scaling.low_freq_factor
    high_wavelength = original / scaling.high_freq_factor
    smooth = (original / wavelengths - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * frequencies / scaling.factor + smooth * frequencies
    scaled = np.where(wavelengths > low_wavelength, frequencies / scaling.factor, frequencies)
    between = (wavelengths >= high_wavelength) & (wavelengths <= low_wavelength)
    return np.where(between, blended, scaled).astype(np.float32)


def positions_of(mask: jax.Array) -> jax.Array:
    """Each token's position among the real tokens of its row (0 for the padding before)."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    # In float32 whatever the compute type, as the checkpoints were trained.
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """The rotary embedding on `[B, T, heads, head_dim]`, pairing element i with i + d/2."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x * cos + rotated * sin).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class Adapted:
    """Low-rank adapters on some of a block's projections (LoRA, `networks.lora`): one
    layer's `{"q_proj": {"a": [in, rank], "b": [rank, out]}, ...}` and their `scale`
    (alpha / rank); a projection `W` becomes `W + scale * a @ b`, computed as `x @ W + scale
    * (x @ a) @ b` so that the sum is never formed."""

    adapters: Params
    scale: float


def _project(
    x: jax.Array, layer: Params, name: str, dtype: jnp.dtype, adapted: Adapted | None = None
) -> jax.Array:
    y = x @ layer[f"{name}_proj"].astype(dtype)
    adapter = None if adapted is None else adapted.adapters.get(f"{name}_proj")
    if adapter is not None:
        low_rank = (x @ adapter["a"].astype(dtype)) @ adapter["b"].astype(dtype)
        y = y + (adapted.scale * low_rank).astype(y.dtype)
    bias = layer.get(f"{name}_bias")
    return y if bias is None else y + bias.astype(dtype)


def _block(
    spec: LlamaSpec,
    x: jax.Array,
    layer: Params,
    cos: jax.Array,
    sin: jax.Array,
    allowed: jax.Array,
    dtype: jnp.dtype,
    cached: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None = None,
    adapted: Adapted | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One block over `x` `[B, T, hidden]` (its projections `adapted` where given):
    `(x, keys, values)`. Without `cached` the queries attend over the T tokens' own keys and
    values (`allowed` `[B, T, T]`), which it returns; with `cached = (keys, values, layer,
    index)` (every layer's cache, `[layers, B, S, kv_heads, head_dim]`, this block's layer and
    a slot, or one per row) the tokens' keys and values are written at slots `index...` of
    the layer and the queries attend over its S slots (`allowed` `[B, T, S]`), and it returns
    the updated caches. NOTE: the caches are updated where they are, a few slots of one layer,
    rather than sliced out per layer and written back: in the decode loop that copying moved
    ten times the bytes of the tokens' own work."""
    batch, length, _ = x.shape
    hd, kv_heads = spec.head_dim, spec.num_kv_heads
    groups = spec.num_heads // kv_heads
    h = _rms_norm(x, layer["input_layernorm"], spec.rms_norm_eps)
    q = _project(h, layer, "q", dtype, adapted).reshape(batch, length, spec.num_heads, hd)
    k = _project(h, layer, "k", dtype, adapted).reshape(batch, length, kv_heads, hd)
    v = _project(h, layer, "v", dtype, adapted).reshape(batch, length, kv_heads, hd)
    if spec.qk_norm:
        q = _rms_norm(q, layer["q_norm"], spec.rms_norm_eps)
        k = _rms_norm(k, layer["k_norm"], spec.rms_norm_eps)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    kept = k, v
    if cached is not None:
        cache_keys, cache_values, layer_index, index = cached
        cache_keys = write_slots(cache_keys, k, layer_index, index)
        cache_values = write_slots(cache_values, v, layer_index, index)
        kept = cache_keys, cache_values
        k = jax.lax.dynamic_index_in_dim(cache_keys, layer_index, keepdims=False)
        v = jax.lax.dynamic_index_in_dim(cache_values, layer_index, keepdims=False)
    # Grouped-query attention: each key/value head serves `groups` consecutive query heads.
    grouped = q.reshape(batch, length, kv_heads, groups, hd)
    scores = jnp.einsum("btkgd,bskd->bkgts", grouped, k.astype(dtype)).astype(jnp.float32)
    scores = jnp.where(allowed[:, None, None], scores / math.sqrt(hd), jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
    attended = jnp.einsum("bkgts,bskd->btkgd", weights, v.astype(dtype))
    x = x + _project(attended.reshape(batch, length, -1), layer, "o", dtype, adapted)
    h = _rms_norm(x, layer["post_attention_layernorm"], spec.rms_norm_eps)
    gate = _project(h, layer, "gate", dtype, adapted)
    gated = jax.nn.silu(gate) * _project(h, layer, "up", dtype, adapted)
    return x + _project(gated, layer, "down", dtype, adapted), *kept


def _rotary(spec: LlamaSpec, positions: jax.Array, dtype: jnp.dtype) -> tuple[jax.Array, ...]:
    """cos and sin of the rotary angles of `positions` `[B, T]`: `[B, T, 1, head_dim]`."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(rope_frequencies(spec))
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def run_layers(
    spec: LlamaSpec,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    allowed: jax.Array,
    dtype=jnp.float32,
    cache: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    remat: bool = False,
    adapted: Adapted | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The final normed hidden state `[B, T, hidden]` of `tokens` at `positions` `[B, T]`, and
    every layer's keys and values `[layers, B, ., kv_heads, head_dim]`. Without `cache` each
    token attends where `allowed` `[B, T, T]` says, and the keys and values are the tokens'
    own; with `cache = (keys, values, index)` they are written into the cache at slot `index`
    (or each row's own) and each token attends over its slots where `allowed` `[B, T, S]`
    says. `remat` recomputes each block's activations in the backward pass instead of keeping
    them (`jax.checkpoint` per block: activation memory of one block, not of every layer, for
    ~1/3 more compute).
    `adapted`: LoRA adapters of every layer, stacked `[layers, ...]` like the layers."""
    cos, sin = _rotary(spec, positions, dtype)
    x = params["embed_tokens"][tokens].astype(dtype)
    scale = 1.0 if adapted is None else adapted.scale
    adapters = {} if adapted is None else adapted.adapters

    def layer_adapted(layer_adapters: Params) -> Adapted | None:
        return Adapted(layer_adapters, scale) if layer_adapters else None

    if cache is None:

        def fresh(x: jax.Array, xs: tuple) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            layer, layer_adapters = xs
            x, k, v = _block(
                spec, x, layer, cos, sin, allowed, dtype, adapted=layer_adapted(layer_adapters)
            )
            return x, (k, v)

        x, (keys, values) = jax.lax.scan(
            jax.checkpoint(fresh) if remat else fresh, x, (params["layers"], adapters)
        )
    else:
        cache_keys, cache_values, index = cache

        # The cache rides in the carry and is updated in place, one layer's slots at a time.
        def cached(carry: tuple, xs: tuple) -> tuple[tuple, None]:
            x, keys, values = carry
            layer, layer_adapters, i = xs
            x, keys, values = _block(
                spec,
                x,
                layer,
                cos,
                sin,
                allowed,
                dtype,
                (keys, values, i, index),
                layer_adapted(layer_adapters),
            )
            return (x, keys, values), None

        layer_index = jnp.arange(spec.num_layers)
        (x, keys, values), _ = jax.lax.scan(
            cached, (x, cache_keys, cache_values), (params["layers"], adapters, layer_index)
        )
    return _rms_norm(x, params["norm"], spec.rms_norm_eps), keys, values


def causal_allowed(mask: jax.Array) -> jax.Array:
    """`[B, T, T]` bool: token t may attend to token s <= t where s is real (`mask` 1)."""
    length = mask.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    return causal[None] & mask.astype(bool)[:, None, :]


def hidden_states(
    spec: LlamaSpec, params: Params, tokens: jax.Array, mask: jax.Array, dtype=jnp.float32
) -> jax.Array:
    """The final normed hidden state `[B, T, hidden]` of `tokens` `[B, T]`, where `mask` is 1
    at real tokens (padding on the left); each token attends to the real tokens up to it."""
    hidden, _, _ = run_layers(spec, params, tokens, positions_of(mask), causal_allowed(mask), dtype)
    return hidden


def output_logits(spec: LlamaSpec, params: Params, hidden: jax.Array, dtype=jnp.float32):
    """Next-token logits (float32) of final hidden states `[..., hidden]`."""
    head = params["embed_tokens"].T if spec.tie_word_embeddings else params["lm_head"]
    return jnp.matmul(hidden.astype(dtype), head.astype(dtype), preferred_element_type=jnp.float32)


def logits(
    spec: LlamaSpec, params: Params, tokens: jax.Array, mask: jax.Array, dtype=jnp.float32
) -> jax.Array:
    """Next-token logits `[B, T, vocab]` (float32) at every position of `tokens`."""
    return output_logits(spec, params, hidden_states(spec, params, tokens, mask, dtype), dtype)
