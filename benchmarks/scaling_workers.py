"""`scaling_model.py`'s workers, each a fresh process of that script (`--worker --part PART`):
part A's learner sides, and part B's unit costs (the update-cost fit, the env-step clock, the
update's slowdown while env ranks poll)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import common
import numpy as np
from scaling_update import (
    NUM_ACTIONS,
    WARMUP_UPDATES,
    clock_updates,
    rollout_length,
    synthetic_rollout,
    update_on,
)

from agentenv_jax.parallel.hlo_collectives import collective_operands

RESULT_PREFIX = "SCALING_MODEL_RESULT "
MESH_DEVICES = 4  # part A: both sides train on 4 CPU devices


def clock_allreduce(mesh: Any, num_floats: int, calls: int, barrier: Any) -> float:
    """Median seconds of one all-reduce of `num_floats` float32 over the mesh: a jitted sum of
    a [devices, num_floats] array, one row on each device, into a replicated result."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from agentenv_jax.parallel.mesh import replicated, to_global

    local_rows = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
    sharding = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    x = to_global(sharding, np.ones((local_rows, num_floats), np.float32))
    total = jax.jit(lambda a: a.sum(axis=0), out_shardings=replicated(mesh))
    for _ in range(5):
        jax.block_until_ready(total(x))
    seconds = []
    barrier()
    for _ in range(calls):
        started = time.perf_counter()
        jax.block_until_ready(total(x))
        seconds.append(time.perf_counter() - started)
    return common.median(seconds)


