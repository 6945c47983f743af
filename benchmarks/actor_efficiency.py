"""Actor efficiency: env-rank steps/s with inference and shipping, over a plain act+step loop.

Both sides step the same kind of Gymnasium vector env with the same jit-compiled `ActorPolicy`:

* **plain**: `policy.act(obs)` then `vector_env.step(action)`, nothing else;
* **framework**: the real `agentenv_jax.actor.loop.Actor` (built like `roles.build_actor`),
  filling and shipping on-policy segments, with a minimal learner side that takes each segment
  (`receive_round`/`release_round`) and re-broadcasts the same parameters as version + 1 (no
  gradient update), so only the env rank's own cost is measured.

Both sides count every `vector_env.step` call times the number of envs. They run in the same
process, interleaved in chunks of ~`--chunk-seconds` (ABBA order) so that the shared machine's
noise hits both alike; each round gives one ratio framework / plain steps/s, and the script
reports the median over rounds. Goal: >= 0.9.

The in-process variant uses `InProcessTransport`; the MPI variant re-launches this script under
`mpiexec -n 2` (rank 0: the minimal learner over `MPILearnerChannel`; rank 1: the env rank over
`MPIActorChannel`, single-threaded XLA as `launch.run_mpi` sets it), so it also includes the
synchronous round trip to a learner in another process. (The parameters for a chunk's first
segment arrive while the plain side runs, so one round trip in `chunk_segments` is not timed.)

Recorded in docs/benchmarks.md ("Current results", section 1) from the first command:

    python benchmarks/actor_efficiency.py                 # CartPole, 8 and 64 envs, sync+native
    python benchmarks/actor_efficiency.py --rounds 9 --seconds 2 --envs 8 64 256
    python benchmarks/actor_efficiency.py --no-mpi        # in-process variant only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import common
import numpy as np
from actor_sides import (
    CaseResult,
    InProcessFramework,
    Phase,
    PlainLoop,
    make_setup,
    merge,
    timer_reader,
)

DEFAULT_CONFIG = common.EXPERIMENTS / "cartpole_ppo.yaml"
GOAL = 0.9
RESULT_PREFIX = "ACTOR_EFFICIENCY_RESULT "
WARMUP_SEGMENTS = 8  # > the actor's queue capacity, so compile-time timers have cycled out
SETUP_TAG = 901  # pickled start-up / result messages of the MPI variant (not a transport tag)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Each round alternates `chunks` chunks of `chunk_segments` segments per side."""

    rounds: int
    chunks: int
    chunk_segments: int

    @property
    def segments_per_side(self) -> int:
        return self.rounds * self.chunks * self.chunk_segments


def make_schedule(plain: PlainLoop, args: argparse.Namespace) -> Schedule:
    """Size chunks (~`--chunk-seconds`) and rounds (~`--seconds` per side) from a timed plain
    warm-up."""
    probe = plain.run_segments(4)
    per_segment = probe.wall_s / 4
    chunk_segments = max(1, round(args.chunk_seconds / per_segment))
    chunks = max(2, round(args.seconds / (chunk_segments * per_segment)))
    return Schedule(args.rounds, chunks, chunk_segments)


def interleave(
    result: CaseResult,
    schedule: Schedule,
    plain: Callable[[int], Phase],
    framework: Callable[[int], Phase],
) -> None:
    """Run both sides chunk by chunk (ABBA order, so neither side always goes first)."""
    for r in range(schedule.rounds):
        plain_phases, framework_phases = [], []
        for c in range(schedule.chunks):
            if (r + c) % 2 == 0:
                plain_phases.append(plain(schedule.chunk_segments))
                framework_phases.append(framework(schedule.chunk_segments))
            else:
                framework_phases.append(framework(schedule.chunk_segments))
                plain_phases.append(plain(schedule.chunk_segments))
        result.plain.append(merge(plain_phases))
        result.framework.append(merge(framework_phases))


