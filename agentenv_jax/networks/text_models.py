"""The language-model policy of a text env, from the config: its shape (`network.language_model`
over the env's `TextSpec`) and its first parameters (random, or a user's local checkpoint)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import LanguageModelConfig
from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.networks.generation import Generation, generate
from agentenv_jax.networks.language_model import (
    LanguageModel,
    language_model_spec,
    make_language_model,
)

_DIMENSIONS = ("d_model", "num_layers", "num_heads", "mlp_dim")


def language_model_for(config: LanguageModelConfig, text: TextSpec) -> LanguageModel:
    """The transformer of `config` over `text`'s vocabulary; its positions cover a context and
    one response (`context_length + response_length`)."""
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
    """Random parameters drawn from `key`, or the weights of `config.init_from` (checked
    against the model's shapes; `CheckpointError` names the first leaf that does not fit)."""
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