def learner_worker(args: argparse.Namespace) -> None:
    """Part A, one side: `--processes 1` (4 local devices) or 2 (a rank of `mpiexec -n 2`)."""
    if args.processes > 1:
        from agentenv_jax.parallel.distributed import start_distributed
        from agentenv_jax.transport.mpi import MPIWorld
        from agentenv_jax.transport.mpi.learners import split_learner_group

        world = MPIWorld()
        group = split_learner_group(world, world.size)
        local = MESH_DEVICES // group.size
        address = group.coordinator_address(args.timeout)
        start_distributed(address, group.size, group.index, list(range(local)), args.timeout)
        barrier, index, processes = world.comm.Barrier, group.index, group.size

        def gather(result: dict[str, Any]) -> list[dict[str, Any]]:
            # Process 0 prints every process's result: lines of two ranks may interleave.
            return world.comm.gather(result, root=0) or []
    else:
        barrier, index, processes = (lambda: None), 0, 1

        def gather(result: dict[str, Any]) -> list[dict[str, Any]]:
            return [result]

    import jax

    from agentenv_jax.learner.loop import ROLLOUT_LAST_FIELDS, rollout_shardings
    from agentenv_jax.parallel.mesh import make_mesh, to_global

    mesh = make_mesh(MESH_DEVICES // processes)  # the first devices of every process
    config_t = rollout_length()
    rollout = synthetic_rollout(np.random.default_rng(7), config_t, args.a_envs)
    block = slice(index * args.a_envs // processes, (index + 1) * args.a_envs // processes)
    shardings = rollout_shardings(mesh)
    # This process's envs: the env axis is axis 1 of `[T, B, ...]` fields, 0 of `[B, ...]` ones.
    local = {
        name: value[block] if name in ROLLOUT_LAST_FIELDS else value[:, block]
        for name, value in rollout.items()
    }

    def place() -> dict[str, Any]:
        if processes == 1:
            return jax.device_put(local, shardings)
        return {name: to_global(shardings[name], value) for name, value in local.items()}

    for net in args.a_nets:
        for mode in args.a_gradient_sync:
            update, state, num_params, grad_steps = update_on(mesh, net, mode)
            update = update.lower(state, place()).compile()
            collectives = collective_operands(update.as_text())
            state, _ = clock_updates(update, state, place, WARMUP_UPDATES, barrier)
            blocks = []
            for _ in range(args.a_blocks):
                state, seconds = clock_updates(update, state, place, args.a_updates, barrier)
                blocks.append(seconds)
            result = {
                "net": net,
                "gradient_sync": mode,
                "process": index,
                "processes": processes,
                "mesh_devices": len(mesh.devices.flat),
                "rows": config_t * args.a_envs,
                "params": num_params,
                "grad_steps": grad_steps,
                "updates_per_block": args.a_updates,
                "block_s": blocks,
                "collectives": collectives,
                "allreduce_s": clock_allreduce(mesh, num_params, args.allreduce_calls, barrier),
                "allreduce_scalar_s": clock_allreduce(mesh, 1, args.allreduce_calls, barrier),
            }
            for each in gather(result):
                print(RESULT_PREFIX + json.dumps(each), flush=True)
            del update, state
            jax.clear_caches()


def cost_envs(args: argparse.Namespace) -> list[int]:
    """The update-cost sizes: `--cost-envs`, else the global envs of every part B job."""
    return args.cost_envs or sorted({args.envs_per_rank * n for n in args.env_ranks})


def cost_worker(args: argparse.Namespace) -> None:
    """Part B's update cost: the config's 64x64 update on one CPU device, per batch size. Each
    of `--cost-updates` updates per size is clocked alone after an idle pause as long as a
    segment's env steps (T x E x `--step-ms`), as the learner meets it after waiting for the env
    ranks (an update right after another, on hot caches and busy threads, is faster: up to 2x
    for small batches here); the sizes take turns, so that a burst of other load on the machine
    does not fall on one size alone."""
    import jax

    from agentenv_jax.learner.loop import rollout_shardings
    from agentenv_jax.parallel.mesh import make_mesh

    mesh = make_mesh(1, jax.local_devices()[:1])
    config_t = rollout_length()
    pause_s = config_t * args.envs_per_rank * args.step_ms / 1000
    shardings = rollout_shardings(mesh)
    sizes = []
    for envs in cost_envs(args):
        update, state, _, _ = update_on(mesh, "64x64")
        rollout = synthetic_rollout(np.random.default_rng(envs), config_t, envs)

        def place(rollout: dict[str, np.ndarray] = rollout) -> dict[str, Any]:
            return jax.device_put(rollout, shardings)

        state, _ = clock_updates(update, state, place, WARMUP_UPDATES, lambda: None)
        sizes.append({"envs": envs, "update": update, "state": state, "place": place, "s": []})
    for _ in range(args.cost_updates):
        for size in sizes:
            time.sleep(pause_s)
            size["state"], elapsed = clock_updates(
                size["update"], size["state"], size["place"], 1, lambda: None
            )
            size["s"].append(elapsed)
    for size in sizes:
        result = {
            "rows": config_t * size["envs"],
            "update_s": common.median(size["s"]),
            "pause_s": pause_s,
        }
        print(RESULT_PREFIX + json.dumps(result), flush=True)


def env_worker(args: argparse.Namespace) -> None:
    """Seconds per `slow_cartpole` step, with `--step-ms` and with 0 ms, stepping
    `--envs-per-rank` envs in turn with random actions. The timer slack is set as an env rank's
    polling sets it (`transport.mpi.world`), so that its sleeps end as theirs do."""
    from agentenv_jax.envs.slow import slow_cartpole
    from agentenv_jax.transport.mpi.world import Backoff

    Backoff()  # tightens this thread's timer slack, as on every rank
    rng = np.random.default_rng(0)
    for step_s, vector_steps in ((args.step_ms / 1000, 150), (0.0, 2000)):
        envs = [slow_cartpole(step_s) for _ in range(args.envs_per_rank)]
        for seed, env in enumerate(envs):
            env.reset(seed=seed)
        started = time.perf_counter()
        for _ in range(vector_steps):
            for env in envs:
                _, _, terminated, truncated, _ = env.step(int(rng.integers(NUM_ACTIONS)))
                if terminated or truncated:
                    env.reset()
        seconds = (time.perf_counter() - started) / (vector_steps * len(envs))
        print(RESULT_PREFIX + json.dumps({"step_ms": step_s * 1000, "step_s": seconds}))


def poll_worker(args: argparse.Namespace) -> None:
    """The update's slowdown while K env ranks wait for its parameters (polling), for K in
    `--env-ranks`: `mpiexec -n 1+max(K)`. Rank 0 holds the learner's end of the real MPI
    channel and clocks the 64x64 update on the largest part B batch, `--cost-updates` pairs of
    updates per K, each update after a segment's pause (as `cost_worker` does): in a pair, one
    update alone and one while ranks 1..K run the wait loop of `Actor.run_once` (take
    parameters if any, pump the segment queue, check for a stop, back off; and check for the end
    of their turn). The slowdown is the median of the pairs' ratios, so that other load on the
    machine, which comes and goes, falls on both of a pair. Ranks not polling nap (10 ms between
    checks for their turn)."""
    from mpi4py import MPI

    from agentenv_jax.buffers.segment_queue import SegmentQueue
    from agentenv_jax.transport.mpi.on_policy import MPIActorChannel, MPILearnerChannel
    from agentenv_jax.transport.spec import FieldSpec, MessageSpec

    world = MPI.COMM_WORLD
    control = world.Dup()  # this benchmark's own messages: never matched by the channel's
    rank, pollers = world.Get_rank(), world.Get_size() - 1
    spec = MessageSpec([FieldSpec("x", (8,), np.uint8)])
    param_nbytes = 8
    if rank > 0:
        channel = MPIActorChannel(world, learner_rank=0, param_nbytes=param_nbytes)
        queue = SegmentQueue(spec, capacity=3)
        turns = []  # (CPU seconds, wall seconds) of each turn
        while True:
            while not control.Iprobe(source=0):
                time.sleep(0.01)
            if not control.recv(source=0):
                break
            cpu, wall = time.process_time(), time.perf_counter()
            while not control.Iprobe(source=0):
                channel.poll_params()
                channel.pump(queue)
                channel.stop_requested()
                channel.idle()
            control.recv(source=0)
            turns.append((time.process_time() - cpu, time.perf_counter() - wall))
        channel.abandon()
        control.gather(turns, root=0)
        world.Barrier()
        return

    import jax

    from agentenv_jax.learner.loop import rollout_shardings
    from agentenv_jax.parallel.mesh import make_mesh

    channel = MPILearnerChannel(
        world, list(range(1, pollers + 1)), [spec.nbytes] * pollers, 2, param_nbytes
    )
    mesh = make_mesh(1, jax.local_devices()[:1])
    config_t = rollout_length()
    envs = max(cost_envs(args))
    pause_s = config_t * args.envs_per_rank * args.step_ms / 1000
    shardings = rollout_shardings(mesh)
    update, state, _, _ = update_on(mesh, "64x64")
    rollout = synthetic_rollout(np.random.default_rng(envs), config_t, envs)

    def place() -> dict[str, Any]:
        return jax.device_put(rollout, shardings)

    state, _ = clock_updates(update, state, place, WARMUP_UPDATES, lambda: None)
    counts = sorted({n for n in args.env_ranks if n > 0})
    results = []
    requests: list[Any] = []
    for k in counts:
        quiet, polled = [], []
        for _ in range(args.cost_updates):
            for seconds in (quiet, polled):
                time.sleep(pause_s)
                if seconds is polled:
                    requests += [control.isend(True, dest=r) for r in range(1, k + 1)]
                time.sleep(0.02)  # the polling ranks settle into their back-off
                state, elapsed = clock_updates(update, state, place, 1, lambda: None)
                seconds.append(elapsed)
                if seconds is polled:
                    requests += [control.isend(False, dest=r) for r in range(1, k + 1)]
        results.append(
            {
                "pollers": k,
                "rows": config_t * envs,
                "quiet_s": common.median(quiet),
                "update_s": common.median(polled),
                "slowdown": common.median([p / q for p, q in zip(polled, quiet, strict=True)]),
            }
        )
    requests += [control.isend(False, dest=r) for r in range(1, pollers + 1)]
    MPI.Request.Waitall(requests)
    turns = control.gather([], root=0)
    for result in results:
        k = result["pollers"]
        shares = []
        for r in range(1, k + 1):
            # Poller r polled in every round with at least r pollers, in order.
            first = args.cost_updates * sum(1 for x in counts if r <= x < k)
            mine = turns[r][first : first + args.cost_updates]
            shares.append(sum(c for c, _ in mine) / sum(w for _, w in mine))
        result["poll_cpu_share"] = common.median(shares)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    channel.abandon()
    world.Barrier()
