"""PPO and SAC updates on a global mesh of two learner processes equal the updates on one
device; run by tests/test_multi_learner.py as `mpiexec -n 2` with 2 host devices per process.

Both processes start JAX's distributed runtime the way learners do (the coordinator address
agreed over their MPI communicator, gloo collectives). For PPO they build the same random
rollout and each contributes its half of the env axis to the global rollout on the 4-device
mesh; the same with `data_axis` (`topology.gradient_sync: one_psum`) against that update's
4 shards emulated on one device, and both compiled programs' collectives counted; for SAC
(`pendulum_sac`'s networks and optimizers, as the replay learner builds them)
each contributes its half of the rows of a random replay batch, as each learner does with the
rows it drew from its own env ranks' partitions. Each process also runs the same updates on one
of its own devices. Prints `RESULT {json}` on every rank: `max_param_diff` and `loss_diff` for
PPO, `one_psum_max_param_diff` and the all-reduce counts for one_psum, `sac_max_param_diff`
for SAC.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from agentenv_jax.algorithms.ppo import make_ppo_update
from agentenv_jax.config.loading import load_config
from agentenv_jax.envs.spaces import EnvSpaces
from agentenv_jax.learner.loop import (
    ROLLOUT_LAST_FIELDS,
    jit_sharded_update,
    rollout_shardings,
)
from agentenv_jax.learner.replay_loop import BATCH_FIELDS
from agentenv_jax.learner.sac_training import make_sac_training
from agentenv_jax.networks import action_distribution
from agentenv_jax.parallel.distributed import start_distributed
from agentenv_jax.parallel.hlo_collectives import collective_operands
from agentenv_jax.parallel.mesh import (
    BATCH_AXIS,
    make_mesh,
    place_on_mesh,
    row_constraint,
    to_global,
)
from agentenv_jax.transport.mpi import MPIWorld
from agentenv_jax.transport.mpi.learners import split_learner_group

from test_ppo import make_rollout, make_update_setup, shards_emulated

UPDATES = 3
ENVS = 8


def initial_params() -> list[np.ndarray]:
    _, _, _, state = make_update_setup(num_minibatches=2, seed=3)
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def run_updates(mesh, rollout, data_axis=None) -> tuple[list[np.ndarray], dict[str, float], int]:
    """`UPDATES` updates on `mesh`: the parameters, the last metrics and the all-reduces one
    call of the compiled update runs."""
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=2, seed=3)
    update = jit_sharded_update(
        make_ppo_update(
            apply_fn,
            action_distribution("discrete"),
            optimizer,
            hp,
            constrain_rows=row_constraint(mesh),
            data_axis=data_axis,
        ),
        mesh,
        None,
        data_axis,
    )
    state = place_on_mesh(mesh, state)
    compiled = update.lower(state, rollout).compile()
    all_reduces = collective_operands(compiled.as_text()).get("all-reduce", 0)
    for _ in range(UPDATES):
        state, metrics = compiled(state, rollout)
    params = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    return params, {k: float(v) for k, v in jax.device_get(metrics).items()}, all_reduces


def emulated_one_psum_updates(rollout, shards: int) -> list[np.ndarray]:
    """The one_psum update's `shards` shards run on one device (`shards_emulated`)."""
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=2, seed=3)
    update = shards_emulated(
        make_ppo_update(
            apply_fn, action_distribution("discrete"), optimizer, hp, data_axis=BATCH_AXIS
        ),
        shards,
    )
    for _ in range(UPDATES):
        state, _ = update(state, rollout)
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


# Pendulum-v1's spaces: 3 observations, one torque in [-2, 2].
PENDULUM = EnvSpaces((3,), "continuous", 1, (1,), (-2.0,), (2.0,))


def sac_batch(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(rows, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(rows, 1)).astype(np.float32),
        "reward": rng.normal(size=rows).astype(np.float32),
        "next_obs": rng.normal(size=(rows, 3)).astype(np.float32),
        "discount": np.full(rows, 0.99, np.float32),
        "weight": np.ones(rows, np.float32),
    }


def run_sac_updates(config, mesh, batch) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The SAC state's leaves before and after `UPDATES` updates on `batch`."""
    shapes = {name: jax.ShapeDtypeStruct(v.shape, v.dtype) for name, v in batch.items()}
    training = make_sac_training(config, PENDULUM, mesh, shapes)
    state = training.initial_state
    initial = [np.asarray(x) for x in jax.tree.leaves(state)]
    for _ in range(UPDATES):
        state, _, _ = training.update(state, batch)
    return initial, [np.asarray(x) for x in jax.tree.leaves(state)]