def run_inprocess_case(args: argparse.Namespace, vectorization: str, num_envs: int) -> CaseResult:
    setup = make_setup(args.config, vectorization, num_envs, args.timeout)
    plain = PlainLoop(setup)
    framework = InProcessFramework(setup)
    plain.run_segments(WARMUP_SEGMENTS)  # compiles the policy for this batch
    framework.run_segments(WARMUP_SEGMENTS)
    framework.take_timers()
    schedule = make_schedule(plain, args)
    result = CaseResult("in-process", vectorization, num_envs, [], [], [])
    interleave(result, schedule, plain.run_segments, framework.run_segments)
    result.framework_timers = framework.take_timers()
    framework.close()
    plain.close()
    return result


def mpi_worker(args: argparse.Namespace) -> None:
    """One rank of the `mpiexec -n 2` variant: rank 0 the echoing learner, rank 1 the env rank."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit("the MPI variant needs exactly 2 ranks (mpiexec -n 2)")
    if world.Get_rank() == 1:
        from agentenv_jax.config.loading import load_config
        from agentenv_jax.runtime.roles import single_threaded_xla

        # As launch.run_mpi does on env ranks, before the first XLA computation.
        if load_config(args.config).topology.single_threaded_env_ranks:
            single_threaded_xla()
    for vectorization in args.vectorizations:
        for num_envs in args.envs:
            # A fresh communicator per case: no stale credit or parameter message of an earlier
            # case can match a receive of this one.
            comm = world.Dup()
            if comm.Get_rank() == 0:
                _mpi_learner(comm)
            else:
                result = _mpi_env_rank(comm, args, vectorization, num_envs)
                print(RESULT_PREFIX + json.dumps(result.as_dict()), flush=True)
            comm.Free()


def _mpi_learner(comm: Any) -> None:
    from agentenv_jax.transport.mpi import MPILearnerChannel

    plan = comm.recv(source=1, tag=SETUP_TAG)
    segment_spec, param_spec = plan["segment_spec"], plan["param_spec"]
    channel = MPILearnerChannel(
        comm, [1], [segment_spec.nbytes], plan["max_inflight"], param_spec.nbytes
    )
    message = plan["param_message"]
    version = param_spec.views(message)["version"]
    channel.broadcast_params(message)
    timers = np.zeros(3)
    read_timers = timer_reader(segment_spec)
    for index in range(plan["total_segments"]):
        (segment,) = channel.receive_round(plan["timeout_s"])
        if index >= plan["warmup_segments"]:
            timers += read_timers(segment)
        channel.release_round()
        if index + 1 < plan["total_segments"]:
            version[0] += 1
            channel.broadcast_params(message)
    channel.request_stop()
    channel.collect_final_reports(plan["timeout_s"])
    comm.send(timers.tolist(), dest=1, tag=SETUP_TAG)


def _mpi_env_rank(
    comm: Any, args: argparse.Namespace, vectorization: str, num_envs: int
) -> CaseResult:
    from agentenv_jax.runtime.roles import build_actor, prepare_env_rank
    from agentenv_jax.transport.mpi import MPIActorChannel

    setup = make_setup(args.config, vectorization, num_envs, args.timeout)
    config = setup.config
    plain = PlainLoop(setup)
    plain.run_segments(WARMUP_SEGMENTS)
    schedule = make_schedule(plain, args)
    comm.send(
        {
            "segment_spec": setup.segment_spec,
            "param_spec": setup.param_spec,
            "param_message": setup.param_message,
            "max_inflight": config.topology.max_inflight_segments,
            "warmup_segments": WARMUP_SEGMENTS,
            "total_segments": WARMUP_SEGMENTS + schedule.segments_per_side,
            "timeout_s": config.run.transport_timeout_s,
        },
        dest=0,
        tag=SETUP_TAG,
    )
    vector_env, spaces = prepare_env_rank(config, setup.topology)
    channel = MPIActorChannel(comm, learner_rank=0, param_nbytes=setup.param_spec.nbytes)
    actor = build_actor(
        config, setup.topology, vector_env, spaces, channel, setup.segment_spec, setup.param_spec
    )
    rollout_length = config.algorithm.rollout_length

    def framework_phase(segments: int) -> Phase:
        started = time.perf_counter()
        for _ in range(segments):
            actor.run_once()
        return Phase(time.perf_counter() - started, segments * rollout_length, num_envs)

    framework_phase(WARMUP_SEGMENTS)
    result = CaseResult("mpi -n 2", vectorization, num_envs, [], [], [])
    interleave(result, schedule, plain.run_segments, framework_phase)
    if actor.run_once():
        raise RuntimeError("the echoing learner did not ask the env rank to stop")
    actor.finish()
    plain.close()
    result.framework_timers = comm.recv(source=0, tag=SETUP_TAG)
    return result


def run_mpi_cases(args: argparse.Namespace) -> list[CaseResult]:
    if common.find_mpiexec() is None:
        print("mpiexec not found: skipping the MPI variant", file=sys.stderr)
        return []
    results = common.run_self_under_mpiexec(__file__, 2, RESULT_PREFIX, args.job_timeout)
    return [CaseResult.from_dict(result) for result in results]


def _us(seconds: float, vector_steps: int) -> str:
    return f"{1e6 * seconds / vector_steps:7.1f}"


def print_report(results: list[CaseResult]) -> None:
    """One line per case: median steps/s of both sides, the median ratio, and a breakdown."""
    header = (
        f"{'variant':<11} {'vec':<6} {'envs':>4} | {'plain steps/s':>13} {'actor steps/s':>13} | "
        f"{'ratio':>5} {'min':>5} {'max':>5} {'goal':>5} | "
        f"{'plain us/vstep':>14} | {'actor us/vstep (env  infer  transp  other)':>44}"
    )
    common.print_header(header)
    for case in results:
        ratios = case.ratios
        plain_rate = statistics.median(p.steps_per_s for p in case.plain)
        fw_rate = statistics.median(f.steps_per_s for f in case.framework)
        plain_steps = sum(p.vector_steps for p in case.plain)
        plain_wall = sum(p.wall_s for p in case.plain)
        fw_steps = sum(f.vector_steps for f in case.framework)
        fw_wall = sum(f.wall_s for f in case.framework)
        env_s, infer_s, transport_s = case.framework_timers
        other_s = fw_wall - env_s - infer_s - transport_s
        print(
            f"{case.variant:<11} {case.vectorization:<6} {case.num_envs:>4} | "
            f"{plain_rate:>13,.0f} {fw_rate:>13,.0f} | "
            f"{common.ratio_cells(ratios, GOAL)} | "
            f"{_us(plain_wall, plain_steps)} "
            f"({_us(sum(p.env_s for p in case.plain), plain_steps).strip()} env "
            f"+ {_us(sum(p.inference_s for p in case.plain), plain_steps).strip()} inf) | "
            f"{_us(fw_wall, fw_steps)} ({_us(env_s, fw_steps)} {_us(infer_s, fw_steps)} "
            f"{_us(transport_s, fw_steps)} {_us(other_s, fw_steps)})"
        )


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__, config=DEFAULT_CONFIG)
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 64], help="envs per env rank")
    parser.add_argument(
        "--vectorizations",
        nargs="+",
        default=["sync", "native"],
        choices=["sync", "native", "async"],
        help="gymnasium vector env kinds to measure",
    )
    common.add_round_arguments(parser, rounds=5, chunk_seconds=0.2, seconds=1.0)
    parser.add_argument("--no-mpi", action="store_true", help="skip the mpiexec -n 2 variant")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process variant")
    common.add_mpi_job_arguments(parser, job_timeout_s=900.0, transport_timeout_s=120.0)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if common.work_if_rank(args, mpi_worker):
        return
    print(f"actor efficiency: {args.config.name}\n{common.provenance()}")
    print(common.rounds_line(args, "framework / plain steps/s", GOAL))
    results: list[CaseResult] = []
    if not args.no_inprocess:
        for vectorization in args.vectorizations:
            for num_envs in args.envs:
                results.append(run_inprocess_case(args, vectorization, num_envs))
    if not args.no_mpi:
        results.extend(run_mpi_cases(args))
    print_report(results)
    print(
        "\nus/vstep: microseconds per vector step (one policy call + one env.step of all envs). "
        "The actor's\nbreakdown is its own segment timers (env.step; policy calls; waiting for "
        "params + shipping);\n'other' is the rest: segment bookkeeping and, in-process, the "
        "echoing learner's copies."
    )
    common.save_json(args.json, [r.as_dict() for r in results])


if __name__ == "__main__":
    main()
