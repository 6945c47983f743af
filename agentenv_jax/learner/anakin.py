"""Anakin (Podracer, Hessel et al. 2021): acting and learning as one jitted step, for JAX envs.

One call of the step collects `T` steps from `E` envs (`vmap` over envs, `lax.scan` over time)
and runs the configured on-policy update on that rollout: the same `make_on_policy_update`,
GAE / V-trace and losses as the Gymnasium path, fed the same `[T, E]` rollout layout. The env
axis is sharded over the mesh's `data` axis, so each device steps its own slice of the envs;
parameters and optimizer state are replicated and XLA inserts the gradient all-reduce, as in
`learner.loop.jit_sharded_update`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agentenv_jax.algorithms.ppo import Batch, Params, TrainState
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.envs.jax_envs import EnvCarry, JaxEnv
from agentenv_jax.learner.on_policy_model import make_on_policy_update, num_updates
from agentenv_jax.networks import (
    ActionDistribution,
    action_distribution,
    actor_critic_for,
    init_params,
)
from agentenv_jax.parallel.mesh import (
    BATCH_AXIS,
    env_axis_sharding,
    make_mesh,
    replicated,
    row_constraint,
)

ApplyFn = Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]]


@flax.struct.dataclass
class AnakinState:
    """The learner's whole state, one pytree for one checkpoint: `TrainState`'s fields (so the
    parameters sit at `params`, as in every other run's checkpoint) and the envs mid-episode, so
    that a resumed run continues the very episodes it was interrupted in."""

    params: Params
    opt_state: optax.OptState
    update_count: jax.Array  # int32 scalar, completed updates
    key: jax.Array  # PRNG key: minibatch shuffling, action noise, env randomness
    envs: EnvCarry  # every leaf `[E, ...]`

    def train_state(self, key: jax.Array) -> TrainState:
        return TrainState(self.params, self.opt_state, self.update_count, key)


def make_rollout_fn(
    apply_fn: ApplyFn,
    distribution: ActionDistribution,
    jax_env: JaxEnv,
    rollout_length: int,
    constrain_envs: Callable[[jax.Array], jax.Array] = lambda x: x,
) -> Callable[[Params, EnvCarry, jax.Array], tuple[EnvCarry, Batch, Batch]]:
    """Return `rollout(params, envs, key) -> (envs, rollout, episodes)`.

    `rollout` is the update's layout: `obs [T, E, ...]`, `action [T, E, ...]`, float32 `[T, E]`
    `reward`, `log_prob`, `value`, `bootstrap_value` (V(final observation) where truncated),
    bool `terminated`, `truncated`, float32 `valid` (all 1: JAX envs emit no padding rows), and
    `last_value [E]`, `last_obs [E, ...]`. `episodes` holds `episode_return [T, E]` float32 and
    `episode_length [T, E]` int32 of the episodes that ended at each step (0 elsewhere).
    `constrain_envs` keeps every `[E, ...]` array split over the mesh (identity on one device).
    """
    noise_size = jax_env.spaces.action_size
    draw_noise = jax.random.gumbel if distribution.noise == "gumbel" else jax.random.normal

    def rollout(params: Params, envs: EnvCarry, key: jax.Array):
        num_envs = envs.obs.shape[0]

        def act_and_step(envs: EnvCarry, key: jax.Array):
            noise_key, env_key = jax.random.split(key)
            head, value = apply_fn(params, envs.obs)
            noise = constrain_envs(draw_noise(noise_key, (num_envs, noise_size)))
            action = distribution.sample(head, noise)
            env_keys = constrain_envs(jax.random.split(env_key, num_envs))
            next_envs, result = jax_env.step(env_keys, envs, action)
            next_envs = jax.tree.map(constrain_envs, next_envs)
            _, final_value = apply_fn(params, result.final_obs)
            transition = {
                "obs": envs.obs,
                "action": action,
                "reward": result.reward,
                "log_prob": distribution.log_prob(head, action),
                "value": value,
                "bootstrap_value": jnp.where(result.truncated, final_value, 0.0),
                "terminated": result.terminated,
                "truncated": result.truncated,
                "valid": jnp.ones_like(result.reward),
            }
            ended = {
                "episode_return": result.episode_return,
                "episode_length": result.episode_length,
            }
            return next_envs, (transition, ended)

        keys = jax.random.split(key, rollout_length)
        envs, (batch, episodes) = jax.lax.scan(act_and_step, envs, keys)
        _, batch["last_value"] = apply_fn(params, envs.obs)
        batch["last_obs"] = envs.obs
        return envs, batch, episodes

    return rollout


def make_anakin_step(
    rollout_fn: Callable[[Params, EnvCarry, jax.Array], tuple[EnvCarry, Batch, Batch]],
    update: Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]],
) -> Callable[[AnakinState], tuple[AnakinState, dict[str, Any]]]:
    """Return `step(state) -> (state, outputs)`: one rollout, then one update on it.

    `outputs` holds the update's `metrics` (scalars, `trained_rows` among them) and the
    rollout's `episode_return` / `episode_length` `[T, E]` (see `make_rollout_fn`).
    """

    def step(state: AnakinState) -> tuple[AnakinState, dict[str, Any]]:
        key, rollout_key = jax.random.split(state.key)
        envs, batch, episodes = rollout_fn(state.params, state.envs, rollout_key)
        train, metrics = update(state.train_state(key), batch)
        new_state = AnakinState(train.params, train.opt_state, train.update_count, train.key, envs)
        return new_state, {"metrics": metrics, **episodes}

    return step


def state_shardings(mesh: Mesh) -> AnakinState:
    """A sharding prefix tree for `AnakinState`: envs split on their leading axis, the rest
    replicated."""
    rep = replicated(mesh)
    return AnakinState(rep, rep, rep, rep, NamedSharding(mesh, PartitionSpec(BATCH_AXIS)))


@dataclasses.dataclass(frozen=True)
class Anakin:
    """An experiment's Anakin learner, built: its mesh, initial state and jitted step."""

    mesh: Mesh
    num_updates: int  # updates in the whole run (for annealing and the budget)
    state: AnakinState  # the initial state, placed on the mesh
    step: Callable[[AnakinState], tuple[AnakinState, dict[str, Any]]]  # jitted, state donated


def build_anakin(config: ExperimentConfig, jax_env: JaxEnv, num_devices: int) -> Anakin:
    """The initial state and jitted step of `config` on a mesh of `num_devices` local devices.

    Keys: the parameters are initialized from `PRNGKey(run.seed)` as on the Gymnasium path; the
    envs reset from a key split off the training key."""
    spaces = jax_env.spaces
    mesh = make_mesh(num_devices)
    total_updates = num_updates(config)
    module, apply_fn = actor_critic_for(config.network, spaces)
    distribution = action_distribution(spaces.action_kind, spaces.action_nvec)
    update, optimizer = make_on_policy_update(
        config, apply_fn, distribution, total_updates, row_constraint(mesh)
    )
    env_rows = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    rollout_fn = make_rollout_fn(
        apply_fn,
        distribution,
        jax_env,
        config.algorithm.rollout_length,
        lambda x: jax.lax.with_sharding_constraint(x, env_rows),
    )
    shardings = state_shardings(mesh)
    step = jax.jit(
        make_anakin_step(rollout_fn, update),
        in_shardings=(shardings,),
        out_shardings=(
            shardings,
            {
                "metrics": replicated(mesh),
                "episode_return": env_axis_sharding(mesh, 2),
                "episode_length": env_axis_sharding(mesh, 2),
            },
        ),
        donate_argnums=(0,),
    )

    init_key, train_key = jax.random.split(jax.random.PRNGKey(config.run.seed))
    train_key, env_key = jax.random.split(train_key)
    params = init_params(module, spaces.obs_shape, init_key)
    reset = jax.jit(jax_env.reset, out_shardings=env_rows)
    state = AnakinState(
        params=params,
        opt_state=jax.jit(optimizer.init)(params),
        update_count=jnp.zeros((), jnp.int32),
        key=train_key,
        envs=reset(jax.random.split(env_key, config.env.global_num_envs)),
    )
    return Anakin(mesh, total_updates, jax.device_put(state, shardings), step)
