"""Replay sampling: transitions/s the learner receives from 1-3 MPI replay partitions, against
one in-process buffer of the same total size.

Only the sampling path is measured; there is no gradient update. One `mpiexec -n P+1` job per
partition count P (the script re-launches itself with `sys.executable`):

* **env ranks 1..P**: the real `ReplayActor` over `MPIReplayActorChannel`, built by
  `roles.replay_plan` from `experiments/pendulum_sac.yaml` (Pendulum-v1; `--envs` envs over
  all ranks, default 6 so that 1, 2 and 3 ranks get equal shares; each rank holds its share of
  `--capacity`, default 50,000 in total, half the experiment's, to keep the prefill short),
  running its own loop (`while actor.run_once(): ...`). XLA is single-threaded there, as
  `launch.run_mpi` does.
  The partitions are prefilled by stepping (random actions) under an insert allowance of their
  capacity, granted with zero-row requests.
* **rank 0**: the learner's half of `ReplayLearner.run_once` over the real
  `MPIReplayLearnerChannel`: split each batch (`--batch-size`) over the partitions with
  `split_batch` on the masses they reported in their last answers, send the request for batch
  k+1 before "using" batch k (prefetch), gather the rows as the learner does, and, when
  prioritized, compute importance weights and send each partition new priorities (random TD
  errors). `--work-ms` adds a busy CPU stretch per batch in place of the update (default 0).

Two actor phases, in this order, for every case:

* **frozen**: the insert allowance stays at the prefill, so env ranks only serve requests and
  apply priorities. This is the pure sampling path. It is interleaved, chunk by chunk, with two
  baselines on rank 0, both sampling one buffer of the full capacity: **direct**
  (`ReplayPartition.sample` called in a loop, plus the priority update when prioritized) and
  **in-process** (a real `ReplayActor` over `InProcessReplayTransport`, served in the same
  thread, as `launch.run_single_process` runs one process). The baseline buffer holds
  synthetic transitions: sampling cost does not depend on their values.
* **stepping**: the allowance is lifted, so env ranks step their envs (with the policy) between
  requests, as in training. A request now waits for the vector step in progress, and on a small
  machine the ranks compete for cores. The baselines are not re-measured: ratios use the
  frozen phase's.

Throughput is rows delivered per second of the timed loop (median over rounds); the wait is
the time rank 0 spends in `wait_answers` per batch (for the baselines: the time to get a
batch, serving included), mean and p95 over all rounds. Ratios are MPI / baseline throughput
within the same job. The partitions' final reports must account for every row requested.

Recorded in docs/benchmarks.md ("Current results", section 4) from the first command, and
section 4's table with work per batch from the last:

    python benchmarks/replay_sampling.py                         # P = 1 2 3, uniform + prioritized
    python benchmarks/replay_sampling.py --partitions 2 --modes prioritized --rounds 9
    python benchmarks/replay_sampling.py --modes uniform --work-ms 3  # is the wait hidden?
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import types
from typing import Any

import common
import numpy as np
from replay_samplers import Chunk, DirectSampler, Sampler, fill_synthetic

DEFAULT_CONFIG = common.EXPERIMENTS / "pendulum_sac.yaml"
RESULT_PREFIX = "REPLAY_SAMPLING_RESULT "
MODES = ("uniform", "prioritized")
PHASES = ("frozen", "stepping")
NO_LIMIT = 2**62  # an insert allowance the env ranks never reach


def case_config(args: argparse.Namespace, prioritized: bool) -> Any:
    from agentenv_jax.config.loading import load_config

    return load_config(
        args.config,
        [
            f"env.global_num_envs={args.envs}",
            f"algorithm.batch_size={args.batch_size}",
            f"algorithm.replay_capacity={args.capacity}",
            # Prefill with random actions; once it is full, steps use the policy.
            f"algorithm.learning_starts={args.capacity}",
            f"algorithm.prioritized={str(prioritized).lower()}",
            f"run.seed={args.seed}",
            f"run.transport_timeout_s={args.timeout}",
            "run.progress=false",
        ],
    )


def env_rank(comm: Any, config: Any) -> None:
    """One partition: the real ReplayActor, running its own loop until told to stop."""
    from agentenv_jax.runtime.roles import prepare_env_rank, replay_plan
    from agentenv_jax.transport.topology import make_topology

    topology = make_topology(config, comm.Get_size(), comm.Get_rank())
    vector_env, spaces = prepare_env_rank(config, topology)
    plan = replay_plan(config, topology, spaces)
    actor = plan.make_actor(
        vector_env, plan.make_mpi_actor_channel(types.SimpleNamespace(comm=comm))
    )
    while actor.run_once():
        pass
    actor.finish()


def _probe(side: Any, work_s: float, chunk_s: float) -> int:
    side.chunk(20, work_s)  # warm-up
    chunk = side.chunk(50, work_s)
    return max(10, round(chunk_s * 50 / chunk.seconds))


def _summary(chunks: list[Chunk]) -> dict[str, Any]:
    waits = np.concatenate([c.waits for c in chunks])
    return {
        "rows_per_s": [c.rows / c.seconds for c in chunks],
        "batches": int(waits.size),
        "wait_mean_s": float(waits.mean()),
        "wait_p95_s": float(np.percentile(waits, 95)),
    }


def learner_rank(comm: Any, config: Any, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Rank 0: prefill, then the frozen phase (interleaved with the baselines), then stepping."""
    import jax

    from agentenv_jax.learner.sac_training import sac_networks_for
    from agentenv_jax.networks.flat_params import FlatLayout
    from agentenv_jax.runtime.roles import prepare_env_rank, replay_plan
    from agentenv_jax.transport import messages
    from agentenv_jax.transport.topology import make_topology

    algo = config.algorithm
    topology = make_topology(config, comm.Get_size(), comm.Get_rank())
    num_partitions = topology.num_env_ranks
    # The single-process topology: one buffer of the full capacity, for the baselines.
    local_topology = make_topology(config, 1, 0)
    local_env, spaces = prepare_env_rank(config, local_topology)
    plan = replay_plan(config, topology, spaces)
    local_plan = replay_plan(config, local_topology, spaces)
    specs = types.SimpleNamespace(
        request=messages.sample_request_spec(),
        answer=messages.sample_answer_spec(algo.batch_size, spaces.obs_shape, spaces.action_size),
        priority=messages.priority_update_spec(algo.batch_size),
    )
    channel = plan.make_mpi_learner_channel(types.SimpleNamespace(comm=comm))
    transport = local_plan.make_inprocess()
    local_actor = local_plan.make_actor(local_env, transport.actor)

    # Initial actor parameters: env ranks use the policy once their random steps are done.
    networks = sac_networks_for(config, spaces)
    actor_params = networks.init(jax.random.PRNGKey(config.run.seed))[0]
    message = plan.param_spec.allocate()
    fields = plan.param_spec.views(message)
    fields["version"][0] = 0
    fields["params"][:] = np.asarray(FlatLayout(actor_params).ravel(actor_params))
    channel.broadcast_params(message)
    transport.learner.broadcast_params(message)

    prioritized = algo.prioritized
    mpi = Sampler(
        channel, specs, num_partitions, algo.batch_size, prioritized, args.seed, args.timeout
    )
    started = time.perf_counter()
    targets = np.array(
        [
            math.ceil(algo.replay_capacity * n / topology.global_num_envs)
            for n in topology.local_num_envs
        ]
    )
    mpi.fill(targets, args.timeout)
    fill_s = time.perf_counter() - started

    partition = local_actor._partition  # private; the direct baseline samples it too
    fill_synthetic(partition, args.seed)
    inprocess = Sampler(
        transport.learner,
        specs,
        1,
        algo.batch_size,
        prioritized,
        args.seed,
        args.timeout,
        serve=local_actor.run_once,
    )
    inprocess.send(np.zeros(1, np.int64))  # a zero-row request: learn the buffer's mass
    inprocess.receive()
    sides = {
        "direct": DirectSampler(partition, algo.batch_size, args.seed),
        "inprocess": inprocess,
        "mpi": mpi,
    }
    work_s = args.work_ms / 1e3

    result: dict[str, Any] = {
        "mode": mode,
        "partitions": num_partitions,
        "local_num_envs": list(topology.local_num_envs),
        "capacity": algo.replay_capacity,
        "batch_size": algo.batch_size,
        "work_ms": args.work_ms,
        "prefill_s": fill_s,
        "partition_sizes": mpi.sizes.tolist(),
        "phases": {},
    }
    if "frozen" in args.phases:
        counts = {name: _probe(side, work_s, args.chunk_seconds) for name, side in sides.items()}
        chunks: dict[str, list[Chunk]] = {name: [] for name in sides}
        names = list(sides)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                chunks[name].append(sides[name].chunk(counts[name], work_s))
        result["phases"]["frozen"] = {name: _summary(c) for name, c in chunks.items()}
        result["frozen_actor_seconds"] = mpi.actor_seconds.tolist()
    if "stepping" in args.phases:
        mpi.allowance[:] = NO_LIMIT
        produced = mpi.produced.sum()
        warm_until = time.perf_counter() + args.warmup_seconds
        while time.perf_counter() < warm_until:  # includes the first policy compile on env ranks
            mpi.chunk(10, work_s)
        count = _probe(mpi, work_s, args.chunk_seconds)
        produced_from, tick = mpi.produced.sum(), time.perf_counter()
        chunks_stepping = [mpi.chunk(count, work_s) for _ in range(args.rounds)]
        steps_s = (mpi.produced.sum() - produced_from) / (time.perf_counter() - tick)
        result["phases"]["stepping"] = {"mpi": _summary(chunks_stepping)}
        result["stepping_env_steps_per_s"] = float(steps_s)
        result["stepping_env_steps"] = int(mpi.produced.sum() - produced)

    channel.request_stop()
    reports, _ = channel.collect_final_reports(args.timeout)
    result["reports"] = reports
    # The partitions' own count of rows they sampled must match what rank 0 asked for.
    result["sampled_reconciles"] = sum(r["sampled"] for r in reports) == mpi.requested_rows
    transport.learner.request_stop()
    local_actor.run_once()
    local_actor.finish()
    return result


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        raise SystemExit("replay_sampling workers need >= 2 ranks (mpiexec -n P+1)")
    if world.Get_rank() > 0:
        from agentenv_jax.runtime.roles import single_threaded_xla

        single_threaded_xla()  # as launch.run_mpi does on env ranks
    for mode in args.modes:
        comm = world.Dup()  # a fresh communicator per case: nothing left over can match
        config = case_config(args, mode == "prioritized")
        if comm.Get_rank() == 0:
            result = learner_rank(comm, config, args, mode)
            print(RESULT_PREFIX + json.dumps(result), flush=True)
        else:
            env_rank(comm, config)
        comm.Free()


