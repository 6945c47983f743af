"""What the SAC learner trains with: the networks of an experiment, its optimizers, the update
jitted over the device mesh (state replicated, batch rows sharded), and the initial state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agentenv_jax.algorithms.sac import SACHyperparams, init_sac_state, make_sac_update
from agentenv_jax.config.schema import ExperimentConfig, SACConfig
from agentenv_jax.envs.factory import EnvSpaces
from agentenv_jax.learner.ahead_of_time import CompiledAhead
from agentenv_jax.networks.flat_params import FlatLayout
from agentenv_jax.networks.sac_networks import make_sac_networks
from agentenv_jax.parallel.mesh import (
    BATCH_AXIS,
    place_on_mesh,
    replicated,
    row_constraint,
)


def sac_networks_for(config: ExperimentConfig, spaces: EnvSpaces):
    """The SAC networks of an experiment (shared by learner and env ranks)."""
    return make_sac_networks(
        spaces.obs_shape,
        spaces.action_size,
        config.network.actor_hidden,
        config.network.critic_hidden,
        config.network.activation,
    )


@dataclasses.dataclass(frozen=True)
class SACTraining:
    """`update(state, batch) -> (state, metrics, td_errors)`, jitted with the state donated;
    the initial state, on the mesh; and the actor parameters' flattening for broadcasts."""

    update: Callable
    initial_state: Any
    ravel_actor: Callable


def make_sac_training(
    config: ExperimentConfig, spaces: EnvSpaces, mesh: Mesh, batch_shapes: dict[str, Any]
) -> SACTraining:
    """`batch_shapes`: the `jax.ShapeDtypeStruct` of each field of the batches the update will
    get; the update is compiled for them on a background thread (`CompiledAhead`) while the
    replay fills up to `learning_starts`."""
    algo = config.algorithm
    assert isinstance(algo, SACConfig)
    networks = sac_networks_for(config, spaces)
    actor_opt = optax.adam(algo.actor_learning_rate)
    critic_opt = optax.adam(algo.critic_learning_rate)
    alpha_opt = optax.adam(algo.alpha_learning_rate)
    target_entropy = (
        -float(spaces.action_size) if algo.target_entropy is None else algo.target_entropy
    )
    update = make_sac_update(
        networks.actor_apply,
        networks.critic_apply,
        actor_opt,
        critic_opt,
        alpha_opt,
        SACHyperparams(algo.tau, target_entropy),
        constrain_rows=row_constraint(mesh),
    )

    def train_state(actor_params: Any, critic_params: Any, key: jax.Array) -> Any:
        return init_sac_state(
            actor_params, critic_params, actor_opt, critic_opt, alpha_opt, algo.initial_alpha, key
        )

    state_sharding = replicated(mesh)
    row_sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    # TD errors stay sharded like the rows: each learner reads back those of its own rows,
    # which came from its own partitions (`ReplayLearner`).
    jitted_update = jax.jit(
        update,
        in_shardings=(state_sharding, row_sharding),
        out_shardings=(state_sharding, state_sharding, row_sharding),
        donate_argnums=(0,),
    )
    abstract_state = jax.eval_shape(
        train_state,
        *networks.param_shapes,
        jax.ShapeDtypeStruct((2,), jnp.uint32),
    )
    compiled_update = CompiledAhead(jitted_update, abstract_state, batch_shapes)
    init_key, train_key = jax.random.split(jax.random.PRNGKey(config.run.seed))
    actor_params, critic_params = networks.init(init_key)
    state = jax.jit(train_state)(actor_params, critic_params, train_key)
    return SACTraining(
        update=compiled_update,
        initial_state=place_on_mesh(mesh, state),
        ravel_actor=jax.jit(FlatLayout(actor_params).ravel, out_shardings=state_sharding),
    )
