"""Transport efficiency: experience bytes/s through the MPI transport over a raw mpi4py stream.

Two ranks (`mpiexec -n 2`; the script re-launches itself with `sys.executable`). Rank 1 plays an
env rank and streams on-policy CartPole segments (`on_policy_segment_spec`, `T` x `E`) to rank 0
through the real `MPIActorChannel` / `MPILearnerChannel`: a `SegmentQueue` of
`max_inflight + 1` buffers, credits granted by the learner (`receive_round` + `release_round`),
its Test-and-back-off waits. The baseline, measured in the same run and interleaved chunk by
chunk with it, is a raw one-way stream of the same number of bytes: `comm.Send` of a numpy
`uint8` buffer on rank 1, `comm.Recv` on rank 0 (MPICH's blocking calls, which spin).

Both sides are timed on the receiver from a barrier to the last message's arrival. The ratio is
transport bytes/s over raw bytes/s, median over rounds. Goal: >= 0.8.

`--layout atari` streams Atari segments instead (`T` x `E` steps of `(84, 84, 4)` uint8 frame
stacks, `pong_ppo`'s 128 x 8 by default) in both layouts: whole stacks, and one frame per step
(`buffers.frame_stacks`), and times the learner's re-stacking of a received frame segment
(`restack`, on rank 0 after the rounds). It prints the frame layout's seconds per segment,
re-stacking included, over the whole layout's.

Recorded in docs/benchmarks.md ("Current results", section 2) from the first command:

    python benchmarks/transport_efficiency.py
    python benchmarks/transport_efficiency.py --envs 8 64 585 --credits 1 2 8 --rounds 9
    python benchmarks/transport_efficiency.py --layout atari --envs 8 4 --rollout-length 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import common
import numpy as np

GOAL = 0.8
RESULT_PREFIX = "TRANSPORT_EFFICIENCY_RESULT "
RAW_TAG = 907  # not one of the transport's tags; each case also runs on its own communicator


LAYOUTS = {"cartpole": ("cartpole",), "atari": ("atari-whole", "atari-frames")}


def segment_spec(layout: str, rollout_length: int, num_envs: int) -> Any:
    """The segment layout an env rank with `num_envs` envs sends: CartPole-v1's, or Atari's
    `(84, 84, 4)` frame stacks whole (`atari-whole`) or one frame per step (`atari-frames`)."""
    import gymnasium as gym

    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.envs.factory import EnvSpaces, describe_spaces

    if layout == "cartpole":
        env = gym.make("CartPole-v1")
        spaces = describe_spaces("CartPole-v1", env.observation_space, env.action_space)
        env.close()
    else:
        spaces = EnvSpaces(
            obs_shape=(84, 84, 4),
            action_kind="discrete",
            action_size=6,
            action_shape=(),
            action_low=None,
            action_high=None,
            obs_dtype="uint8",
            stacked_frames=4 if layout == "atari-frames" else 0,
        )
    return on_policy_segment_spec(spaces, rollout_length, num_envs)


def restack_seconds(spec: Any, rng: np.random.Generator, repeats: int = 5) -> float:
    """The learner's seconds to stack one frame segment of `spec` again (median of `repeats`),
    random frames with a game restarting every ~300 steps."""
    from agentenv_jax.buffers.frame_stacks import restack

    fields = spec.views(spec.allocate())
    fields["obs_frame"][...] = rng.integers(0, 256, fields["obs_frame"].shape, dtype=np.uint8)
    fields["obs_restart"][...] = rng.random(fields["obs_restart"].shape) < 1 / 300
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        restack(fields["obs_frame"], fields["obs_head"], fields["obs_restart"])
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _raw_chunk(comm: Any, buffer: np.ndarray, count: int) -> float:
    """Rank 1 sends `count` buffers with blocking Send, rank 0 receives them; rank 0's seconds."""
    comm.Barrier()
    started = time.perf_counter()
    if comm.Get_rank() == 1:
        for _ in range(count):
            comm.Send(buffer, dest=0, tag=RAW_TAG)
    else:
        for _ in range(count):
            comm.Recv(buffer, source=1, tag=RAW_TAG)
    return time.perf_counter() - started


