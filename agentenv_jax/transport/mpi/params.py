"""Versioned parameter messages from a learner to its env ranks, two ways
(`topology.param_sync`):

- `broadcast` (what `auto` picks for a learner whose env ranks run on other hosts): one
  non-blocking broadcast (`Ibcast`) over a communicator of the
  learner (its root) and its env ranks, so the learner sends each message about once, however
  many env ranks there are (MPI's tree or scatter-allgather forwards it among them);
- `point_to_point` (`auto`'s pick on one host, where a send is a shared-memory copy its
  receiver makes): one `Isend` per env rank, the learner's outgoing bytes growing with them.

Either way the learner's side is double-buffered (a message may be in flight while the next is
written, and the learner waits only when both are) and an env rank takes the newest message
that has arrived. Messages above `CHUNK_BYTES` travel in chunks, within MPI's int counts.

A broadcast cannot be cancelled, so an env rank posts its receive only when it polls, and the
learner ends the sequence with a closing message that completes the receive every env rank
has posted (a flag in the message's header says which it is).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from agentenv_jax.transport.messages import TAG_PARAMS
from agentenv_jax.transport.mpi.world import wait_until

# The largest piece one MPI call moves: 1 GiB, well inside an int count of bytes (2 GiB - 1).
CHUNK_BYTES = 1 << 30
# A broadcast message's header: 8 bytes, the kind of message (parameters or the closing one).
HEADER_BYTES = 8
_PARAMS, _CLOSING = 0, 1


def chunk_bounds(nbytes: int, limit: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """`[start, stop)` byte ranges of at most `limit` bytes, in order, covering `nbytes` (one
    empty range for an empty message, so that even it is one MPI call)."""
    if limit < 1:
        raise ValueError(f"limit = {limit}: expected at least 1 byte")
    if nbytes == 0:
        return [(0, 0)]
    return [(start, min(start + limit, nbytes)) for start in range(0, nbytes, limit)]


def _chunks(buffer: np.ndarray) -> list[np.ndarray]:
    return [buffer[a:b] for a, b in chunk_bounds(buffer.nbytes)]


class ParamBroadcast:
    """The learner's point-to-point sender: an `Isend` per env rank (and chunk)."""

    def __init__(self, comm: MPI.Comm, env_ranks: list[int], nbytes: int):
        self._comm = comm
        self._env_ranks = env_ranks
        self._buffers = [np.empty(nbytes, dtype=np.uint8) for _ in range(2)]
        self._requests: list[list[MPI.Request]] = [[], []]
        self._turn = 0
        self.sent = 0  # messages sent to each env rank; the stop request carries it

    def _take_turn(self) -> np.ndarray:
        pending = self._requests[self._turn]
        wait_until(
            lambda: MPI.Request.Testall(pending),
            600.0,
            lambda: "env ranks to take an earlier parameter message",
        )
        return self._buffers[self._turn]

    def send(self, message: np.ndarray) -> None:
        buffer = self._take_turn()
        buffer[...] = message
        self._requests[self._turn] = [
            self._comm.Isend(chunk, dest=rank, tag=TAG_PARAMS)
            for rank in self._env_ranks
            for chunk in _chunks(buffer)
        ]
        self._turn = 1 - self._turn
        self.sent += 1

    def close(self) -> None:
        """Nothing to close: an env rank cancels its posted receive."""

    def pending(self) -> list[MPI.Request]:
        return [r for requests in self._requests for r in requests]


class TreeParamBroadcast(ParamBroadcast):
    """The learner's broadcast sender: an `Ibcast` (per chunk) from rank 0 of `group`, the
    communicator of this learner and its env ranks."""

    def __init__(self, group: MPI.Comm, nbytes: int):
        super().__init__(group, [], HEADER_BYTES + nbytes)

    def _broadcast(self, kind: int, message: np.ndarray | None) -> None:
        buffer = self._take_turn()
        buffer[:HEADER_BYTES].view(np.int64)[0] = kind
        if message is not None:
            buffer[HEADER_BYTES:] = message
        self._requests[self._turn] = [self._comm.Ibcast(c, root=0) for c in _chunks(buffer)]
        self._turn = 1 - self._turn
        self.sent += 1

    def send(self, message: np.ndarray) -> None:
        self._broadcast(_PARAMS, message)

    def close(self) -> None:
        """The closing message, counted in `sent`: it completes every env rank's posted
        receive, after which none posts another."""
        self._broadcast(_CLOSING, None)


class ParamInbox:
    """An env rank's point-to-point receiver: one posted `Irecv` per chunk, re-posted as
    messages arrive; `poll` returns the newest complete message, or None."""

    def __init__(self, comm: MPI.Comm, learner_rank: int, nbytes: int):
        self._comm, self._learner = comm, learner_rank
        self._inbox = np.empty(nbytes, dtype=np.uint8)
        self._latest = np.empty(nbytes, dtype=np.uint8)
        self._requests = self._post()
        self.received = 0

    def _post(self) -> list[MPI.Request]:
        return [
            self._comm.Irecv(chunk, source=self._learner, tag=TAG_PARAMS)
            for chunk in _chunks(self._inbox)
        ]

    def poll(self) -> np.ndarray | None:
        fresh = False
        # Drain everything that arrived: only the newest version matters.
        while MPI.Request.Testall(self._requests):
            self.received += 1
            self._latest[...] = self._inbox
            self._requests = self._post()
            fresh = True
        return self._latest if fresh else None

    def done(self, sent: int) -> bool:
        """Whether every one of the `sent` messages the learner sent has arrived."""
        self.poll()
        return self.received >= sent

    def close(self) -> None:
        """Withdraw the posted receive (the learner sends no more)."""
        for request in self._requests:
            request.Cancel()
            request.Wait()
        self._requests = []


class TreeParamInbox:
    """An env rank's broadcast receiver over `group` (the learner is its rank 0): a receive
    posted when it polls, taken until the closing message."""

    def __init__(self, group: MPI.Comm, nbytes: int):
        self._group = group
        self._inbox = np.empty(HEADER_BYTES + nbytes, dtype=np.uint8)
        self._latest = np.empty(nbytes, dtype=np.uint8)
        self._requests: list[MPI.Request] | None = None
        self.received = 0
        self.closed = False

    def poll(self) -> np.ndarray | None:
        fresh = False
        while not self.closed:
            if self._requests is None:
                self._requests = [self._group.Ibcast(c, root=0) for c in _chunks(self._inbox)]
            if not MPI.Request.Testall(self._requests):
                break
            self._requests = None
            self.received += 1
            if self._inbox[:HEADER_BYTES].view(np.int64)[0] == _CLOSING:
                self.closed = True
            else:
                self._latest[...] = self._inbox[HEADER_BYTES:]
                fresh = True
        return self._latest if fresh else None

    def done(self, sent: int) -> bool:
        """Whether the closing message (the last of `sent`) has arrived."""
        self.poll()
        return self.closed

    def close(self) -> None:
        """Nothing to withdraw: a receive is posted only while a message is expected, and a
        run that stops ends with the closing message."""