def largest_difference(first: list[np.ndarray], second: list[np.ndarray]) -> float:
    return max(
        float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
        for a, b in zip(first, second, strict=True)
        if np.issubdtype(a.dtype, np.floating)
    )


def sac_results(group_index: int) -> dict[str, float]:
    """How far the SAC state updated on the 2-process mesh (one device of each) is from the
    one-device update, and how far the updates moved it, over every float leaf (networks,
    targets, optimizer moments, alpha)."""
    config = load_config("pendulum_sac", [])
    rows = config.algorithm.batch_size
    batch = sac_batch(np.random.default_rng(11), rows)
    assert set(BATCH_FIELDS) < set(batch)
    global_mesh = make_mesh(1)  # the first device of each process, as with devices=1
    row_sharding = NamedSharding(global_mesh, PartitionSpec(BATCH_AXIS))
    half = slice(group_index * rows // 2, (group_index + 1) * rows // 2)
    global_batch = {name: to_global(row_sharding, v[half]) for name, v in batch.items()}
    initial, on_two = run_sac_updates(config, global_mesh, global_batch)
    _, on_one = run_sac_updates(config, make_mesh(1, jax.local_devices()[:1]), batch)
    return {
        "sac_mesh_devices": len(global_mesh.devices.flat),
        "sac_max_param_diff": largest_difference(on_two, on_one),
        "sac_max_param_change": largest_difference(on_two, initial),
    }


def main() -> None:
    world = MPIWorld()
    group = split_learner_group(world, world.size)
    start_distributed(group.coordinator_address(60.0), group.size, group.index, [0, 1], 60.0)
    rollout = make_rollout(np.random.default_rng(7), 16, ENVS, 4, 3)

    global_mesh = make_mesh(2)
    block = slice(group.index * ENVS // 2, (group.index + 1) * ENVS // 2)
    shardings = rollout_shardings(global_mesh)
    # This process's envs: the env axis is axis 1 of `[T, B, ...]` fields, 0 of `[B, ...]` ones.
    local_block = {
        name: value[block] if name in ROLLOUT_LAST_FIELDS else value[:, block]
        for name, value in rollout.items()
    }
    global_rollout = {name: to_global(shardings[name], v) for name, v in local_block.items()}
    global_params, global_metrics, xla_all_reduces = run_updates(global_mesh, global_rollout)
    one_psum_params, _, one_psum_all_reduces = run_updates(global_mesh, global_rollout, BATCH_AXIS)
    with jax.default_device(jax.local_devices()[0]):
        emulated_params = emulated_one_psum_updates(rollout, len(global_mesh.devices.flat))

    one_device = make_mesh(1, jax.local_devices()[:1])
    local_params, local_metrics, _ = run_updates(one_device, rollout)

    leaf = global_rollout["obs"]
    print(
        "RESULT"
        + json.dumps(
            {
                "process": jax.process_index(),
                "processes": jax.process_count(),
                "mesh_devices": len(global_mesh.devices.flat),
                "rollout_shape": list(leaf.shape),
                "addressable_rows": sum(s.data.shape[1] for s in leaf.addressable_shards),
                "max_param_diff": max(
                    float(np.abs(a - b).max())
                    for a, b in zip(global_params, local_params, strict=True)
                ),
                "max_param_change": max(
                    float(np.abs(a - b).max())
                    for a, b in zip(global_params, initial_params(), strict=True)
                ),
                "loss_diff": abs(global_metrics["loss/total"] - local_metrics["loss/total"]),
                "one_psum_max_param_diff": max(
                    float(np.abs(a - b).max())
                    for a, b in zip(one_psum_params, emulated_params, strict=True)
                ),
                "one_psum_vs_xla_max_diff": max(
                    float(np.abs(a - b).max())
                    for a, b in zip(one_psum_params, global_params, strict=True)
                ),
                "gradient_steps": 3 * 2,  # make_update_setup's epochs x minibatches
                "one_psum_all_reduces": one_psum_all_reduces,
                "xla_all_reduces": xla_all_reduces,
            }
            | sac_results(group.index)
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