def _transport_chunk(comm: Any, channel: Any, queue: Any, count: int, timeout_s: float) -> float:
    """`count` segments through the channels, credits and all; rank 0's seconds."""
    comm.Barrier()
    started = time.perf_counter()
    if comm.Get_rank() == 1:
        # The env rank has nothing else to do here, so it pumps without pausing: the transport is
        # measured at the rate its learner end and its credits allow.
        produced = 0
        while produced < count or queue.depth:
            while produced < count and queue.has_free:
                queue.push(queue.acquire())
                produced += 1
            channel.pump(queue)
        channel.flush(queue, timeout_s)
    else:
        for _ in range(count):
            channel.receive_round(timeout_s)
            channel.release_round()
    return time.perf_counter() - started


def run_case(
    world: Any, args: argparse.Namespace, layout: str, num_envs: int, credits: int
) -> dict[str, Any] | None:
    """Both sides of one (segment size, credits) case, interleaved; rank 0 returns the result."""
    from agentenv_jax.buffers.segment_queue import SegmentQueue
    from agentenv_jax.transport.mpi import MPIActorChannel, MPILearnerChannel

    # A fresh communicator per case: nothing left over from an earlier case (a credit, a
    # cancelled receive) can match a message of this one.
    comm = world.Dup()
    rank = comm.Get_rank()
    spec = segment_spec(layout, args.rollout_length, num_envs)
    raw_buffer = np.zeros(spec.nbytes, dtype=np.uint8)
    param_nbytes = 8  # no parameters are broadcast here
    if rank == 0:
        channel = MPILearnerChannel(comm, [1], [spec.nbytes], credits, param_nbytes)
        queue = None
    else:
        channel = MPIActorChannel(comm, learner_rank=0, param_nbytes=param_nbytes)
        queue = SegmentQueue(spec, capacity=credits + 1)
        for _ in range(credits + 1):  # mark every transition valid, as a full segment is
            buffer = queue.acquire()
            spec.views(buffer)["valid"][...] = 1
            queue.release(buffer)

    # Warm up both paths, then size each side's chunks to ~chunk_seconds from a timed probe
    # (rank 0 decides, rank 1 follows): the two sides may differ a lot in speed.
    _raw_chunk(comm, raw_buffer, 20)
    _transport_chunk(comm, channel, queue, 20, args.timeout)
    raw_probe = _raw_chunk(comm, raw_buffer, 50) / 50
    transport_probe = _transport_chunk(comm, channel, queue, 50, args.timeout) / 50
    raw_count, transport_count = comm.bcast(
        (
            max(10, round(args.chunk_seconds / raw_probe)),
            max(10, round(args.chunk_seconds / transport_probe)),
        )
        if rank == 0
        else None,
        root=0,
    )
    chunks = max(2, round(args.seconds / args.chunk_seconds))

    raw_s, transport_s = [], []
    for r in range(args.rounds):
        raw_total = transport_total = 0.0
        for c in range(chunks):
            if (r + c) % 2 == 0:
                raw_total += _raw_chunk(comm, raw_buffer, raw_count)
                transport_total += _transport_chunk(
                    comm, channel, queue, transport_count, args.timeout
                )
            else:
                transport_total += _transport_chunk(
                    comm, channel, queue, transport_count, args.timeout
                )
                raw_total += _raw_chunk(comm, raw_buffer, raw_count)
        raw_s.append(raw_total)
        transport_s.append(transport_total)

    if rank == 1:
        channel.send_final_report({"sent": queue.sent_transitions})
    else:
        reports, late = channel.collect_final_reports(args.timeout)
        if late:
            raise RuntimeError(f"{len(late)} segment(s) arrived after the last round")
    comm.Free()
    if rank != 0:
        return None
    restack_s = None
    if layout == "atari-frames":
        restack_s = restack_seconds(spec, np.random.default_rng(0))
    return {
        "layout": layout,
        "restack_s": restack_s,
        "num_envs": num_envs,
        "rollout_length": args.rollout_length,
        "nbytes": spec.nbytes,
        "credits": credits,
        "raw_messages_per_round": chunks * raw_count,
        "transport_messages_per_round": chunks * transport_count,
        "raw_s": raw_s,
        "transport_s": transport_s,
        "sent_transitions": reports[0]["sent"],
    }


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit("transport_efficiency needs exactly 2 ranks (mpiexec -n 2)")
    for num_envs in args.envs:
        for credits in args.credits:
            for layout in LAYOUTS[args.layout]:
                result = run_case(world, args, layout, num_envs, credits)
                if result is not None:
                    print(RESULT_PREFIX + json.dumps(result), flush=True)


