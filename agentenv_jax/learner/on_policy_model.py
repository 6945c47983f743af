"""What an on-policy learner trains, from the config and the env's spaces: the model (an MLP or
CNN actor-critic, or a language model on text envs), the configured algorithm's pure update
(PPO, IMPALA, token-level PPO) and the train state around them; and the run's update counts."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from agentenv_jax.algorithms.impala import IMPALAHyperparams, make_impala_update
from agentenv_jax.algorithms.ppo import (
    PPOHyperparams,
    RowGroups,
    TrainState,
    cpu_unrolls,
    make_optimizer,
    make_ppo_update,
)
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import ExperimentConfig, IMPALAConfig, PPOConfig
from agentenv_jax.envs.factory import EnvSpaces
from agentenv_jax.networks import (
    ActionDistribution,
    action_distribution,
    actor_critic_for,
    init_params,
)
from agentenv_jax.networks.actor_critic import actor_critic_param_shapes
from agentenv_jax.networks.grouped import row_groups


def num_updates(config: ExperimentConfig, agents_per_env: int = 1) -> int:
    """Updates in a run: enough synchronous rollouts to cover `run.total_env_steps` (in a
    multi-agent env, steps of its `agents_per_env` agents)."""
    per_update = config.algorithm.rollout_length * config.env.global_num_envs * agents_per_env
    return math.ceil(config.run.total_env_steps / per_update)


def minibatch_size(config: ExperimentConfig, agents_per_env: int = 1) -> int:
    """Rows per gradient step (the whole rollout for IMPALA)."""
    rows = config.algorithm.rollout_length * config.env.global_num_envs * agents_per_env
    return rows // getattr(config.algorithm, "num_minibatches", 1)


def gradient_data_axis(config: ExperimentConfig, spaces: EnvSpaces, mesh: Any) -> str | None:
    """The mesh axis PPO's update sums each step's gradients over in one psum
    (`topology.gradient_sync`: `make_ppo_update`'s `data_axis`), or None for XLA's own
    reduction; auto takes one_psum wherever it applies and the data axis has several devices.
    `one_psum` is for PPO on a 1-D mesh (an MLP or CNN actor-critic); a `ConfigError`
    elsewhere."""
    from agentenv_jax.parallel.mesh import BATCH_AXIS

    choice = config.topology.gradient_sync
    eligible = (
        config.algorithm.name == "ppo" and spaces.text is None and config.topology.model_axis == 1
    )
    if choice == "one_psum" and not eligible:
        raise ConfigError(
            "topology.gradient_sync = 'one_psum' is for PPO on a 1-D mesh; this run has "
            f"algorithm.name = {config.algorithm.name!r}, env.id = {config.env.id!r}"
            f"{' (a text env)' if spaces.text is not None else ''} and topology.mesh.model = "
            f"{config.topology.model_axis}: expected 'auto' or 'xla'"
        )
    if choice == "auto":
        shards = mesh.shape[BATCH_AXIS]
        choice = "one_psum" if eligible and shards > 1 else "xla"
    return BATCH_AXIS if choice == "one_psum" else None


def make_on_policy_update(
    config: ExperimentConfig,
    apply_fn: Callable,
    distribution: ActionDistribution,
    total_updates: int,
    constrain_rows: Callable[[jax.Array], jax.Array],
    groups: RowGroups | None = None,
    data_axis: str | None = None,
    unroll: bool = False,
) -> tuple[Callable, optax.GradientTransformation]:
    """The pure update of the configured on-policy algorithm (PPO or IMPALA) and its optimizer;
    `groups`: a multi-agent env's agent groups, for PPO's per-group loss metrics; `data_axis`:
    PPO's update as one shard's part (`gradient_data_axis`); `unroll`: PPO's gradient steps
    written out (`PPOHyperparams.unroll`)."""
    algo = config.algorithm
    gradient_steps = total_updates * (
        algo.num_epochs * algo.num_minibatches if isinstance(algo, PPOConfig) else 1
    )
    optimizer = make_optimizer(
        algo.learning_rate,
        algo.lr_schedule == "linear",
        gradient_steps,
        algo.max_grad_norm,
        algo.adam_eps,
    )
    if isinstance(algo, IMPALAConfig):
        hp = IMPALAHyperparams(
            gamma=algo.gamma,
            clip_rho=algo.clip_rho,
            clip_c=algo.clip_c,
            clip_pg_rho=algo.clip_pg_rho,
            vf_coef=algo.vf_coef,
            ent_coef=algo.ent_coef,
            normalize_advantages=algo.normalize_advantages,
        )
        return make_impala_update(apply_fn, distribution, optimizer, hp), optimizer
    hp = PPOHyperparams(
        num_epochs=algo.num_epochs,
        num_minibatches=algo.num_minibatches,
        gamma=algo.gamma,
        gae_lambda=algo.gae_lambda,
        clip_eps=algo.clip_eps,
        anneal_clip=algo.clip_schedule == "linear",
        value_clip_eps=algo.value_clip_eps,
        vf_coef=algo.vf_coef,
        ent_coef=algo.ent_coef,
        normalize_advantages=algo.normalize_advantages,
        num_updates=total_updates,
        unroll=unroll,
    )
    update = make_ppo_update(
        apply_fn,
        distribution,
        optimizer,
        hp,
        constrain_rows=constrain_rows,
        groups=groups,
        data_axis=data_axis,
    )
    return update, optimizer


class OnPolicyModel(NamedTuple):
    """What the learner trains, built from the config and the env's spaces: the abstract
    parameters, their initialization, the pure update and the train state around them."""

    param_shapes: Any  # pytree of jax.ShapeDtypeStruct
    init_params: Callable[[jax.Array], Any]  # key -> parameters (host arrays)
    update: Callable  # (state, rollout) -> (state, metrics)
    train_state: Callable[[Any, jax.Array], Any]  # (params, key) -> state


def on_policy_model(
    config: ExperimentConfig,
    spaces: EnvSpaces,
    total_updates: int,
    constrain_rows: Callable[[jax.Array], jax.Array],
    data_axis: str | None = None,
) -> OnPolicyModel:
    """The actor-critic of `spaces` (an MLP or CNN; a language model on text envs) and the
    configured algorithm's update for it (`data_axis` as for `make_on_policy_update`)."""
    if spaces.text is not None:
        from agentenv_jax.learner.text_training import language_model_training

        return OnPolicyModel(
            *language_model_training(config, spaces.text, total_updates, constrain_rows)
        )
    module, apply_fn = actor_critic_for(config.network, spaces)
    torso = getattr(module, "torso", "mlp")  # (per-group policies of multi-agent envs: MLPs)
    update, optimizer = make_on_policy_update(
        config,
        apply_fn,
        action_distribution(spaces.action_kind, spaces.action_nvec),
        total_updates,
        constrain_rows,
        agent_row_groups(spaces),
        data_axis,
        unroll=cpu_unrolls(jax.default_backend(), torso, spaces.obs_shape),
    )

    def train_state(params: Any, key: jax.Array) -> TrainState:
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            update_count=jnp.zeros((), jnp.int32),
            key=key,
        )

    return OnPolicyModel(
        actor_critic_param_shapes(module, spaces.obs_shape),
        lambda key: init_params(module, spaces.obs_shape, key),
        update,
        train_state,
    )


def agent_row_groups(spaces: EnvSpaces) -> RowGroups | None:
    """A multi-agent env's agent groups, when it has more than one."""
    if len(spaces.group_names) < 2:
        return None
    obs_ndim, id_at, agent_groups = len(spaces.obs_shape), spaces.agent_id_at, spaces.agent_groups
    return RowGroups(spaces.group_names, lambda obs: row_groups(obs, obs_ndim, id_at, agent_groups))
