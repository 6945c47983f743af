"""A model of the Llama family (`networks.llama`) as a text policy: the `LanguageModel` interface
(apply, a KV cache with prefill and decode, score) with a value head on its final hidden state,
so that generation, token-level PPO, central inference, meshes and checkpoints serve it as they
serve the transformer trained from scratch.

Parameters: `{"policy": <the checkpoint's tree>, "value_head": {"kernel": [hidden, 1], "bias":
[1]}}`, and with `critic="separate"` a `"critic"` trunk of the same family (a copy of the
pretrained one at the start) whose hidden state feeds the value head instead. With `lora`,
`"lora": {trunk: adapters}` (`networks.lora`) adapt the one frozen `"policy"` tree: a separate
critic is that base with adapters of its own, not a second copy.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.networks.language_model import (
    KVCache,
    LanguageModel,
    Params,
    decode_slots,
    packed_application,
    packed_scoring,
    prefilled,
    scoring_functions,
)
from agentenv_jax.networks.llama import (
    Adapted,
    LlamaSpec,
    causal_allowed,
    output_logits,
    parameter_shapes,
    positions_of,
    run_layers,
)
from agentenv_jax.networks.lora import ADAPTERS, LoRASpec, adapted, adapter_shapes, init_adapters

_INIT_STD = 0.02  # of random weight matrices, as the family's configs' initializer_range
_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class LlamaPolicySpec:
    """The static shape of a Llama-family text policy."""

    model: LlamaSpec
    max_length: int  # the longest sequence it runs: context + response
    critic: Literal["shared", "separate"] = "shared"
    dtype: str = "float32"  # compute dtype of the matmuls
    remat: bool = False  # recompute each block's activations in the backward pass
    lora: LoRASpec | None = None  # adapters on the frozen base (None: every weight is trained)

    def __post_init__(self) -> None:
        if self.critic not in ("shared", "separate"):
            raise ValueError(f"critic must be shared or separate, got {self.critic!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def trunks(self) -> tuple[str, ...]:
        """The trunks the policy runs: its own, and a critic's."""
        return ("policy", "critic") if self.critic == "separate" else ("policy",)

    @property
    def base_trunks(self) -> tuple[str, ...]:
        """The trunks whose weights it holds: under LoRA, one base that every trunk adapts."""
        return ("policy",) if self.lora is not None else self.trunks

    def base_of(self, trunk: str) -> str:
        return trunk if trunk in self.base_trunks else "policy"


def value_head_shapes(spec: LlamaPolicySpec) -> dict[str, tuple[int, ...]]:
    return {"kernel": (spec.model.hidden_size, 1), "bias": (1,)}


def init_value_head(spec: LlamaPolicySpec, key: jax.Array) -> dict[str, np.ndarray]:
    """The value head's first weights, drawn on the host from `key`: values start near 0 (the
    final hidden state is RMS-normed, so a kernel std of 0.02 / sqrt(hidden) gives ~0.02)."""
    hidden = spec.model.hidden_size
    return {
        "kernel": _draw(key, "value_head", (hidden, 1), _INIT_STD / math.sqrt(hidden)),
        "bias": np.zeros((1,), np.float32),
    }


