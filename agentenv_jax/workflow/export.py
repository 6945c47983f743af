"""`agentenv export RUN_DIR OUT_DIR`: a trained pretrained-model policy as a Hugging Face folder
that `transformers.AutoModelForCausalLM.from_pretrained` loads (and vLLM serves, and llama.cpp
converts): `config.json`, `model.safetensors`, `generation_config.json`, the tokenizer files and
the chat template, and nothing else at the top level. The value head (and a separate critic's
trunk) goes into a subfolder, `critic/value_head.safetensors`: vLLM and llama.cpp's converter,
given no index file, read every `*.safetensors` at the top level and stop on tensors the model
does not have. A LoRA run's adapters are folded into the weights they adapt. Files and folders
are written as any file is (0644 and 0755 under the usual umask).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from agentenv_jax.checkpoint.run_folder import restore_kept
from agentenv_jax.checkpoint.store import CheckpointError
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.envs.text.registry import is_text_env

# The value head's tensors (`value_head.kernel` `[hidden, 1]`, `value_head.bias` `[1]`) and a
# separate critic's trunk (its checkpoint names after `critic.`), float32, relative to OUT_DIR.
VALUE_HEAD_FILE = "critic/value_head.safetensors"


def export_run(run_dir: str | Path, out_dir: str | Path, checkpoint: int | None = None) -> Path:
    """Write the policy of `run_dir`'s checkpoint `checkpoint` (the newest when None) to
    `out_dir` (which must not hold files yet); the folder written."""
    from agentenv_jax.checkpoint.hugging_face import save_folder, save_tensors, tensors_from_params
    from agentenv_jax.networks.lora import lora_spec, plain_trunks
    from agentenv_jax.networks.text_models import pretrained_spec, text_tokenizer

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"OUT_DIR = {str(out_dir)!r} exists and is not an empty folder")
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(f"{run_dir} is not a run folder: it has no config.yaml")
    config = load_config(run_dir / "config.yaml")
    model = config.network.language_model
    if not is_text_env(config.env.id) or model.pretrained is None:
        raise ConfigError(
            f"{run_dir}: export writes pretrained language models (network.language_model."
            "pretrained); this run's policy is agentenv_jax's own network"
        )
    spec = pretrained_spec(model.pretrained)
    tokenizer = text_tokenizer(model)
    _, state, _ = restore_kept(run_dir, config.checkpoint.keep, checkpoint)
    params = {name: _host(tree) for name, tree in state["params"].items()}
    ids = {
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
    }
    trunks = plain_trunks(params, lora_spec(model.lora))
    save_folder(out_dir, spec, trunks["policy"], **ids)
    (out_dir / "generation_config.json").write_text(json.dumps(ids, indent=2))
    tokenizer.save(out_dir)
    value = {f"value_head.{name}": array for name, array in params["value_head"].items()}
    if "critic" in trunks:
        value |= tensors_from_params(spec, trunks["critic"], prefix="critic.")
    (out_dir / VALUE_HEAD_FILE).parent.mkdir()
    save_tensors(value, out_dir / VALUE_HEAD_FILE)
    return out_dir


def _host(tree):
    import jax

    return jax.tree.map(lambda leaf: np.asarray(leaf, np.float32), tree)
