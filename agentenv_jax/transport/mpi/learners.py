"""The learners' own communicator: the JAX coordinator's address, and the small collectives
that keep global quantities global when several learner processes share one mesh.

The learners split a communicator off `COMM_WORLD`, so env ranks never take part in these
collectives (nor in JAX's runtime). Each round the learners exchange their env ranks' segment
summaries (normalizer statistics, episode returns, policy versions; a few bytes per transition)
with one `Allgatherv` of raw bytes; start, stop and the end of the run exchange pickled values.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from agentenv_jax.transport.base import TransportError
from agentenv_jax.transport.mpi.world import MPIWorld, wait_until

# Overrides the coordinator's host name (learner 0's `socket.gethostname()`), for clusters where
# that name does not reach the host over the network the learners share.
COORDINATOR_HOST_VARIABLE = "AGENTENV_COORDINATOR_HOST"


def _reach(host: str, port: int, timeout_s: float) -> str | None:
    """None once a TCP connection to `host:port` succeeds, else the last error at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return None
        except OSError as err:
            if time.monotonic() >= deadline:
                return f"{type(err).__name__}: {err}"
        time.sleep(0.1)


class MPILearnerGroup:
    """Learner `index` of `size`, over a communicator of the learners alone."""

    def __init__(self, comm: MPI.Comm):
        self._comm = comm
        self.index = comm.Get_rank()
        self.size = comm.Get_size()
        self._counts: list[int] | None = None  # each learner's `exchange` bytes, agreed once

    def coordinator_address(self, timeout_s: float) -> str:
        """`host:port` of the JAX coordinator, checked: learner 0 listens on a free port while
        every other learner connects to it, so a port that cannot be bound or a host that
        cannot be reached is one `TransportError` on every learner within `timeout_s`.

        NOTE: JAX's runtime does not raise on these; its client ends the process (a fatal
        DEADLINE_EXCEEDED) after its own timeout, naming neither host nor port. The coordinator
        then binds the same port a moment after this check releases it.
        """
        listener = None
        error = None
        if self.index == 0:
            host = os.environ.get(COORDINATOR_HOST_VARIABLE) or socket.gethostname()
            try:
                listener = socket.create_server(("", 0))
                address = f"{host}:{listener.getsockname()[1]}"
            except OSError as err:
                address, error = f"{host}:?", f"{type(err).__name__}: {err}"
        else:
            address = None
        address = self._comm.bcast(address, root=0)
        host, port = address.rsplit(":", 1)
        if self.index != 0 and error is None:
            error = _reach(host, int(port), timeout_s)
        errors = self.allgather(error)
        if listener is not None:
            listener.close()
        failed = [(i, e) for i, e in enumerate(errors) if e is not None]
        if failed:
            learner, reason = failed[0]
            raise TransportError(
                f"JAX's distributed runtime cannot start: learner {learner} could not reach "
                f"the coordinator at {address} (learner 0's host; "
                f"{COORDINATOR_HOST_VARIABLE} overrides it) within {timeout_s:.0f} s "
                f"(run.transport_timeout_s): {reason}"
            )
        return address

    def allgather(self, value: Any) -> list[Any]:
        """Every learner's `value`, in learner order (pickled; start-up and the end only)."""
        barrier = self._comm.Ibarrier()
        wait_until(barrier.Test, 3600.0, lambda: "every learner to reach the same point")
        return self._comm.allgather(value)

    def any(self, flag: bool) -> bool:
        """Whether any learner's `flag` is set (so all of them take the same branch)."""
        mine = np.array([int(flag)], dtype=np.int64)
        result = np.zeros(1, dtype=np.int64)
        self._wait(self._comm.Iallreduce(mine, result, op=MPI.MAX), "agree on stopping")
        return bool(result[0])

    def exchange(self, local: np.ndarray) -> list[np.ndarray]:
        """Every learner's byte buffer, in learner order: one `Iallgatherv` (each learner's
        size is fixed for the run and agreed once)."""
        if self._counts is None:
            self._counts = self._comm.allgather(int(local.nbytes))
        received = np.empty(sum(self._counts), dtype=np.uint8)
        request = self._comm.Iallgatherv(local.view(np.uint8), (received, self._counts))
        self._wait(request, "exchange this round's summaries")
        bounds = np.cumsum([0, *self._counts])
        return [received[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _wait(self, request: MPI.Request, what: str) -> None:
        # NOTE: a blocking collective spins in MPICH; polled with back-off (as every wait of
        # the transport), a learner that is early yields its core to the others' work.
        wait_until(request.Test, 3600.0, lambda: f"every learner to {what}")


def split_learner_group(world: MPIWorld, num_learners: int) -> MPILearnerGroup | None:
    """The learners' group (ranks `0..num_learners-1`); every rank of the world must call it
    (a collective split), env ranks get None."""
    is_learner = world.rank < num_learners
    comm = world.comm.Split(0 if is_learner else MPI.UNDEFINED, world.rank)
    return MPILearnerGroup(comm) if is_learner else None
