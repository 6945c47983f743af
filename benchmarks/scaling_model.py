"""PPO scaling here: learner samples/s on 1 vs 2 processes; a throughput model vs 1-15 env ranks.

Where PPO's time goes as it scales on this machine: the learner on one or two processes, and a
simple throughput model held against measured env steps/s for 1 to 15 env ranks.

Part A, learner samples/s. The PPO update of `experiments/cartpole_ppo.yaml` (20 epochs of one
minibatch, tanh MLP) runs alone, without envs, on a synthetic CartPole-sized rollout (obs 4,
2 actions) of T x `--a-envs` envs (T: the config's 32), for each network of `--a-nets` (the
config's 64x64, and a bigger one where compute weighs more), on 4 CPU devices either way:
  side 1: one process with 4 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=4),
          a mesh of the 4;
  side 2: `mpiexec -n 2`, 2 host devices per process, one global mesh of 4 (JAX's distributed
          runtime started as learners start it, gloo collectives across the processes).
Both sides are clocked the same way: after the compile and 2 warm-up updates, `--a-blocks`
blocks of `--a-updates` updates, each block from a barrier to the end of its last update; every
update puts the host rollout on the mesh and reads its metrics back, as the learner does.
samples/s = rows x updates / the median block's seconds (side 2: per block, the slower
process's clock); the ratio printed is side 2 / side 1. Each side also times an all-reduce (a
jitted sum over the mesh of a [4, n] float32 array, one row per device; median of
`--allreduce-calls` calls) of the gradient's size and of 1 float, within one process (side 1)
or across the two (side 2), and counts the collectives of its compiled update: two models of
the ratio are built from them.

Part B, scaling model vs measurement: `predict` (its docstring has the formula), from unit
costs each measured on its own in the same run:
  - env step: `slow_cartpole`'s step (sleep `--step-ms` + CartPole), in a process that sets
    its timer slack as env ranks do;
  - policy call and the CPU of a vector step: a calibration job (1 learner + 1 env rank,
    `--envs-per-rank` envs, env step 0 ms), its timings' `time/actor_inference_s` and
    `time/actor_env_step_s` / T;
  - messages + bookkeeping per round: the calibration job's round (the wall-clock between two
    updates) less its env steps, policy calls and update;
  - update: the 64x64 update on one CPU device (as these jobs' learner has), each after an idle
    pause as long as a segment's env steps, at the part B jobs' batch sizes, fitted as fixed +
    per-sample cost;
  - the update's slowdown while N env ranks wait for its parameters (the env rank's polling
    loop on the real MPI channel), N in 0 and `--env-ranks`;
  - all-reduce: part A's (the model's term for 2 learner processes; unused with one learner).
The model is held against jobs of 1 learner + N env ranks, N in `--env-ranks`, on slow_cartpole
with a fixed number of envs per env rank (`--envs-per-rank`; global_num_envs = that x N: weak
scaling), `--updates` updates each. Measured: each job's `steps_per_s_after_first_update`
(summary.json); a second table sets the model's phases beside the jobs' timings.jsonl. Every job
starts with an empty compilation cache. All share this machine's cores (at 15 env ranks, 16
processes on 2); "others' load" says how many cores other processes kept busy meanwhile.

    python benchmarks/scaling_model.py            # about 4 min here (2 cores)
    python benchmarks/scaling_model.py --parts B --updates 60 --step-ms 2 --env-ranks 1 4 16 32
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    add_mpi_job_arguments,
    clean_env,
    find_mpiexec,
    median,
    provenance,
    results_in,
    run_rank_or_abort,
)

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "experiments" / "cartpole_ppo.yaml"
RESULT_PREFIX = "SCALING_MODEL_RESULT "
SLOW_ENV = "agentenv_jax.envs.slow:slow_cartpole"
OBS_DIM, NUM_ACTIONS = 4, 2  # CartPole
MESH_DEVICES = 4  # part A: both sides train on 4 CPU devices
WARMUP_UPDATES = 2
STEADY_FROM = 3  # part B: rounds of updates >= this are the steady ones (1: compile, 2: ramp)


@functools.cache
def rollout_length() -> int:
    """T of the config's rollouts."""
    from agentenv_jax.config.loading import load_config

    return load_config(CONFIG).algorithm.rollout_length


def _hidden(net: str) -> tuple[int, ...]:
    """'64x64' -> (64, 64)."""
    return tuple(int(width) for width in net.split("x"))


# --- workers: part A's learner sides, the update-cost fit, the env-step clock -------------------


