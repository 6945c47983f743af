"""LoRA: low-rank adapters on a Llama-family model's projections (Hu et al., 2021).

Each adapted projection `W [in, out]` of every layer gains `a [in, rank]` and `b [rank, out]`
and computes `x @ W + (alpha / rank) * (x @ a) @ b`. `b` starts at zero, so an adapted model
starts as its base model exactly; `a` starts as PEFT's does (uniform in +-1/sqrt(in)). The
adapters of a trunk are one pytree, `{"q_proj": {"a": [layers, in, rank], "b": [layers, rank,
out]}, ...}`, stacked over the layers like the trunk's own weights; a policy keeps them under
`params["lora"][trunk]`, beside the frozen base they adapt, and the base alone is the policy
the run started from.
"""

from __future__ import annotations

import dataclasses
import typing
import zlib
from typing import Any

import jax
import numpy as np

from agentenv_jax.config.schema import LoRAConfig, LoRATarget
from agentenv_jax.networks.llama import Adapted, LlamaSpec, parameter_shapes

Params = dict[str, Any]

TARGETS: tuple[str, ...] = typing.get_args(LoRATarget)
ADAPTERS = "lora"  # the key of a policy's adapters in its parameter tree


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """The adapters' shape: their `rank`, the `alpha` their output is scaled by (`alpha /
    rank`) and the projections they adapt (`TARGETS` names them)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets must be some of {TARGETS}, got {self.targets}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_spec(config: LoRAConfig) -> LoRASpec | None:
    """The adapters `network.language_model.lora` asks for; None at rank 0."""
    return LoRASpec(config.rank, config.alpha, tuple(config.targets)) if config.rank else None


def adapter_shapes(model: LlamaSpec, lora: LoRASpec) -> Params:
    """One trunk's adapter shapes: `{target: {"a": (layers, in, rank), "b": (layers, rank,
    out)}}`."""
    layers = parameter_shapes(model)["layers"]
    shapes = {}
    for target in lora.targets:
        num_layers, fan_in, fan_out = layers[target]
        shapes[target] = {
            "a": (num_layers, fan_in, lora.rank),
            "b": (num_layers, lora.rank, fan_out),
        }
    return shapes


def init_adapters(model: LlamaSpec, lora: LoRASpec, key: jax.Array, name: str) -> Params:
    """A trunk's first adapters, drawn on the host from `key` and `name` (the trunk's): `a`
    uniform in +-1/sqrt(in), `b` zero, so that the adapted model is its base."""
    words = np.asarray(jax.random.key_data(key), np.uint32).ravel().tolist()
    adapters = {}
    for target, shapes in adapter_shapes(model, lora).items():
        rng = np.random.default_rng([*words, zlib.crc32(f"{ADAPTERS}/{name}/{target}".encode())])
        bound = 1.0 / np.sqrt(shapes["a"][1])
        adapters[target] = {
            "a": rng.uniform(-bound, bound, shapes["a"]).astype(np.float32),
            "b": np.zeros(shapes["b"], np.float32),
        }
    return adapters


def adapted(params: Params, trunk: str, lora: LoRASpec | None) -> Adapted | None:
    """The adapters of `trunk` in a policy's `params`, for `llama.run_layers`; None where the
    policy has none (no LoRA, or the base alone: `without_adapters`)."""
    if lora is None or ADAPTERS not in params:
        return None
    return Adapted(params[ADAPTERS][trunk], lora.scale)


def without_adapters(params: Params) -> Params:
    """A policy's parameters without its adapters: its frozen base, the policy it started as
    (the KL reference of a LoRA run: no second copy of the model is kept)."""
    return {name: tree for name, tree in params.items() if name != ADAPTERS}


def merged_trunk(trunk_params: Params, adapters: Params, lora: LoRASpec) -> Params:
    """A trunk with its adapters folded in (`W + scale * a @ b` per layer), as host arrays in
    the base's dtype: the plain model that computes what the adapted one does (for export)."""
    layers = dict(trunk_params["layers"])
    for target, adapter in adapters.items():
        weight = np.asarray(layers[target])
        delta = np.einsum(
            "lir,lro->lio",
            np.asarray(adapter["a"], np.float32),
            np.asarray(adapter["b"], np.float32),
        )
        layers[target] = (weight.astype(np.float32) + lora.scale * delta).astype(weight.dtype)
    return trunk_params | {"layers": layers}


def plain_trunks(params: Params, lora: LoRASpec | None) -> dict[str, Params]:
    """Each trunk of a Llama-family policy (`"policy"`, and `"critic"` where separate) as the
    plain weights of its model: as they are, or under LoRA its base with its adapters folded
    in (`merged_trunk`)."""
    if lora is None:
        return {name: params[name] for name in ("policy", "critic") if name in params}
    return {
        name: merged_trunk(params["policy"], adapters, lora)
        for name, adapters in params[ADAPTERS].items()
    }
