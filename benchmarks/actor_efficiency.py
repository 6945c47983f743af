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
from pathlib import Path
from typing import Any

import numpy as np
from common import find_mpiexec, provenance, run_rank_or_abort, run_script_under_mpiexec

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "experiments" / "cartpole_ppo.yaml"
GOAL = 0.9
RESULT_PREFIX = "ACTOR_EFFICIENCY_RESULT "
WARMUP_SEGMENTS = 8  # > the actor's queue capacity, so compile-time timers have cycled out
SETUP_TAG = 901  # pickled start-up / result messages of the MPI variant (not a transport tag)


@dataclasses.dataclass
class Phase:
    """One timed stretch of one side: wall time, vector steps, and where the time went."""

    wall_s: float
    vector_steps: int
    num_envs: int
    env_s: float = 0.0
    inference_s: float = 0.0
    transport_s: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.vector_steps * self.num_envs / self.wall_s


@dataclasses.dataclass
class CaseResult:
    """The rounds of one (variant, vectorization, envs) case."""

    variant: str
    vectorization: str
    num_envs: int
    plain: list[Phase]
    framework: list[Phase]
    framework_timers: list[float]  # summed actor_seconds of the measured segments (see below)

    @property
    def ratios(self) -> list[float]:
        return [
            f.steps_per_s / p.steps_per_s for p, f in zip(self.plain, self.framework, strict=True)
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "vectorization": self.vectorization,
            "num_envs": self.num_envs,
            "plain": [dataclasses.asdict(p) for p in self.plain],
            "framework": [dataclasses.asdict(p) for p in self.framework],
            "framework_timers": self.framework_timers,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        return cls(
            data["variant"],
            data["vectorization"],
            data["num_envs"],
            [Phase(**p) for p in data["plain"]],
            [Phase(**p) for p in data["framework"]],
            data["framework_timers"],
        )


def timer_reader(segment_spec: Any) -> Callable[[np.ndarray], np.ndarray]:
    """Reads a segment's `actor_seconds` [3] without building every field view (which costs
    ~100 us per call), so the echoing learner stays as cheap as possible.

    NOTE: `Actor.run_once` writes these timers after it has handed the buffer to the transport,
    so a received segment carries the timers of an earlier one (the buffer's previous use,
    `max_inflight_segments + 1` segments back). Summed over many steady-state segments after a
    warm-up longer than that, the totals are still right.
    """
    probe = segment_spec.allocate()
    view = segment_spec.views(probe)["actor_seconds"]
    start = view.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
    stop = start + view.nbytes
    return lambda segment: segment[start:stop].view(np.float64)


@dataclasses.dataclass
class EnvRankSetup:
    """What both sides share: config, topology, spaces, message specs and one parameter message."""

    config: Any
    topology: Any
    spaces: Any
    segment_spec: Any
    param_spec: Any
    param_message: np.ndarray  # version 0, initial parameters, empty normalizer statistics


def make_setup(config_path: Path, vectorization: str, num_envs: int) -> EnvRankSetup:
    """Resolve the config for this case and build the parameter message a learner would send."""
    import jax

    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.envs import normalization as norm
    from agentenv_jax.networks import init_params
    from agentenv_jax.runtime.policies import actor_critic_network
    from agentenv_jax.runtime.roles import prepare_env_rank
    from agentenv_jax.transport.messages import param_message_spec
    from agentenv_jax.transport.topology import make_topology

    config = load_config(
        config_path,
        [
            f"env.global_num_envs={num_envs}",
            f"env.vectorization={vectorization}",
            "run.progress=false",
        ],
    )
    topology = make_topology(config, world_size=1, rank=0)
    probe, spaces = prepare_env_rank(config, topology)
    probe.close()
    module, _, layout = actor_critic_network(config, spaces)
    # The same specs launch derives for an on-policy run with one env rank.
    segment_spec = on_policy_segment_spec(spaces, config.algorithm.rollout_length, num_envs)
    param_spec = param_message_spec(layout.num_params, spaces.obs_dim)
    params = init_params(module, spaces.obs_shape, jax.random.key(config.run.seed))
    message = param_spec.allocate()
    fields = param_spec.views(message)
    fields["version"][0] = 0
    fields["params"][:] = np.asarray(layout.ravel(params))
    for name, dim in (("obs_stats", spaces.obs_dim), ("return_stats", 1)):
        stats = norm.empty_stats(dim)
        fields[name][:] = np.concatenate([[stats.count], stats.mean, stats.m2])
    return EnvRankSetup(config, topology, spaces, segment_spec, param_spec, message)


class PlainLoop:
    """`policy.act` + `vector_env.step` and nothing else (the same policy class and env)."""

    def __init__(self, setup: EnvRankSetup):
        from agentenv_jax.envs.factory import make_vector_env
        from agentenv_jax.runtime.policies import build_actor_policy

        config, spaces, topology = setup.config, setup.spaces, setup.topology
        self._policy = build_actor_policy(config, topology, spaces)  # as the actor's own
        self._policy.set_params(setup.param_spec.views(setup.param_message)["params"])
        self._env = make_vector_env(config.env, topology.local_num_envs[0])
        self._continuous = spaces.action_kind == "continuous"
        if self._continuous:
            self._low = np.asarray(spaces.action_low, dtype=np.float32)
            self._high = np.asarray(spaces.action_high, dtype=np.float32)
        self._obs, _ = self._env.reset(seed=config.run.seed)
        self._rollout_length = config.algorithm.rollout_length

    def run_segments(self, count: int) -> Phase:
        steps = count * self._rollout_length
        env_s = inference_s = 0.0
        obs = self._obs
        started = time.perf_counter()
        for _ in range(steps):
            tick = time.perf_counter()
            action, _, _ = self._policy.act(obs)
            if self._continuous:
                action = np.clip(action, self._low, self._high)
            tock = time.perf_counter()
            obs, _, _, _, _ = self._env.step(action)
            env_s += time.perf_counter() - tock
            inference_s += tock - tick
        wall_s = time.perf_counter() - started
        self._obs = obs
        return Phase(wall_s, steps, self._env.num_envs, env_s, inference_s)

    def close(self) -> None:
        self._env.close()


class InProcessFramework:
    """The real Actor over the in-process transport, fed by a learner that only echoes params."""

    def __init__(self, setup: EnvRankSetup):
        from agentenv_jax.runtime.roles import build_actor, prepare_env_rank
        from agentenv_jax.transport.inprocess import InProcessTransport

        self._setup = setup
        config = setup.config
        vector_env, spaces = prepare_env_rank(config, setup.topology)
        self._transport = InProcessTransport(config.topology.max_inflight_segments)
        self._actor = build_actor(
            config,
            setup.topology,
            vector_env,
            spaces,
            self._transport.actor,
            setup.segment_spec,
            setup.param_spec,
        )
        self._learner = self._transport.learner
        self._message = setup.param_message.copy()
        self._version = setup.param_spec.views(self._message)["version"]
        self._learner.broadcast_params(self._message)
        self._timers = np.zeros(3)
        self._read_timers = timer_reader(setup.segment_spec)
        self._timeout_s = config.run.transport_timeout_s

    def run_segments(self, count: int) -> Phase:
        """`count` rounds of: actor fills and ships a segment; learner takes it, sends version+1."""
        rollout_length = self._setup.config.algorithm.rollout_length
        timers = np.zeros(3)
        started = time.perf_counter()
        for _ in range(count):
            self._actor.run_once()
            (segment,) = self._learner.receive_round(self._timeout_s)
            timers += self._read_timers(segment)
            self._learner.release_round()
            self._version[0] += 1
            self._learner.broadcast_params(self._message)
        wall_s = time.perf_counter() - started
        self._timers += timers
        num_envs = self._setup.topology.local_num_envs[0]
        return Phase(wall_s, count * rollout_length, num_envs, *timers)

    def take_timers(self) -> list[float]:
        timers, self._timers = self._timers, np.zeros(3)
        return timers.tolist()

    def close(self) -> None:
        self._learner.request_stop()
        self._actor.run_once()
        self._actor.finish()
        self._learner.collect_final_reports(self._timeout_s)


def merge(phases: list[Phase]) -> Phase:
    """The phases of one side in one round, as one."""
    return Phase(
        sum(p.wall_s for p in phases),
        sum(p.vector_steps for p in phases),
        phases[0].num_envs,
        sum(p.env_s for p in phases),
        sum(p.inference_s for p in phases),
        sum(p.transport_s for p in phases),
    )


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
    setup = make_setup(args.config, vectorization, num_envs)
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

    setup = make_setup(args.config, vectorization, num_envs)
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
    if find_mpiexec() is None:
        print("mpiexec not found: skipping the MPI variant", file=sys.stderr)
        return []
    worker_args = [
        "--mpi-worker",
        "--config",
        str(args.config),
        "--rounds",
        str(args.rounds),
        "--seconds",
        str(args.seconds),
        "--chunk-seconds",
        str(args.chunk_seconds),
        "--vectorizations",
        *args.vectorizations,
        "--envs",
        *map(str, args.envs),
    ]
    results = run_script_under_mpiexec(__file__, 2, worker_args, RESULT_PREFIX, args.timeout)
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
    print(header)
    print("-" * len(header))
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
        ok = "ok" if statistics.median(ratios) >= GOAL else "MISS"
        print(
            f"{case.variant:<11} {case.vectorization:<6} {case.num_envs:>4} | "
            f"{plain_rate:>13,.0f} {fw_rate:>13,.0f} | "
            f"{statistics.median(ratios):5.3f} {min(ratios):5.3f} {max(ratios):5.3f} "
            f"{ok:>5} | "
            f"{_us(plain_wall, plain_steps)} "
            f"({_us(sum(p.env_s for p in case.plain), plain_steps).strip()} env "
            f"+ {_us(sum(p.inference_s for p in case.plain), plain_steps).strip()} inf) | "
            f"{_us(fw_wall, fw_steps)} ({_us(env_s, fw_steps)} {_us(infer_s, fw_steps)} "
            f"{_us(transport_s, fw_steps)} {_us(other_s, fw_steps)})"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="experiment YAML")
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 64], help="envs per env rank")
    parser.add_argument(
        "--vectorizations",
        nargs="+",
        default=["sync", "native"],
        choices=["sync", "native", "async"],
        help="gymnasium vector env kinds to measure",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds (ratios) per case")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="approx. seconds per side per round"
    )
    parser.add_argument(
        "--chunk-seconds",
        type=float,
        default=0.2,
        help="approx. seconds per chunk: within a round the sides alternate chunk by chunk",
    )
    parser.add_argument("--no-mpi", action="store_true", help="skip the mpiexec -n 2 variant")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process variant")
    parser.add_argument("--timeout", type=float, default=900.0, help="limit for the MPI job (s)")
    parser.add_argument("--json", type=Path, help="also write every phase to this JSON file")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.mpi_worker:
        run_rank_or_abort(lambda: mpi_worker(args))
        return
    print(f"actor efficiency: {args.config.name}\n{provenance()}")
    print(
        f"{args.rounds} rounds of ~{args.seconds:g} s per side; ratio = framework / plain "
        f"steps/s, median over rounds (goal >= {GOAL})\n"
    )
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
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in results], indent=1) + "\n")


if __name__ == "__main__":
    main()