def synthetic_rollout(rng: np.random.Generator, t_len: int, envs: int) -> dict[str, np.ndarray]:
    """A random but well-formed CartPole rollout, with the dtypes of an env rank's segment."""
    return {
        "obs": rng.normal(size=(t_len, envs, OBS_DIM)).astype(np.float32),
        "action": rng.integers(0, NUM_ACTIONS, size=(t_len, envs)).astype(np.int32),
        "reward": np.ones((t_len, envs), np.float32),
        "log_prob": np.full((t_len, envs), -math.log(NUM_ACTIONS), np.float32),
        "value": rng.normal(size=(t_len, envs)).astype(np.float32),
        "bootstrap_value": np.zeros((t_len, envs), np.float32),
        "terminated": (rng.random((t_len, envs)) < 0.05).astype(np.uint8),
        "truncated": np.zeros((t_len, envs), np.uint8),
        "valid": np.ones((t_len, envs), np.uint8),
        "last_value": rng.normal(size=envs).astype(np.float32),
        "last_obs": rng.normal(size=(envs, OBS_DIM)).astype(np.float32),
    }


def _update_on(mesh: Any, net: str) -> tuple[Any, Any, int, int]:
    """The config's PPO update for a `net` MLP, jitted over `mesh` as the learner jits it; its
    replicated initial state, the parameter count and the gradient steps per update."""
    import jax
    import jax.numpy as jnp

    from agentenv_jax.algorithms.ppo import TrainState
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.learner.loop import jit_sharded_update
    from agentenv_jax.learner.on_policy_model import make_on_policy_update
    from agentenv_jax.networks import action_distribution, init_params, make_actor_critic
    from agentenv_jax.parallel.mesh import replicated, row_constraint

    config = load_config(CONFIG)
    hidden = _hidden(net)
    module, apply_fn = make_actor_critic(
        "discrete", NUM_ACTIONS, 1, hidden, hidden, config.network.activation, 0.0
    )
    update, optimizer = make_on_policy_update(
        config, apply_fn, action_distribution("discrete"), 1000, row_constraint(mesh)
    )
    params = init_params(module, (OBS_DIM,), jax.random.PRNGKey(0))
    state = TrainState(
        params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(1)
    )
    num_params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(params))
    grad_steps = config.algorithm.num_epochs * config.algorithm.num_minibatches
    # Host values, the same on every process, replicated over the (possibly global) mesh.
    state = jax.device_put(jax.device_get(state), replicated(mesh))
    return jit_sharded_update(update, mesh), state, num_params, grad_steps


def _clock_updates(update: Any, state: Any, place: Any, count: int, barrier: Any) -> tuple:
    """`count` updates from a barrier, each of a rollout `place()` puts on the mesh from the
    host and each waited for (its metrics read back), as the learner runs them; the new state
    and the seconds."""
    import jax

    barrier()
    started = time.perf_counter()
    for _ in range(count):
        state, metrics = update(state, place())
        jax.device_get(metrics)
    return state, time.perf_counter() - started


def _clock_allreduce(mesh: Any, num_floats: int, calls: int, barrier: Any) -> float:
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
    return median(seconds)


