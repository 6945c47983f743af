"""The MPI channels of central inference (`topology.inference: learner`): an env rank sends
its observations and waits for the actions; its learner takes requests from all its env ranks
and answers each after one batched call (`learner.inference_server`).

Each env rank has at most one request in flight: it posts the receive of the reply before it
sends the request, so the reply never arrives unexpected, and the learner keeps one receive
posted per env rank, re-posted as it takes each request.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.transport.base import CollectionStopped, TransportError
from agentenv_jax.transport.messages import TAG_INFERENCE_REPLY, TAG_INFERENCE_REQUEST
from agentenv_jax.transport.mpi.world import FAILED_RANKS, Backoff, cancel_receives, finish_sends

_THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
    MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
    MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
    MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE",
}


def require_thread_multiple() -> None:
    """The learner's serving thread calls MPI beside its main thread: the MPI library must
    provide MPI_THREAD_MULTIPLE (mpi4py asks for it; MPICH and Open MPI give it)."""
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        raise ConfigError(
            "topology.inference_serving = 'thread' needs MPI_THREAD_MULTIPLE; this MPI "
            f"library provides {_THREAD_LEVELS.get(provided, provided)}: set "
            "topology.inference_serving=between_rounds"
        )


class MPIInferenceClient:
    """An env rank's end: `call(request) -> reply` (buffers of the agreed layouts)."""

    def __init__(
        self,
        comm: MPI.Comm,
        learner_rank: int,
        reply_nbytes: int,
        timeout_s: float,
        stop_requested: Callable[[], bool],
    ):
        self._comm = comm
        self._learner = learner_rank
        self._reply = np.empty(reply_nbytes, dtype=np.uint8)
        self._timeout_s = timeout_s
        self._stop_requested = stop_requested
        self._backoff = Backoff()

    def call(self, request: np.ndarray) -> np.ndarray:
        """Send `request` and wait for the answer (valid until the next call). Raises
        `CollectionStopped` when the learner asks to stop first, `TransportError` after the
        timeout."""
        import time

        receive = self._comm.Irecv(self._reply, source=self._learner, tag=TAG_INFERENCE_REPLY)
        send = self._comm.Isend(request, dest=self._learner, tag=TAG_INFERENCE_REQUEST)
        deadline = time.monotonic() + self._timeout_s
        self._backoff.reset()
        while not receive.Test():
            FAILED_RANKS.check()
            if self._stop_requested():
                cancel_receives([receive])
                if not send.Test():
                    send.Cancel()
                    send.Wait()
                raise CollectionStopped
            if time.monotonic() > deadline:
                raise TransportError(
                    f"env rank waited {self._timeout_s:.0f} s for its learner (rank "
                    f"{self._learner}) to answer an inference request (twice "
                    "run.transport_timeout_s): the learner is silent" + FAILED_RANKS.describe()
                )
            self._backoff.pause()
        send.Wait()
        return self._reply


class MPIInferenceEndpoint:
    """The learner's end: one posted receive per env rank; `poll()` gives the indices whose
    request arrived, `request(i)` its buffer, `reply(i, message)` answers it."""

    def __init__(
        self,
        comm: MPI.Comm,
        env_ranks: list[int],
        request_nbytes: list[int],
        reply_nbytes: list[int],
    ):
        self._comm = comm
        self._env_ranks = list(env_ranks)
        self._requests = [np.empty(n, dtype=np.uint8) for n in request_nbytes]
        self._replies = [np.empty(n, dtype=np.uint8) for n in reply_nbytes]
        self._receives: list[MPI.Request | None] = [
            comm.Irecv(buffer, source=rank, tag=TAG_INFERENCE_REQUEST)
            for buffer, rank in zip(self._requests, self._env_ranks, strict=True)
        ]
        self._sends: list[MPI.Request] = []
        self._taken = [False] * len(env_ranks)

    def poll(self) -> list[int]:
        """Env-rank indices with a request that arrived since it was last answered."""
        arrived = []
        for i, receive in enumerate(self._receives):
            if not self._taken[i] and receive is not None and receive.Test():
                self._taken[i] = True
                arrived.append(i)
        return arrived

    def request(self, index: int) -> np.ndarray:
        return self._requests[index]

    def reply_buffer(self, index: int) -> np.ndarray:
        return self._replies[index]

    def reply(self, index: int) -> None:
        """Send `reply_buffer(index)` and take the env rank's next request."""
        rank = self._env_ranks[index]
        self._receives[index] = self._comm.Irecv(
            self._requests[index], source=rank, tag=TAG_INFERENCE_REQUEST
        )
        self._taken[index] = False
        self._sends = [s for s in self._sends if not s.Test()]
        # NOTE: the env rank sends its next request only after this reply arrived, so the
        # buffer is free again by the time `reply(index)` is next called.
        self._sends.append(
            self._comm.Isend(self._replies[index], dest=rank, tag=TAG_INFERENCE_REPLY)
        )

    def close(self) -> None:
        """At shutdown: withdraw the posted receives, let the last replies go."""
        cancel_receives(
            [r for r, taken in zip(self._receives, self._taken, strict=True) if not taken]
        )
        finish_sends(self._sends)
