"""Parameter sync through the real MPI channels; run by tests/test_param_sync.py under
`mpiexec -n N` (rank 0 the learner, ranks 1.. its env ranks). Prints one `RESULT {json}` line
on rank 0.

For each case (`topology.param_sync` scheme, chunk size), the learner sends `VERSIONS`
versioned messages of random bytes, each after a round, as the learner loop does; an env rank
starts segment k only once it holds version k and sends in it the version and the SHA-256 of
the message it holds, so the learner checks that every env rank received exactly its bytes.
Before the last round the learner sends three versions back to back: env ranks must take the
newest. Then the stop and the final reports, whose counts the result carries.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from mpi4py import MPI

from agentenv_jax.buffers.segment_queue import SegmentQueue
from agentenv_jax.transport.mpi import MPIActorChannel, MPILearnerChannel, params, world
from agentenv_jax.transport.spec import FieldSpec, MessageSpec

VERSIONS = 12
PAYLOAD = 10_000  # bytes; with a chunk size of 1000 a message is 11 MPI calls
TIMEOUT_S = 60.0
SEGMENT_SPEC = MessageSpec(
    [
        FieldSpec("version", (1,), np.int64),
        FieldSpec("digest", (32,), np.uint8),
        FieldSpec("valid", (1, 1), np.uint8),
    ]
)
PARAM_SPEC = MessageSpec(
    [FieldSpec("version", (1,), np.int64), FieldSpec("payload", (PAYLOAD,), np.uint8)]
)
CASES = [("broadcast", params.CHUNK_BYTES), ("broadcast", 1000), ("point_to_point", 1000)]


def message_of(version: int) -> np.ndarray:
    message = PARAM_SPEC.allocate()
    fields = PARAM_SPEC.views(message)
    fields["version"][0] = version
    fields["payload"][:] = np.random.default_rng(version).integers(0, 256, PAYLOAD, np.uint8)
    return message


def digest(message: np.ndarray) -> list[int]:
    return list(hashlib.sha256(message.tobytes()).digest())


def learner(comm: MPI.Comm, group: MPI.Comm | None, env_ranks: list[int]) -> dict[str, Any]:
    channel = MPILearnerChannel(
        comm, env_ranks, [SEGMENT_SPEC.nbytes] * len(env_ranks), 1, PARAM_SPEC.nbytes, group
    )
    sent = {0: digest(message_of(0))}
    channel.broadcast_params(message_of(0))
    mismatches, versions_seen = [], []
    version = 0
    for k in range(VERSIONS):
        buffers = channel.receive_round(TIMEOUT_S)
        for rank, buffer in zip(env_ranks, buffers, strict=True):
            fields = SEGMENT_SPEC.views(buffer)
            held = int(fields["version"][0])
            versions_seen.append(held)
            if fields["digest"].tolist() != sent.get(held):
                mismatches.append((rank, held))
        channel.release_round()
        if k == VERSIONS - 1:
            break
        # Before the last round three versions at once: env ranks must take the newest.
        for _ in range(3 if k == VERSIONS - 2 else 1):
            version += 1
            sent[version] = digest(message_of(version))
            channel.broadcast_params(message_of(version))
    channel.request_stop()
    reports, late = channel.collect_final_reports(TIMEOUT_S)
    return {
        "mismatches": mismatches,
        "last_versions": versions_seen[-len(env_ranks) :],
        "newest_version": version,
        "messages_sent": channel._params.sent,
        "params_received": [r["params_received"] for r in reports],
        "late": len(late),
    }


def required_version(sequence: int) -> int:
    """The version segment `sequence` waits for: its own (lag 0), and for the last one the
    newest of the three sent at once."""
    return sequence if sequence < VERSIONS - 1 else VERSIONS + 1


def env_rank(comm: MPI.Comm, group: MPI.Comm | None) -> None:
    channel = MPIActorChannel(
        comm, learner_rank=0, param_nbytes=PARAM_SPEC.nbytes, param_group=group
    )
    queue = SegmentQueue(SEGMENT_SPEC, capacity=2)
    held, sequence = None, 0
    while not channel.stop_requested():
        message = channel.poll_params()
        if message is not None:
            held = message.copy()
        version = -1 if held is None else int(PARAM_SPEC.views(held)["version"][0])
        if sequence < VERSIONS and version >= required_version(sequence) and queue.has_free:
            buffer = queue.acquire()
            fields = SEGMENT_SPEC.views(buffer)
            fields["version"][0] = version
            fields["digest"][:] = digest(held)
            fields["valid"][...] = 1
            queue.push(buffer)
            sequence += 1
        channel.pump(queue)
        channel.idle()
    channel.flush(queue, TIMEOUT_S)
    # Every message the learner sent (a broadcast's closing one included), then the count.
    sent = channel.stop_details()["params_sent"]
    world.wait_until(lambda: channel._params.done(sent), TIMEOUT_S, lambda: "the last message")
    channel.send_final_report({"params_received": channel._params.received})


def main() -> None:
    comm_world = MPI.COMM_WORLD
    results = []
    for scheme, chunk_bytes in CASES:
        params.CHUNK_BYTES = chunk_bytes
        comm = comm_world.Dup()  # a communicator per case: nothing left over can match
        group = comm.Split(color=0, key=comm.Get_rank()) if scheme == "broadcast" else None
        env_ranks = list(range(1, comm.Get_size()))
        if comm.Get_rank() == 0:
            result = learner(comm, group, env_ranks)
            results.append({"scheme": scheme, "chunk_bytes": chunk_bytes, **result})
        else:
            env_rank(comm, group)
        if group is not None:
            group.Free()
        comm.Free()
    world.wait_until(comm_world.Ibarrier().Test, TIMEOUT_S, lambda: "every rank to finish")
    if comm_world.Get_rank() == 0:
        print("RESULT " + json.dumps({"cases": results}), flush=True)


if __name__ == "__main__":
    main()