_COLLECTIVE = re.compile(
    r"\s(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(([^)]*)\)"
)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) ")
_CALLEE = re.compile(r"(?:calls|body|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def collective_operands(hlo: str) -> dict[str, int]:
    """The collectives one call of a compiled program (its optimized HLO text) runs, by kind;
    a tuple all-reduce counts once per operand (XLA's CPU runtime reduces each operand with a
    collective of its own), an all-to-all once. An instruction inside a loop counts as many
    times as the loop runs (its known trip count; once when unknown)."""
    own: dict[str, dict[str, int]] = {}
    calls: dict[str, list[tuple[str, int]]] = {}
    entry = current = None
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            own[current], calls[current] = {}, []
            entry = current if line.startswith("ENTRY") else entry
            continue
        if current is None:
            continue
        for kind, operands in _COLLECTIVE.findall(line):
            count = max(1, operands.count("%")) if kind == "all-reduce" else 1
            own[current][kind] = own[current].get(kind, 0) + count
        trip = _TRIP_COUNT.search(line)
        times = int(trip.group(1)) if trip and " while(" in line else 1
        callees = _CALLEE.findall(line)
        callees += [c.strip().lstrip("%") for b in _BRANCHES.findall(line) for c in b.split(",")]
        calls[current] += [(callee, times) for callee in callees]

    @functools.cache
    def total(name: str) -> tuple[tuple[str, int], ...]:
        counts = dict(own.get(name, {}))
        for callee, times in calls.get(name, []):
            for kind, count in total(callee):
                counts[kind] = counts.get(kind, 0) + times * count
        return tuple(sorted(counts.items()))

    return dict(total(entry)) if entry else {}


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
        update, state, num_params, grad_steps = _update_on(mesh, net)
        update = update.lower(state, place()).compile()
        collectives = collective_operands(update.as_text())
        state, _ = _clock_updates(update, state, place, WARMUP_UPDATES, barrier)
        blocks = []
        for _ in range(args.a_blocks):
            state, seconds = _clock_updates(update, state, place, args.a_updates, barrier)
            blocks.append(seconds)
        result = {
            "net": net,
            "process": index,
            "processes": processes,
            "mesh_devices": len(mesh.devices.flat),
            "rows": config_t * args.a_envs,
            "params": num_params,
            "grad_steps": grad_steps,
            "updates_per_block": args.a_updates,
            "block_s": blocks,
            "collectives": collectives,
            "allreduce_s": _clock_allreduce(mesh, num_params, args.allreduce_calls, barrier),
            "allreduce_scalar_s": _clock_allreduce(mesh, 1, args.allreduce_calls, barrier),
        }
        for each in gather(result):
            print(RESULT_PREFIX + json.dumps(each), flush=True)
        del update, state
        jax.clear_caches()


def _cost_envs(args: argparse.Namespace) -> list[int]:
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
    for envs in _cost_envs(args):
        update, state, _, _ = _update_on(mesh, "64x64")
        rollout = synthetic_rollout(np.random.default_rng(envs), config_t, envs)

        def place(rollout: dict[str, np.ndarray] = rollout) -> dict[str, Any]:
            return jax.device_put(rollout, shardings)

        state, _ = _clock_updates(update, state, place, WARMUP_UPDATES, lambda: None)
        sizes.append({"envs": envs, "update": update, "state": state, "place": place, "s": []})
    for _ in range(args.cost_updates):
        for size in sizes:
            time.sleep(pause_s)
            size["state"], elapsed = _clock_updates(
                size["update"], size["state"], size["place"], 1, lambda: None
            )
            size["s"].append(elapsed)
    for size in sizes:
        result = {
            "rows": config_t * size["envs"],
            "update_s": median(size["s"]),
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
    envs = max(_cost_envs(args))
    pause_s = config_t * args.envs_per_rank * args.step_ms / 1000
    shardings = rollout_shardings(mesh)
    update, state, _, _ = _update_on(mesh, "64x64")
    rollout = synthetic_rollout(np.random.default_rng(envs), config_t, envs)

    def place() -> dict[str, Any]:
        return jax.device_put(rollout, shardings)

    state, _ = _clock_updates(update, state, place, WARMUP_UPDATES, lambda: None)
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
                state, elapsed = _clock_updates(update, state, place, 1, lambda: None)
                seconds.append(elapsed)
                if seconds is polled:
                    requests += [control.isend(False, dest=r) for r in range(1, k + 1)]
        results.append(
            {
                "pollers": k,
                "rows": config_t * envs,
                "quiet_s": median(quiet),
                "update_s": median(polled),
                "slowdown": median([p / q for p, q in zip(polled, quiet, strict=True)]),
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
        result["poll_cpu_share"] = median(shares)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    channel.abandon()
    world.Barrier()


# --- launching -----------------------------------------------------------------------------------


def _machine_cpu_s() -> float:
    """CPU seconds all processes of this machine have used since boot (/proc/stat: user, nice,
    system, irq, softirq, steal; nan where there is no /proc/stat)."""
    try:
        ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _launch(
    command: list[str], label: str, timeout: float, xla_devices: int | None = None
) -> tuple[str, float]:
    """Run `command` in this environment without a launcher's variables, with an empty
    compilation cache of its own (removed afterwards) and `xla_devices` host devices per process
    (None: XLA's default, one). Its stdout, and the cores other processes of the machine kept
    busy meanwhile (the machine's CPU seconds less the command's, per wall second): these
    benchmarks assume a quiet machine."""
    env = clean_env()
    env.pop("XLA_FLAGS", None)
    if xla_devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={xla_devices}"
    machine, children, started = _machine_cpu_s(), _children_cpu_s(), time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        shutil.rmtree(env[CACHE_DIR_VARIABLE], ignore_errors=True)
    others = (_machine_cpu_s() - machine) - (_children_cpu_s() - children)
    others_cores = max(0.0, others / (time.perf_counter() - started))
    if done.returncode != 0:
        output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{output}")
    return done.stdout, others_cores


def _run_worker(
    part: str, args: argparse.Namespace, ranks: int, xla_devices: int | None = None
) -> list[dict]:
    """This script as a worker (`--worker --part PART`), under `mpiexec -n ranks` when > 1;
    its results, each with the other processes' load (`others_cores`, see `_launch`)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", *sys.argv[1:]]
    command += ["--part", part, "--processes", str(ranks)]
    if ranks > 1:
        command = [find_mpiexec(), "-n", str(ranks), *command]
    stdout, others = _launch(command, f"worker {part} x{ranks}", args.job_timeout, xla_devices)
    results = results_in(stdout, RESULT_PREFIX)
    if not results:
        raise SystemExit(f"worker {part} printed no result:\n{stdout[-3000:]}")
    return [result | {"others_cores": others} for result in results]


def train(
    env_ranks: int, step_ms: float, updates: int, args: argparse.Namespace, root: Path, name: str
) -> dict[str, Any]:
    """`mpiexec -n 1+env_ranks agentenv train cartpole_ppo` on the slow env with
    `--envs-per-rank` envs per env rank for `updates` updates; its summary and the medians of
    its steady rounds' timings (rounds of updates >= STEADY_FROM; a round is the wall-clock
    between two updates)."""
    t_len = rollout_length()
    global_envs = args.envs_per_rank * env_ranks
    settings = [
        f"env.id={SLOW_ENV}",
        f"env.kwargs={{step_s: {step_ms / 1000}}}",
        f"env.global_num_envs={global_envs}",
        f"run.total_env_steps={updates * t_len * global_envs}",
        f"run.run_dir={root}",
        f"run.name={name}",
        "run.progress=false",
        f"run.transport_timeout_s={args.timeout}",
        "checkpoint.on_exit=false",
    ]
    command = [
        find_mpiexec(),
        "-n",
        str(1 + env_ranks),
        sys.executable,
        "-m",
        "agentenv_jax.workflow.cli",
    ]
    command += ["train", str(CONFIG), *[a for s in settings for a in ("--set", s)]]
    started = time.perf_counter()
    _, others_cores = _launch(command, name, args.job_timeout)
    job_s = time.perf_counter() - started
    run_dir = root / name
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "timings.jsonl").read_text().splitlines()]
    shutil.rmtree(run_dir, ignore_errors=True)
    steady = [
        (record, record["wall_s"] - before["wall_s"])
        for before, record in zip(records[:-1], records[1:], strict=True)
        if record["update"] >= STEADY_FROM
    ]
    timings = {
        key: median([r[key] for r, _ in steady])
        for key in (
            "time/learner_wait_s",
            "time/learner_update_s",
            "time/actor_env_step_s",
            "time/actor_inference_s",
            "time/actor_transport_wait_s",
        )
    }
    timings["round_s"] = median([round_s for _, round_s in steady])
    timings["learner_rest_s"] = median(
        [round_s - r["time/learner_wait_s"] - r["time/learner_update_s"] for r, round_s in steady]
    )
    timings["rest_s"] = median(
        [
            round_s
            - r["time/actor_env_step_s"]
            - r["time/actor_inference_s"]
            - r["time/learner_update_s"]
            for r, round_s in steady
        ]
    )
    return {
        "env_ranks": env_ranks,
        "envs": global_envs,
        "rows": t_len * global_envs,
        "rollout_length": t_len,
        "updates": summary["updates"],
        "steps_per_s": summary["steps_per_s_after_first_update"],
        "session_steps_per_s": summary["steps_per_s"],
        "env_rank_cpu_share": median(summary.get("env_rank_cpu_share") or []),
        "job_s": job_s,
        "others_cores": others_cores,
        **timings,
    }


# --- the model -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UnitCosts:
    """The measured unit costs the model is built from (seconds, unless said otherwise)."""

    step_s: float  # one slow env step: its sleep as the OS ends it + CartPole
    vec_cpu_s: float  # CPU of one vector step of an env rank's envs, their sleeps left out
    policy_s: float  # one policy call (a vector step's actions) on an env rank
    msg_s: float  # per round: segment and parameter messages, bookkeeping of both sides
    update_fixed_s: float  # the update's cost alone: update_fixed_s + update_row_s * rows
    update_row_s: float
    pollers: list[int]  # the update's slowdown with this many env ranks waiting (polling) ...
    slowdown: list[float]  # ... is this (1 with none)
    allreduce_s: float  # one all-reduce of the gradient across 2 learner processes
    latency_s: float  # one all-reduce of 1 float across 2 learner processes
    collectives: int  # collective operations per update on 2 learner processes
    grad_steps: int  # gradient steps per update
    cores: int  # the cores the job's processes share


SLOWDOWN_IS_CPU_SHARED = 1.25  # a bottleneck "learner" slowed more than this is "CPU-shared"


def predict(
    env_ranks: int, envs_per_rank: int, t_len: int, u: UnitCosts, learners: int = 1
) -> dict[str, Any]:
    """Predicted env steps/s of synchronous PPO (max_policy_lag 0) with N = `env_ranks` env ranks
    of E = `envs_per_rank` envs each and T = `t_len`, all processes on `u.cores` cores:

        rows      = N * E * T                                  rows per round (one update)
        env_alone = T * (E * step_s + policy_s)                a segment, on a core of its own
        env_cpu   = N * T * (vec_cpu_s + policy_s) / cores     the env ranks' CPU work of a
                                                               round on the shared cores (a
                                                               rank asleep in its env uses none)
        env_phase = max(env_alone, env_cpu)
        update    = (update_fixed_s + update_row_s * rows) * slowdown(N)
                    slowdown(N): the update's measured slowdown while N env ranks wait for its
                    parameters, polling (1 with none; interpolated between the measured N)
        learner   = update + msg_s
                    (+ collectives * latency_s + grad_steps * (allreduce_s - latency_s)
                     with 2 learner processes: each collective's latency, and the gradient's
                     bytes once per gradient step; not exercised by one learner)
        round     = env_phase + learner                        no overlap: the env ranks wait
                                                               for the new parameters
        steps/s   = rows / round

    The bottleneck is the larger phase: "env" (its sleeps: env_alone >= env_cpu), "env CPU"
    (env_cpu > env_alone), "learner", or "learner, CPU-shared" (slowed > 1.25x by the polling
    env ranks). Not modelled: the slowest of N ranks sets the round (stragglers, sleeps that
    end late on busy cores) and the learner's bookkeeping per env rank (msg_s is measured with
    one)."""
    rows = env_ranks * envs_per_rank * t_len
    env_alone = t_len * (envs_per_rank * u.step_s + u.policy_s)
    env_cpu = env_ranks * t_len * (u.vec_cpu_s + u.policy_s) / u.cores
    env_phase = max(env_alone, env_cpu)
    slowdown = float(np.interp(env_ranks, u.pollers, u.slowdown))
    update = (u.update_fixed_s + u.update_row_s * rows) * slowdown
    learner = update + u.msg_s
    if learners > 1:
        learner += u.collectives * u.latency_s + u.grad_steps * (u.allreduce_s - u.latency_s)
    round_s = env_phase + learner
    if learner > env_phase:
        shared = slowdown > SLOWDOWN_IS_CPU_SHARED
        bottleneck = "learner, CPU-shared" if shared else "learner"
    else:
        bottleneck = "env" if env_alone >= env_cpu else "env CPU"
    return {
        "rows": rows,
        "env_alone_s": env_alone,
        "env_cpu_s": env_cpu,
        "env_phase_s": env_phase,
        "slowdown": slowdown,
        "update_s": update,
        "learner_s": learner,
        "round_s": round_s,
        "steps_per_s": rows / round_s,
        "bottleneck": bottleneck,
    }


def bottleneck_shifts(
    envs_per_rank: int, t_len: int, u: UnitCosts, up_to: int = 256
) -> list[tuple[int, str]]:
    """The env-rank counts (1..up_to) at which the model's bottleneck changes, and to what
    (past the largest N measured, the update's slowdown is held at its last value)."""
    shifts: list[tuple[int, str]] = []
    for n in range(1, up_to + 1):
        bottleneck = predict(n, envs_per_rank, t_len, u)["bottleneck"]
        if not shifts or shifts[-1][1] != bottleneck:
            shifts.append((n, bottleneck))
    return shifts


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope of the line with the least squared relative errors (so that small
    batches, whose updates are short, count as much as big ones)."""
    y = np.asarray(ys, float)
    slope, intercept = np.polyfit(np.asarray(xs, float), y, 1, w=1 / y)
    return float(intercept), float(slope)


# --- the report ----------------------------------------------------------------------------------


def part_a(args: argparse.Namespace) -> dict[str, Any]:
    one = _run_worker("learner", args, 1, xla_devices=MESH_DEVICES)
    two = _run_worker("learner", args, 2, xla_devices=MESH_DEVICES // 2)
    rows = []
    for net in args.a_nets:
        side1 = next(r for r in one if r["net"] == net)
        side2 = [r for r in two if r["net"] == net]
        per_block2 = [max(b) for b in zip(*(r["block_s"] for r in side2), strict=True)]
        update1 = median(side1["block_s"]) / side1["updates_per_block"]
        update2 = median(per_block2) / side1["updates_per_block"]
        grad1, grad2 = side1["allreduce_s"], max(r["allreduce_s"] for r in side2)
        lat1, lat2 = side1["allreduce_scalar_s"], max(r["allreduce_scalar_s"] for r in side2)
        operands = sum(side2[0]["collectives"].values())
        grad_steps = side1["grad_steps"]
        # Two models of side 2: side 1's update, plus for each gradient step the difference
        # of the gradient's all-reduce across processes and within one ("gradient only"); or
        # plus each collective operand's latency difference (a scalar all-reduce's) and each
        # gradient step's bytes (the gradient's all-reduce less the scalar's) ("collectives").
        only_gradient = update1 + grad_steps * (grad2 - grad1)
        every_collective = update1 + operands * (lat2 - lat1)
        every_collective += grad_steps * ((grad2 - lat2) - (grad1 - lat1))
        rows.append(
            {
                "net": net,
                "params": side1["params"],
                "rows": side1["rows"],
                "grad_steps": grad_steps,
                "collectives": side2[0]["collectives"],
                "collective_operands": operands,
                "update1_s": update1,
                "update2_s": update2,
                "samples1": side1["rows"] / update1,
                "samples2": side1["rows"] / update2,
                "ratio": update1 / update2,
                "model_gradient_ratio": update1 / only_gradient,
                "model_collectives_ratio": update1 / every_collective,
                "allreduce1_s": grad1,
                "allreduce2_s": grad2,
                "latency1_s": lat1,
                "latency2_s": lat2,
                "raw": {"side1": side1, "side2": side2},
            }
        )
    return {"nets": rows, "others_cores": [one[0]["others_cores"], two[0]["others_cores"]]}


def print_part_a(a: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n## A. Learner samples/s: 1 process x 4 devices vs 2 processes x 2 devices\n\n"
        f"PPO update alone (cartpole_ppo: 20 epochs x 1 minibatch), rollout "
        f"{rollout_length()} x {args.a_envs} envs, median of {args.a_blocks} blocks of "
        f"{args.a_updates} updates after {WARMUP_UPDATES} warm-up updates.\n"
    )
    print(
        "| network | params | rows/update | side 1 samples/s | side 2 samples/s | "
        "side 2 ÷ side 1 | model ÷, gradient only | model ÷, collectives |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in a["nets"]:
        print(
            f"| {r['net']} | {r['params']:,} | {r['rows']:,} | {r['samples1']:,.0f} | "
            f"{r['samples2']:,.0f} | {r['ratio']:.2f} | {r['model_gradient_ratio']:.2f} | "
            f"{r['model_collectives_ratio']:.2f} |"
        )
    print(
        "\n| network | collectives per update (side 2, from the compiled program) | "
        "all-reduce of the gradient, 1 proc / 2 procs (µs) | "
        "all-reduce of 1 float, 1 proc / 2 procs (µs) |"
    )
    print("|---|---|---:|---:|")
    for r in a["nets"]:
        kinds = ", ".join(f"{count} {kind}" for kind, count in r["collectives"].items())
        print(
            f"| {r['net']} | {r['collective_operands']} ({kinds}) | "
            f"{r['allreduce1_s'] * 1e6:,.0f} / {r['allreduce2_s'] * 1e6:,.0f} | "
            f"{r['latency1_s'] * 1e6:,.0f} / {r['latency2_s'] * 1e6:,.0f} |"
        )
    print(
        "\nmodel ÷: side 1's update time over a modelled side 2's. Gradient only: side 1's update "
        "+ gradient steps x (the gradient's all-reduce across processes − within one). "
        "Collectives: side 1's update + every collective of the compiled update x (a 1-float "
        "all-reduce across processes − within one) + gradient steps x the same difference for "
        "the gradient's bytes (its all-reduce less the 1-float one)."
    )
    side1, side2 = a["others_cores"]
    print(
        f"\nOther processes of the machine kept {side1:.2f} cores busy during side 1's job and "
        f"{side2:.2f} during side 2's (of {len(os.sched_getaffinity(0))})."
    )


def part_b(args: argparse.Namespace, a: dict[str, Any] | None, root: Path) -> dict[str, Any]:
    env = {r["step_ms"]: r["step_s"] for r in _run_worker("env", args, 1)}
    costs = _run_worker("cost", args, 1)
    polls = _run_worker("poll", args, 1 + max(args.env_ranks))
    print(
        "  update with N env ranks polling (alone): "
        + ", ".join(
            f"N={p['pollers']} {p['update_s'] * 1e3:.0f} ms ({p['quiet_s'] * 1e3:.0f} ms)"
            for p in polls
        )
        + f" (others' load {polls[0]['others_cores']:.2f} cores)",
        flush=True,
    )
    fixed, per_row = fit_line([c["rows"] for c in costs], [c["update_s"] for c in costs])
    calibration = train(1, 0.0, args.calibration_updates, args, root, "calibration")
    print(
        f"  calibration (1 env rank, 0 ms env step): {calibration['steps_per_s']:,.0f} steps/s "
        f"(job {calibration['job_s']:.0f} s)",
        flush=True,
    )
    t = calibration["rollout_length"]
    small = next((r for r in a["nets"] if r["net"] == "64x64"), None) if a else None
    units = UnitCosts(
        step_s=env[args.step_ms],
        vec_cpu_s=calibration["time/actor_env_step_s"] / t,
        policy_s=calibration["time/actor_inference_s"] / t,
        msg_s=calibration["rest_s"],
        update_fixed_s=fixed,
        update_row_s=per_row,
        pollers=[0] + [p["pollers"] for p in polls],
        slowdown=[1.0] + [p["slowdown"] for p in polls],
        allreduce_s=small["allreduce2_s"] if small else math.nan,
        latency_s=small["latency2_s"] if small else math.nan,
        collectives=small["collective_operands"] if small else 0,
        grad_steps=small["grad_steps"] if small else 0,
        cores=len(os.sched_getaffinity(0)),
    )
    runs = []
    for n in args.env_ranks:
        run = train(n, args.step_ms, args.updates, args, root, f"ranks-{n}")
        run["predicted"] = predict(n, args.envs_per_rank, run["rollout_length"], units)
        print(
            f"  {n:>2} env ranks: {run['steps_per_s']:8,.0f} steps/s measured, "
            f"{run['predicted']['steps_per_s']:8,.0f} predicted (job {run['job_s']:.0f} s, "
            f"others' load {run['others_cores']:.2f} cores)",
            flush=True,
        )
        runs.append(run)
    return {
        "env_step_s": env,
        "update_costs": costs,
        "polls": polls,
        "calibration": calibration,
        "units": dataclasses.asdict(units),
        "runs": runs,
    }


def print_part_b(b: dict[str, Any], args: argparse.Namespace) -> None:
    u = UnitCosts(**b["units"])
    c = b["calibration"]
    e = args.envs_per_rank
    print(
        f"\n## B. Scaling model vs measurement\n\nPPO cartpole_ppo on slow_cartpole "
        f"({args.step_ms:g} ms sleep per step), {e} envs per env rank (global_num_envs = {e} x N), "
        f"T = {rollout_length()}, {args.updates} updates per job, 1 learner (1 CPU device), "
        f"{u.cores} cores.\n"
    )
    print("| unit cost | value | measured by |")
    print("|---|---:|---|")
    cost_rows = ", ".join(
        f"{r['rows']:,} ({r['update_s'] * 1e3:.1f} ms)" for r in b["update_costs"]
    )
    pause_ms = b["update_costs"][0]["pause_s"] * 1e3
    polls = b["polls"]
    units = [
        ("env step (sleep + CartPole)", f"{u.step_s * 1e3:.3f} ms", f"in process, 150 x {e} steps"),
        (
            "env step, 0 ms sleep (for reference)",
            f"{b['env_step_s'][0.0] * 1e6:.1f} µs",
            f"in process, 2000 x {e} steps",
        ),
        (
            f"CPU of a vector step ({e} envs, no sleep)",
            f"{u.vec_cpu_s * 1e6:.0f} µs",
            "calibration job: actor_env_step_s / T",
        ),
        (
            "policy call per vector step",
            f"{u.policy_s * 1e6:.0f} µs",
            "calibration job: actor_inference_s / T",
        ),
        (
            "messages + bookkeeping per round",
            f"{u.msg_s * 1e3:.2f} ms",
            "calibration job: round − env step − policy − update",
        ),
        (
            "update, fixed per update",
            f"{u.update_fixed_s * 1e3:.2f} ms",
            f"1 process, 1 device, 64x64, each update after a {pause_ms:.0f} ms pause: fit "
            f"over {cost_rows} rows",
        ),
        ("update, per sample", f"{u.update_row_s * 1e6:.2f} µs", "same fit"),
        (
            "the update's slowdown with N env ranks polling",
            ", ".join(
                f"N={n}: {x:.2f}x" for n, x in zip(u.pollers[1:], u.slowdown[1:], strict=True)
            ),
            f"mpiexec -n {1 + max(u.pollers)}: update at {polls[-1]['rows']:,} rows while N ranks "
            "run the env rank's wait loop on the MPI channel ÷ alone (median of pairs)",
        ),
        (
            "cores a polling env rank keeps busy",
            f"{polls[-1]['poll_cpu_share']:.3f}",
            f"same, median over the {max(u.pollers)} polling ranks",
        ),
        (
            "all-reduce of the gradient / of 1 float, 2 processes",
            f"{u.allreduce_s * 1e6:,.0f} / {u.latency_s * 1e6:,.0f} µs",
            f"part A, 64x64; {u.collectives} collectives per update (2 learners only)",
        ),
        ("cores", f"{u.cores}", "os.sched_getaffinity"),
    ]
    for name, value, source in units:
        print(f"| {name} | {value} | {source} |")
    calibration_fit = u.update_fixed_s + u.update_row_s * c["rows"]
    print(
        f"\nCalibration job (1 env rank, 0 ms env step): round {c['round_s'] * 1e3:.1f} ms, "
        f"update {c['time/learner_update_s'] * 1e3:.1f} ms (the fit: {calibration_fit * 1e3:.1f} "
        f"ms), {c['steps_per_s']:,.0f} steps/s; others' load {c['others_cores']:.2f} cores.\n"
    )
    print(
        "| env ranks | envs | rows/round | predicted steps/s | measured steps/s | "
        "measured ÷ predicted | predicted bottleneck | others' load (cores) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---:|")
    for run in b["runs"]:
        p = run["predicted"]
        print(
            f"| {run['env_ranks']} | {run['envs']} | {run['rows']:,} | {p['steps_per_s']:,.0f} | "
            f"{run['steps_per_s']:,.0f} | {run['steps_per_s'] / p['steps_per_s']:.2f} | "
            f"{p['bottleneck']} | {run['others_cores']:.2f} |"
        )
    print(
        "\nPer round (ms), predicted / measured: the env phase vs the learner's wait for the "
        "segments, the update, and the rest of the round (messages, bookkeeping: measured, "
        "round − wait − update); measured: medians over the steady rounds (updates >= 3) of "
        "each job's timings.jsonl, a round being the wall-clock between two updates.\n"
    )
    print(
        "| env ranks | round | env phase / learner wait | update | rest | update slowdown "
        "| env ranks' env step | policy calls | env rank CPU share |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in b["runs"]:
        p = run["predicted"]
        print(
            f"| {run['env_ranks']} | {p['round_s'] * 1e3:.0f} / {run['round_s'] * 1e3:.0f} | "
            f"{p['env_phase_s'] * 1e3:.0f} / {run['time/learner_wait_s'] * 1e3:.0f} | "
            f"{p['update_s'] * 1e3:.1f} / {run['time/learner_update_s'] * 1e3:.1f} | "
            f"{u.msg_s * 1e3:.1f} / {run['learner_rest_s'] * 1e3:.1f} | {p['slowdown']:.2f}x | "
            f"{run['time/actor_env_step_s'] * 1e3:.0f} | "
            f"{run['time/actor_inference_s'] * 1e3:.1f} | {run['env_rank_cpu_share']:.3f} |"
        )
    shifts = bottleneck_shifts(e, rollout_length(), u)
    print(
        "\nBottleneck by the model, as env ranks are added (one learner, "
        f"{e} envs each): " + "; ".join(f"from N = {n}: {what}" for n, what in shifts) + "."
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="AB", help="which parts to run: A, B or AB")
    parser.add_argument("--a-nets", nargs="+", default=["64x64", "256x256"], help="part A MLPs")
    parser.add_argument("--a-envs", type=int, default=64, help="part A rollout: T x this envs")
    parser.add_argument("--a-updates", type=int, default=3, help="part A updates per block")
    parser.add_argument("--a-blocks", type=int, default=5, help="part A timed blocks (median)")
    parser.add_argument(
        "--allreduce-calls", type=int, default=100, help="all-reduces timed (median)"
    )
    parser.add_argument(
        "--cost-envs",
        type=int,
        nargs="+",
        help="update-cost fit: rollouts of T x these envs on one device (default: the global "
        "envs of the part B jobs)",
    )
    parser.add_argument(
        "--cost-updates",
        type=int,
        default=15,
        help="updates per size of the update-cost fit, pairs per count of the polling ranks",
    )
    parser.add_argument("--step-ms", type=float, default=1.0, help="slow env: sleep per step")
    parser.add_argument("--envs-per-rank", type=int, default=4, help="envs of each env rank")
    parser.add_argument(
        "--env-ranks", type=int, nargs="+", default=[1, 2, 4, 8, 15], help="N of the part B jobs"
    )
    parser.add_argument("--updates", type=int, default=30, help="updates per part B job")
    parser.add_argument(
        "--calibration-updates", type=int, default=60, help="updates of the calibration job"
    )
    add_mpi_job_arguments(parser, job_timeout_s=300.0)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        work = {
            "learner": learner_worker,
            "cost": cost_worker,
            "env": env_worker,
            "poll": poll_worker,
        }[args.part]
        if args.processes > 1:
            run_rank_or_abort(lambda: work(args))
        else:
            work(args)
        return
    if find_mpiexec() is None:
        raise SystemExit("mpiexec not found: install the mpich wheel (pip install mpich)")
    started = time.perf_counter()
    print(provenance())
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, Any] = {}
    if "A" in args.parts:
        results["A"] = part_a(args)
        print_part_a(results["A"], args)
    if "B" in args.parts:
        print("\nPart B jobs:", flush=True)
        with tempfile.TemporaryDirectory(prefix="agentenv_scaling_model_") as root:
            results["B"] = part_b(args, results.get("A"), Path(root))
        print_part_b(results["B"], args)
    print(
        f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"whole script {time.perf_counter() - started:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