def _draw(key: jax.Array, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    words = np.asarray(jax.random.key_data(key), np.uint32).ravel().tolist()
    rng = np.random.default_rng([*words, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape, np.float32) * np.float32(std)).astype(np.float32)


def random_trunk(model: LlamaSpec, key: jax.Array, name: str = "policy") -> Params:
    """Random weights of `model` drawn on the host (norms 1, biases 0, matrices normal with
    std 0.02), for benchmarks and tests of sizes no checkpoint here has."""

    def draw(path: Any, shape: tuple[int, ...]) -> np.ndarray:
        leaf = jax.tree_util.keystr(path)
        if "norm" in leaf:
            return np.ones(shape, np.float32)
        if "bias" in leaf:
            return np.zeros(shape, np.float32)
        return _draw(key, f"{name}{leaf}", shape, _INIT_STD)

    return jax.tree_util.tree_map_with_path(
        draw, parameter_shapes(model), is_leaf=lambda x: isinstance(x, tuple)
    )


def init_lora(spec: LlamaPolicySpec, key: jax.Array) -> Params:
    """`{"lora": {trunk: adapters}}` for each trunk the policy runs, or `{}` without LoRA."""
    if spec.lora is None:
        return {}
    return {
        ADAPTERS: {name: init_adapters(spec.model, spec.lora, key, name) for name in spec.trunks}
    }


def make_llama_policy(spec: LlamaPolicySpec) -> LanguageModel:
    """The `LanguageModel` functions of a Llama-family policy with a value head."""
    model, dtype = spec.model, jnp.dtype(spec.dtype)
    value_trunk = "critic" if spec.critic == "separate" else "policy"
    kv_shape = (model.num_layers, model.num_kv_heads, model.head_dim)

    def heads(params: Params, hidden: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        logits = output_logits(model, params["policy"], hidden["policy"], dtype)
        head = params["value_head"]
        values = jnp.matmul(
            hidden[value_trunk].astype(dtype),
            head["kernel"].astype(dtype),
            preferred_element_type=jnp.float32,
        )
        return logits, values[..., 0] + head["bias"][0]

    def check_length(length: int, what: str) -> None:
        if length > spec.max_length:
            raise ValueError(
                f"{what} of length {length} is longer than the policy's max_length = "
                f"{spec.max_length}"
            )

    def trunk(params: Params, name: str) -> tuple[Params, Adapted | None]:
        return params[spec.base_of(name)], adapted(params, name, spec.lora)

    def init(key: jax.Array) -> Params:
        params = {
            name: random_trunk(model, jax.random.fold_in(key, i), name)
            for i, name in enumerate(spec.base_trunks)
        }
        return params | {"value_head": init_value_head(spec, key)} | init_lora(spec, key)

    def param_shapes() -> Any:
        shapes = {name: parameter_shapes(model) for name in spec.base_trunks}
        shapes["value_head"] = value_head_shapes(spec)
        if spec.lora is not None:
            shapes[ADAPTERS] = {name: adapter_shapes(model, spec.lora) for name in spec.trunks}
        return jax.tree.map(
            lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32),
            shapes,
            is_leaf=lambda x: isinstance(x, tuple),
        )

    def run_trunks(
        params: Params, tokens: jax.Array, positions: jax.Array, allowed: jax.Array
    ) -> tuple[dict[str, jax.Array], dict[str, tuple[jax.Array, jax.Array]]]:
        hidden, kv = {}, {}
        for name in spec.trunks:
            weights, adapters = trunk(params, name)
            hidden[name], keys, values = run_layers(
                model,
                weights,
                tokens,
                positions,
                allowed,
                dtype,
                remat=spec.remat,
                adapted=adapters,
            )
            kv[name] = (keys, values)
        return hidden, kv

    def forward(
        params: Params, tokens: jax.Array, mask: jax.Array, read: slice = slice(None)
    ) -> tuple[Any, ...]:
        check_length(tokens.shape[1], "a token sequence")
        hidden, kv = run_trunks(params, tokens, positions_of(mask), causal_allowed(mask))
        # The heads (a vocabulary-wide matmul) run only where `read` looks.
        logits, values = heads(params, {name: h[:, read] for name, h in hidden.items()})
        return logits, values, kv

    def apply(
        params: Params, tokens: jax.Array, mask: jax.Array, read: slice = slice(None)
    ) -> tuple[jax.Array, jax.Array]:
        logits, values, _ = forward(params, tokens, mask, read)
        return logits, values

    packed_apply = packed_application(lambda *args: run_trunks(*args)[0], heads)

    def init_cache(batch: int, length: int) -> KVCache:
        check_length(length, "a KV cache")
        layers, kv_heads, head_dim = kv_shape
        shape = (layers, batch, length, kv_heads, head_dim)
        return KVCache(
            keys={trunk: jnp.zeros(shape, dtype) for trunk in spec.trunks},
            values={trunk: jnp.zeros(shape, dtype) for trunk in spec.trunks},
            mask=jnp.zeros((batch, length), jnp.int32),
        )

    def prefill(
        params: Params, tokens: jax.Array, mask: jax.Array, cache: KVCache
    ) -> tuple[KVCache, jax.Array, jax.Array]:
        logits, values, kv = forward(params, tokens, mask, slice(-1, None))
        return prefilled(cache, kv, mask), logits[:, -1], values[:, -1]

    def decode(
        params: Params,
        cache: KVCache,
        token: jax.Array,
        index: jax.Array | int,
        mask: jax.Array | None = None,
    ) -> tuple[KVCache, jax.Array, jax.Array]:
        key_mask, seen, position = decode_slots(cache, index, mask)
        hidden, keys, values = {}, {}, {}
        for name in spec.trunks:
            weights, adapters = trunk(params, name)
            hidden[name], keys[name], values[name] = run_layers(
                model,
                weights,
                token[:, None],
                position,
                seen[:, None, :],
                dtype,
                (cache.keys[name], cache.values[name], index),
                adapted=adapters,
            )
        logits, value = heads(params, hidden)
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
