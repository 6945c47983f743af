"""One PPO update on a global mesh of two learner processes equals the update on one device;
run by tests/test_multi_learner.py as `mpiexec -n 2` with 2 host devices per process.

Both processes start JAX's distributed runtime the way learners do (the coordinator address
agreed over their MPI communicator, gloo collectives), build the same random rollout, and each
contributes its half of the env axis to the global rollout on the 4-device mesh. Each process
also runs the same update on one of its own devices. Prints `RESULT {json}` on every rank.
"""

from __future__ import annotations

import json

import jax
import numpy as np

from agentenv_jax.algorithms.ppo import make_ppo_update
from agentenv_jax.learner.loop import (
    ROLLOUT_LAST_FIELDS,
    jit_sharded_update,
    rollout_shardings,
)
from agentenv_jax.networks import action_distribution
from agentenv_jax.parallel.distributed import start_distributed
from agentenv_jax.parallel.mesh import make_mesh, place_on_mesh, row_constraint, to_global
from agentenv_jax.transport.mpi import MPIWorld
from agentenv_jax.transport.mpi.learners import split_learner_group

from test_ppo import make_rollout, make_update_setup

UPDATES = 3
ENVS = 8


def initial_params() -> list[np.ndarray]:
    _, _, _, state = make_update_setup(num_minibatches=2, seed=3)
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def run_updates(mesh, rollout) -> tuple[list[np.ndarray], dict[str, float]]:
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=2, seed=3)
    update = jit_sharded_update(
        make_ppo_update(
            apply_fn,
            action_distribution("discrete"),
            optimizer,
            hp,
            constrain_rows=row_constraint(mesh),
        ),
        mesh,
    )
    state = place_on_mesh(mesh, state)
    for _ in range(UPDATES):
        state, metrics = update(state, rollout)
    params = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    return params, {k: float(v) for k, v in jax.device_get(metrics).items()}


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
    global_params, global_metrics = run_updates(global_mesh, global_rollout)

    one_device = make_mesh(1, jax.local_devices()[:1])
    local_params, local_metrics = run_updates(one_device, rollout)

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
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