def launch(args: argparse.Namespace, partitions: int) -> list[dict[str, Any]]:
    started = time.perf_counter()
    results = common.run_self_under_mpiexec(
        __file__, partitions + 1, RESULT_PREFIX, args.job_timeout
    )
    for result in results:
        result["job_s"] = time.perf_counter() - started
    return results


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f}"


def _rate(stats: dict[str, Any]) -> float:
    return statistics.median(stats["rows_per_s"])


def print_report(results: list[dict[str, Any]]) -> None:
    """One row per (mode, partitions, actor phase): the MPI side and, beside it, the two
    baselines of the same job (its frozen phase); ratios are MPI / baseline, transitions/s."""
    header = (
        f"{'mode':<11} {'P':>1} {'actors':<8} | {'MPI trans/s':>11} {'wait ms':>7} "
        f"{'p95 ms':>6} | {'in-proc t/s':>11} {'wait ms':>7} | {'direct t/s':>10} "
        f"{'wait ms':>7} | {'/in-proc':>8} {'/direct':>7}"
    )
    common.print_header(header)
    for mode in MODES:
        cases = sorted((r for r in results if r["mode"] == mode), key=lambda r: r["partitions"])
        for phase in PHASES:
            for case in cases:
                mpi = case["phases"].get(phase, {}).get("mpi")
                if mpi is None:
                    continue
                line = (
                    f"{mode:<11} {case['partitions']:>1} {phase:<8} | {_rate(mpi):>11,.0f} "
                    f"{_ms(mpi['wait_mean_s']):>7} {_ms(mpi['wait_p95_s']):>6} |"
                )
                frozen = case["phases"].get("frozen")
                if frozen is not None:
                    inproc, direct = frozen["inprocess"], frozen["direct"]
                    line += (
                        f" {_rate(inproc):>11,.0f} {_ms(inproc['wait_mean_s']):>7} |"
                        f" {_rate(direct):>10,.0f} {_ms(direct['wait_mean_s']):>7} |"
                        f" {_rate(mpi) / _rate(inproc):>8.3f} {_rate(mpi) / _rate(direct):>7.3f}"
                    )
                print(line)
    for case in results:
        if not case.get("sampled_reconciles", True):
            print(f"WARNING: P={case['partitions']} {case['mode']}: sampled rows do not reconcile")
    steps = [
        f"P={c['partitions']} {c['mode']}: {c['stepping_env_steps_per_s']:,.0f}"
        for c in results
        if "stepping_env_steps_per_s" in c
    ]
    print(
        "\nwait: rank 0's seconds per batch in wait_answers (baselines: getting a batch, serving "
        "included).\nin-proc / direct: one buffer of the full capacity, measured in the same job "
        "(interleaved\nwith its frozen phase; the stepping rows reuse them)."
    )
    if steps:
        print("env steps/s inserted by all partitions while stepping: " + ", ".join(steps))
    print(
        "prefill, stepping to capacity (s): "
        + ", ".join(f"P={c['partitions']} {c['mode']}: {c['prefill_s']:.1f}" for c in results)
    )


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__, config=DEFAULT_CONFIG, config_help="SAC experiment YAML")
    parser.add_argument(
        "--partitions", type=int, nargs="+", default=[1, 2, 3], help="partition counts (P)"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--batch-size", type=int, default=256, help="rows per global batch")
    parser.add_argument(
        "--capacity", type=int, default=50_000, help="total replay capacity (all partitions)"
    )
    parser.add_argument("--envs", type=int, default=6, help="envs over all env ranks")
    common.add_round_arguments(parser, rounds=5, chunk_seconds=0.2, seconds=None)
    parser.add_argument(
        "--warmup-seconds", type=float, default=1.0, help="untimed sampling when stepping starts"
    )
    parser.add_argument(
        "--work-ms", type=float, default=0.0, help="busy CPU ms per batch on rank 0 (an update)"
    )
    parser.add_argument("--seed", type=int, default=0)
    common.add_mpi_job_arguments(parser, job_timeout_s=600.0)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if common.work_if_rank(args, worker):
        return
    print(
        f"replay sampling: batch {args.batch_size}, capacity {args.capacity:,} in total, "
        f"{args.envs} Pendulum-v1 envs over all partitions\n{common.provenance()}"
    )
    print(
        f"{args.rounds} rounds of ~{args.chunk_seconds:g} s per side; frozen rows interleave "
        f"MPI with both baselines; work per batch {args.work_ms:g} ms\n",
        flush=True,
    )
    results = []
    for partitions in args.partitions:
        done = launch(args, partitions)
        results += done
        print(f"  mpiexec -n {partitions + 1}: {done[0]['job_s']:.1f} s", flush=True)
    print()
    print_report(results)
    common.save_json(args.json, results)


if __name__ == "__main__":
    main()