def launch(args: argparse.Namespace) -> list[dict[str, Any]]:
    return common.run_self_under_mpiexec(__file__, 2, RESULT_PREFIX, args.job_timeout)


def print_report(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'segment':>24} {'bytes':>11} {'credits':>7} | {'raw MB/s':>9} {'transport MB/s':>14} | "
        f"{'ratio':>5} {'min':>5} {'max':>5} {'goal':>5} | {'raw us/msg':>10} "
        f"{'transport us/msg':>16}"
    )
    common.print_header(header)
    for case in results:
        nbytes = case["nbytes"]
        raw_messages = case["raw_messages_per_round"]
        transport_messages = case["transport_messages_per_round"]
        raw_rates = [nbytes * raw_messages / s for s in case["raw_s"]]
        transport_rates = [nbytes * transport_messages / s for s in case["transport_s"]]
        ratios = [t / r for t, r in zip(transport_rates, raw_rates, strict=True)]
        shape = f"{case['layout']} {case['rollout_length']}x{case['num_envs']}"
        print(
            f"{shape:>24} {nbytes:>11,} {case['credits']:>7} | "
            f"{statistics.median(raw_rates) / 1e6:>9,.0f} "
            f"{statistics.median(transport_rates) / 1e6:>14,.0f} | "
            f"{common.ratio_cells(ratios, GOAL)} | "
            f"{1e6 * statistics.median(case['raw_s']) / raw_messages:>10.1f} "
            f"{1e6 * statistics.median(case['transport_s']) / transport_messages:>16.1f}"
        )


def print_frame_ratios(results: list[dict[str, Any]]) -> None:
    """Atari: a frame segment's seconds (sent, then re-stacked) over a whole segment's."""
    whole = {(c["num_envs"], c["credits"]): c for c in results if c["layout"] == "atari-whole"}
    common.print_header(
        f"{'segment':>10} {'credits':>7} | {'bytes':>7} {'whole ms':>9} {'frames ms':>10} "
        f"{'restack ms':>11} | {'frames + restack / whole':>25}"
    )
    for case in results:
        if case["layout"] != "atari-frames":
            continue
        base = whole[case["num_envs"], case["credits"]]
        seconds = [
            statistics.median(c["transport_s"]) / c["transport_messages_per_round"]
            for c in (base, case)
        ]
        print(
            f"{case['rollout_length']}x{case['num_envs']:<7} {case['credits']:>7} | "
            f"{case['nbytes'] / base['nbytes']:>7.3f} {1e3 * seconds[0]:>9.2f} "
            f"{1e3 * seconds[1]:>10.2f} {1e3 * case['restack_s']:>11.2f} | "
            f"{(seconds[1] + case['restack_s']) / seconds[0]:>25.3f}"
        )


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__)
    parser.add_argument(
        "--envs",
        type=int,
        nargs="+",
        default=[8, 585],
        help="envs per segment (T x E CartPole segments; 8: the cartpole_ppo segment, 585: ~1 MiB)",
    )
    parser.add_argument(
        "--credits",
        type=int,
        nargs="+",
        default=[2, 8],
        help="max_inflight_segments values to measure (the config default is 2)",
    )
    parser.add_argument("--rollout-length", type=int, default=32, help="T of each segment")
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default="cartpole",
        help="CartPole segments, or Atari's frame stacks whole and one frame per step",
    )
    common.add_round_arguments(parser, rounds=7, chunk_seconds=0.05, seconds=0.6)
    common.add_mpi_job_arguments(parser, job_timeout_s=900.0)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if common.work_if_rank(args, worker):
        return
    print(f"transport efficiency: mpiexec -n 2\n{common.provenance()}")
    print(common.rounds_line(args, "transport / raw Send-Recv bytes/s", GOAL))
    results = launch(args)
    print_report(results)
    if args.layout == "atari":
        print()
        print_frame_ratios(results)
    print(
        "\nus/msg: receiver-side microseconds per segment. The raw side is a blocking "
        "Send/Recv stream of\nthe same bytes; the transport adds credits (one small Isend per "
        "segment), posted receives,\nsegment accounting and Test waits (a 50 us spin, then a "
        "20 us .. 250 us back-off)."
    )
    common.save_json(args.json, results)


if __name__ == "__main__":
    main()
