"""Checks of the MPI transport's waits and on-policy channels; run by
tests/test_transport_waits.py. Prints one `RESULT {json}` line (rank 0 under mpiexec).

`mpiexec -n 3 python transport_stream_job.py stream`: rank 0 is a learner, ranks 1 and 2 env
ranks. For each credit count, every env rank streams `SEGMENTS` numbered segments as fast as the
channels allow (no env stepping), while the learner takes rounds, broadcasts a versioned message
after each and asks the env ranks to stop after the last, as the learner loop does. The learner
checks every round's sequence numbers; the result carries what both ends counted.

`python transport_stream_job.py backoff`: `Backoff` and `wait_until` on a fake clock (one
process, no mpiexec needed).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from agentenv_jax.buffers.segment_queue import SegmentQueue
from agentenv_jax.transport.base import TransportError
from agentenv_jax.transport.mpi import MPIActorChannel, MPILearnerChannel, world
from agentenv_jax.transport.spec import FieldSpec, MessageSpec

SEGMENTS = 400
CREDITS = (1, 2, 8)
TIMEOUT_S = 60.0
SEGMENT_SPEC = MessageSpec(
    [
        FieldSpec("obs", (4, 2, 3), np.float32),
        FieldSpec("valid", (4, 2), np.uint8),
        FieldSpec("sequence", (1,), np.int64),
    ]
)
PARAM_SPEC = MessageSpec([FieldSpec("version", (1,), np.int64)])


def valid_rows(rank: int, sequence: int) -> int:
    """How many of a segment's 8 transitions are valid: varies, so the sums check something."""
    return (rank + sequence) % 9


def learner(comm: MPI.Comm, env_ranks: list[int], credits: int) -> dict[str, Any]:
    channel = MPILearnerChannel(
        comm, env_ranks, [SEGMENT_SPEC.nbytes] * len(env_ranks), credits, PARAM_SPEC.nbytes
    )
    params = PARAM_SPEC.allocate()
    out_of_order, received = 0, [0] * len(env_ranks)
    for expected in range(SEGMENTS):
        buffers = channel.receive_round(TIMEOUT_S)
        for i, buffer in enumerate(buffers):
            fields = SEGMENT_SPEC.views(buffer)
            out_of_order += int(fields["sequence"][0]) != expected
            received[i] += int(fields["valid"].sum())
        channel.release_round()
        PARAM_SPEC.views(params)["version"][0] = expected + 1
        channel.broadcast_params(params)
    channel.request_stop()
    reports, late = channel.collect_final_reports(TIMEOUT_S)
    return {
        "credits": credits,
        "out_of_order": out_of_order,
        "received": received,
        "late": len(late),
        "reports": reports,
    }


def env_rank(comm: MPI.Comm, rank: int, credits: int) -> None:
    channel = MPIActorChannel(comm, learner_rank=0, param_nbytes=PARAM_SPEC.nbytes)
    queue = SegmentQueue(SEGMENT_SPEC, capacity=credits + 1)
    produced = version = 0
    expected_transitions = 0
    while not channel.stop_requested():
        message = channel.poll_params()
        if message is not None:
            version = int(PARAM_SPEC.views(message)["version"][0])
        if produced < SEGMENTS and queue.has_free:
            buffer = queue.acquire()
            fields = SEGMENT_SPEC.views(buffer)
            fields["sequence"][0] = produced
            fields["valid"][...] = 0
            fields["valid"].flat[: valid_rows(rank, produced)] = 1
            expected_transitions += valid_rows(rank, produced)
            queue.push(buffer)
            produced += 1
        channel.pump(queue)
        if produced == SEGMENTS or not queue.has_free:
            channel.idle()  # nothing to write until a credit frees a buffer, or ever again
    channel.flush(queue, TIMEOUT_S)

    def newest_version() -> bool:
        nonlocal version
        message = channel.poll_params()
        if message is not None:
            version = int(PARAM_SPEC.views(message)["version"][0])
        return version == SEGMENTS

    # The stop travels under its own tag, so it may overtake the last parameter message.
    world.wait_until(newest_version, TIMEOUT_S, lambda: "the last parameter message")
    channel.send_final_report(
        {
            "produced": produced,
            "expected_transitions": expected_transitions,
            "sent_transitions": queue.sent_transitions,
            "last_version": version,
        }
    )


def stream() -> dict[str, Any] | None:
    comm_world = MPI.COMM_WORLD
    env_ranks = list(range(1, comm_world.Get_size()))
    results = []
    for credits in CREDITS:
        # A communicator per case: nothing left over from an earlier case can match this one.
        comm = comm_world.Dup()
        if comm.Get_rank() == 0:
            results.append(learner(comm, env_ranks, credits))
        else:
            env_rank(comm, comm.Get_rank(), credits)
        comm.Free()
    return {"cases": results} if comm_world.Get_rank() == 0 else None


class FakeClock:
    """Stands in for the `time` module of `world`: each reading of the spin's clock moves it on
    by a microsecond (a poll's worth), each sleep by its length, and sleeps are recorded."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def backoff() -> dict[str, Any]:
    clock = FakeClock()
    world.time = clock
    result: dict[str, Any] = {}

    pauses = world.Backoff(spin_s=50e-6, first_s=20e-6, max_s=250e-6)
    for _ in range(5):
        pauses.pause()
        clock.now += 5e-6  # polls, still inside the spin
    result["slept_while_spinning"] = list(clock.slept)
    clock.now += 50e-6
    for _ in range(6):
        pauses.pause()
    result["slept_after_spin"] = list(clock.slept)
    clock.slept.clear()
    pauses.reset()
    pauses.pause()
    result["slept_after_reset"] = list(clock.slept)

    # A wait whose message comes within the spin never sleeps.
    clock.slept.clear()
    polls = iter([False, False, False, True])
    world.wait_until(lambda: next(polls), 1.0, lambda: "nothing")
    result["wait_within_spin_slept"] = list(clock.slept)

    # One that never ends sleeps ever longer, at most a share of the time waited so far, and
    # names what it waited for.
    for timeout_s in (0.02, 1.0, 60.0):
        clock.slept.clear()
        started = clock.now
        try:
            world.wait_until(lambda: False, timeout_s, lambda: "the test's message")
        except TransportError as error:
            result["timeout_error"] = str(error)
        waited, ratios = 0.0, []
        for sleep in clock.slept:
            ratios.append(sleep / max(waited, 1e-9))  # against the time waited before it
            waited += sleep
        result[f"longest_sleep_{timeout_s:g}"] = max(clock.slept)
        # Past the fixed cap, the largest share of the time waited that one sleep took.
        result[f"late_share_{timeout_s:g}"] = max(
            (r for r, s in zip(ratios, clock.slept, strict=True) if s > 250e-6), default=0.0
        )
        result[f"waited_{timeout_s:g}"] = clock.now - started
    return result


def main() -> None:
    result = stream() if sys.argv[1:] == ["stream"] else backoff()
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
