"""The learner's model on text envs: a language-model actor-critic trained by token-level PPO
(`algorithms.token_ppo`), with the initial parameters kept frozen as the reference policy (under
LoRA: the base the adapters adapt, frozen, and no copy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.algorithms.ppo import float32_moments, make_optimizer
from agentenv_jax.algorithms.token_ppo import (
    Finetuning,
    TokenPPOHyperparams,
    TokenTrainState,
    make_token_ppo_update,
)
from agentenv_jax.config.schema import ExperimentConfig, LanguageModelConfig, PPOConfig
from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.networks.lora import ADAPTERS, without_adapters
from agentenv_jax.networks.text_models import initial_language_model_params, language_model_for


def token_ppo_hyperparams(algo: PPOConfig, text: TextSpec) -> TokenPPOHyperparams:
    return TokenPPOHyperparams(
        num_epochs=algo.num_epochs,
        num_minibatches=algo.num_minibatches,
        gamma=algo.gamma,
        gae_lambda=algo.gae_lambda,
        clip_eps=algo.clip_eps,
        value_clip_eps=algo.value_clip_eps,
        vf_coef=algo.vf_coef,
        ent_coef=algo.ent_coef,
        normalize_advantages=algo.normalize_advantages,
        kl_coef=algo.kl_coef,
        kl_penalty=algo.kl_penalty,
        advantage=algo.advantage,
        group_size=algo.group_size,
        kl_estimator=algo.kl_estimator,
        scale_group_rewards=algo.scale_group_rewards,
        loss_aggregation=algo.loss_aggregation,
        clip_eps_high=algo.clip_eps_high,
        importance_ratio=algo.importance_ratio,
        dynamic_sampling=algo.dynamic_sampling,
        overlong_buffer=algo.overlong_buffer,
        overlong_penalty=algo.overlong_penalty,
        importance_weight_cap=algo.importance_weight_cap if algo.max_policy_lag > 0 else None,
        response_length=text.response_length,
        round_length=text.episode_round,
    )


def _base_of(params: Any, ref_params: Any) -> Any:
    return without_adapters(params)


def finetuning_of(config: LanguageModelConfig) -> Finetuning:
    """What token-level PPO trains: every parameter, or with `lora.rank` the adapters and the
    value head, against the frozen base as the reference."""
    if not config.lora.rank:
        return Finetuning()
    return Finetuning(trained=(ADAPTERS, "value_head"), reference=_base_of)


def language_model_training(
    config: ExperimentConfig,
    text: TextSpec,
    total_updates: int,
    constrain_rows: Callable[[jax.Array], jax.Array],
):
    """The parts of a text env's `OnPolicyModel` (param_shapes, init_params, update,
    train_state): the transformer of `network.language_model`, its parameters (random or
    `init_from` or pretrained) stored in `param_dtype` (bfloat16: the optimizer's moments stay
    float32), and token-level PPO."""
    algo = config.algorithm  # PPO: other algorithms are refused at start-up
    lm_config = config.network.language_model
    lm = language_model_for(lm_config, text)
    optimizer = make_optimizer(
        algo.learning_rate,
        algo.lr_schedule == "linear",
        total_updates * algo.num_epochs * algo.num_minibatches,
        algo.max_grad_norm,
        algo.adam_eps,
    )
    param_dtype = jnp.dtype(lm_config.param_dtype)
    if param_dtype != jnp.float32:
        optimizer = float32_moments(optimizer)

    def init_params(key: jax.Array) -> Any:
        params = initial_language_model_params(lm, lm_config, key)
        return jax.tree.map(lambda x: np.asarray(x).astype(param_dtype), params)

    def score(params: Any, context: jax.Array, response: jax.Array):
        return tuple(lm.score(params, context, response, text.pad_id, text.eos_id))

    def packed_score(params: Any, packed: Any, response: jax.Array):
        return tuple(lm.packed_score(params, packed, response, text.pad_id, text.eos_id))

    finetuning = finetuning_of(lm_config)
    update = make_token_ppo_update(
        score,
        optimizer,
        token_ppo_hyperparams(algo, text),
        constrain_rows,
        finetuning,
        packed_score,
    )

    def train_state(params: Any, key: jax.Array) -> TokenTrainState:
        return TokenTrainState(
            params=params,
            # The reference is the initial policy, frozen: a copy, since the update donates
            # the state and `params` moves on; under LoRA the base, which does not move.
            ref_params=None if finetuning.trained else jax.tree.map(jnp.copy, params),
            opt_state=optimizer.init(finetuning.part(params)),
            update_count=jnp.zeros((), jnp.int32),
            key=key,
        )

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, param_dtype), lm.param_shapes())
    return (
        shapes,
        init_params,
        update,
        train_state,
    )
