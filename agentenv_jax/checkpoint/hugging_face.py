"""Reading a local Hugging Face model folder: `config.json` and the weights in
`model.safetensors`, or in the shards a `model.safetensors.index.json` lists, read with the
`safetensors` library into host arrays in the layout of `networks.llama`."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agentenv_jax.checkpoint.weight_files import require_whole_safetensors
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.networks.llama import LlamaSpec, Params, parameter_shapes, spec_from_config

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"

# Each parameter of a layer: the checkpoint's tensor (after `model.layers.{i}.`), and whether
# it is a torch `Linear.weight` (`[out, in]`, stored here transposed).
_LAYER_TENSORS = {
    "input_layernorm": ("input_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "o_bias": ("self_attn.o_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "post_attention_layernorm": ("post_attention_layernorm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
    "gate_bias": ("mlp.gate_proj.bias", False),
    "up_bias": ("mlp.up_proj.bias", False),
    "down_bias": ("mlp.down_proj.bias", False),
}


def read_spec(folder: str | Path) -> LlamaSpec:
    """The model spec of folder `folder`'s `config.json`."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{folder}: no config.json; a Hugging Face model folder holds config.json and "
            f"{_SINGLE} (or {_INDEX} and its shards)"
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    return spec_from_config(config, str(path))


def _shards(folder: Path) -> list[Path]:
    """The shards `model.safetensors.index.json` lists, each checked to be there; `ConfigError`
    naming the index and the first shard missing."""
    index = folder / _INDEX
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        tensors_of: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            tensors_of.setdefault(str(file), []).append(str(name))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{index}: not valid JSON ({err})") from None
    except (KeyError, TypeError, AttributeError):
        raise ConfigError(
            f'{index}: no "weight_map" table of tensor names to shard files'
        ) from None
    for file, names in sorted(tensors_of.items()):
        if not (folder / file).is_file():
            more = f" and {len(names) - 1} more tensors" if len(names) > 1 else ""
            raise ConfigError(
                f"{index} names shard {file!r} (for {min(names)!r}{more}), which is missing "
                f"from {folder}: download it there"
            )
    return [folder / file for file in sorted(tensors_of)]


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of the folder: the index's shards, else the single file."""
    if (folder / _INDEX).is_file():
        return _shards(folder)
    if (folder / _SINGLE).is_file():
        return [folder / _SINGLE]
    raise ConfigError(f"{folder}: no {_SINGLE} or {_INDEX}")


def read_tensors(folder: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors files, by its name in the checkpoint;
    `ConfigError` naming a file that is missing, a git-LFS pointer, truncated or unreadable."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, np.ndarray] = {}
    for path in _weight_files(Path(folder)):
        require_whole_safetensors(path)
        try:
            with safe_open(path, framework="numpy") as file:
                tensors |= {name: file.get_tensor(name) for name in file.keys()}
        except SafetensorError as err:  # damage the checks above do not see
            raise ConfigError(f"{path}: not a readable safetensors file ({err})") from None
    return tensors


def params_from_tensors(spec: LlamaSpec, tensors: Mapping[str, np.ndarray], where: str) -> Params:
    """The `networks.llama` parameters from a checkpoint's tensors; `ConfigError` naming the
    tensor that is missing or whose shape does not fit `spec`."""
    shapes = parameter_shapes(spec)

    def take(name: str, shape: tuple[int, ...], transpose: bool) -> np.ndarray:
        if name not in tensors:
            raise ConfigError(f"{where}: tensor {name!r} is missing")
        value = tensors[name].T if transpose else tensors[name]
        if value.shape != shape:
            stored = tensors[name].shape
            wanted = shape[::-1] if transpose else shape
            raise ConfigError(
                f"{where}: tensor {name!r} has shape {list(stored)}; config.json implies "
                f"{list(wanted)}"
            )
        return value

    layers = {}
    for key, shape in shapes["layers"].items():
        suffix, transpose = _LAYER_TENSORS[key]
        layers[key] = np.stack(
            [
                take(f"model.layers.{i}.{suffix}", shape[1:], transpose)
                for i in range(spec.num_layers)
            ]
        )
    params: Params = {
        "embed_tokens": take("model.embed_tokens.weight", shapes["embed_tokens"], False),
        "layers": layers,
        "norm": take("model.norm.weight", shapes["norm"], False),
    }
    if not spec.tie_word_embeddings:
        params["lm_head"] = take("lm_head.weight", shapes["lm_head"], True)
    return params


def load_folder(folder: str | Path) -> tuple[LlamaSpec, Params]:
    """The spec and host parameters of a local Hugging Face model folder."""
    spec = read_spec(folder)
    return spec, params_from_tensors(spec, read_tensors(folder), str(folder))


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def config_from_spec(spec: LlamaSpec, **extra: Any) -> dict[str, Any]:
    """The `config.json` of `spec` (the inverse of `spec_from_config`), with `extra` fields
    (token ids, say) added."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling is not None:
        rope = dataclasses.asdict(spec.rope_scaling) | {"rope_theta": spec.rope_theta}
    config = {
        "architectures": [_ARCHITECTURES[spec.model_type]],
        "model_type": spec.model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_parameters": rope,
        "mlp_bias": spec.mlp_bias,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "dtype": "float32",
    }
    if spec.model_type != "qwen2":  # Qwen2 always has q/k/v biases and no such field
        config["attention_bias"] = spec.qkv_bias
    return config | extra


def tensors_from_params(spec: LlamaSpec, params: Params, prefix: str = "") -> dict[str, np.ndarray]:
    """The checkpoint's tensors of `networks.llama` parameters (the inverse of
    `params_from_tensors`), float32, each name after `prefix`."""
    tensors = {
        "model.embed_tokens.weight": params["embed_tokens"],
        "model.norm.weight": params["norm"],
    }
    if not spec.tie_word_embeddings:
        tensors["lm_head.weight"] = np.asarray(params["lm_head"]).T
    for key, stacked in params["layers"].items():
        suffix, transpose = _LAYER_TENSORS[key]
        for i in range(spec.num_layers):
            layer = np.asarray(stacked[i])
            tensors[f"model.layers.{i}.{suffix}"] = layer.T if transpose else layer
    return {
        prefix + name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()
    }


def _umask() -> int:
    """The process's umask: Linux shows it in /proc; elsewhere it is read by setting it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    # NOTE: for the instant between these calls the mask is the strictest one, so that a file
    # another thread creates meanwhile is never more open than its owner asked.
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def save_tensors(
    tensors: Mapping[str, np.ndarray], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.numpy.save_file`, leaving the file readable as an ordinary write does
    (mode 0666 less the umask, 0644 under the usual 022): safetensors writes its files 0600."""
    from safetensors.numpy import save_file

    save_file(dict(tensors), path, metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def save_folder(folder: str | Path, spec: LlamaSpec, params: Params, **config: Any) -> None:
    """Write `config.json` and `model.safetensors` of a model to `folder` (made if missing),
    as `transformers`' `save_pretrained` lays them out."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_from_spec(spec, **config), indent=2))
    save_tensors(tensors_from_params(spec, params), folder / _SINGLE, metadata={"format": "pt"})
