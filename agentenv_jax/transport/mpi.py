"""The MPI transport: the only module of agentenv_jax that imports mpi4py.

Hot-path messages (segments, parameters, credits) are fixed-layout numpy buffers moved with the
upper-case buffer API (`Isend`/`Irecv`); only start-up, stop and final reports are pickled.

NOTE: MPICH's blocking waits spin on a core. With several ranks per core that steals time from
env stepping, so every wait here polls `Test` and sleeps with a short exponential back-off
(20 us .. 250 us; a kernel sleep lasts at least ~60 us here) instead: idle ranks block rather
than spin, and a round trip gains at most a quarter millisecond.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from agentenv_jax.buffers.segment_queue import SegmentQueue
from agentenv_jax.transport.base import TransportError
from agentenv_jax.transport.messages import (
    TAG_CONTROL,
    TAG_CREDIT,
    TAG_FINAL,
    TAG_PARAMS,
    TAG_PRIORITIES,
    TAG_SAMPLE_ANSWER,
    TAG_SAMPLE_REQUEST,
    TAG_SEGMENT,
)


class _Backoff:
    def __init__(self, first_s: float = 20e-6, max_s: float = 250e-6):
        self._first, self._max, self._next = first_s, max_s, first_s

    def sleep(self) -> None:
        time.sleep(self._next)
        self._next = min(self._next * 2, self._max)

    def reset(self) -> None:
        self._next = self._first


def _process_gone(pid: int) -> bool:
    """Whether process `pid` of this host has exited (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class _FailedRankWatch:
    """Names a rank of the job that has died, for the ranks that wait on it.

    MPICH's mpiexec by default kills the whole job the moment one process dies and names only
    its PID. Run with `-disable-auto-cleanup`, it keeps the survivors alive and sends them
    SIGUSR1 instead (whose default action would kill them too). On that notice every wait checks
    which ranks of this host have gone and names them at once; a rank that died on another host
    is named by the rank waiting on it when run.transport_timeout_s runs out.
    """

    def __init__(self) -> None:
        self.notice_received = False
        self._local: dict[int, int] = {}  # rank -> pid, for the ranks on this host

    def install(self, processes: dict[int, dict[str, Any]]) -> None:
        host = socket.gethostname()
        self._local = {r: int(p["pid"]) for r, p in processes.items() if p["host"] == host}
        signal.signal(signal.SIGUSR1, self._on_notice)

    def _on_notice(self, signum: int, frame: Any) -> None:
        self.notice_received = True

    def check(self) -> None:
        """Raise `TransportError` naming the ranks of this host that have died, once the
        launcher has said that a process of the job failed."""
        if not self.notice_received:
            return
        dead = [rank for rank, pid in sorted(self._local.items()) if _process_gone(pid)]
        if dead:
            raise TransportError(
                ", ".join(f"rank {rank} (pid {self._local[rank]})" for rank in dead)
                + " died; stopping the job"
            )

    def describe(self) -> str:
        """A note for timeout messages."""
        if self.notice_received:
            return "; the launcher reported that a process of the job failed"
        return ""


_FAILED_RANKS = _FailedRankWatch()


def _wait_until(done: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    backoff = _Backoff()
    while not done():
        _FAILED_RANKS.check()
        if time.monotonic() > deadline:
            raise TransportError(
                f"timed out after {timeout_s:.0f} s waiting for {what()}" + _FAILED_RANKS.describe()
            )
        backoff.sleep()


class MPIWorld:
    """COMM_WORLD as the launcher made it: size, rank, and the pickled start-up collectives."""

    def __init__(self) -> None:
        self.comm = MPI.COMM_WORLD
        self.size = self.comm.Get_size()
        self.rank = self.comm.Get_rank()

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's `value` (a start-up or error-agreement collective; pickled).

        Ranks reach it at very different times (the learner compiles for seconds); a
        non-blocking barrier polled with back-off keeps the early ones from spinning a core.
        """
        barrier = self.comm.Ibarrier()
        _wait_until(barrier.Test, 3600.0, lambda: "every rank to finish starting up")
        return self.comm.allgather(value)

    def watch_for_failed_ranks(self, processes: dict[int, dict[str, Any]]) -> None:
        """From now on, waits name a rank whose process died (see `_FailedRankWatch`);
        `processes` maps every rank to its `pid` and `host`."""
        _FAILED_RANKS.install(processes)

    def abort(self, exit_code: int) -> None:
        """Kill every rank of the job now (used after an unexpected error on one rank)."""
        self.comm.Abort(exit_code)


def _finish_sends(requests: list[MPI.Request]) -> None:
    """Give the last control and parameter sends a moment to complete at shutdown."""
    try:
        _wait_until(
            lambda: MPI.Request.Testall(requests),
            5.0,
            lambda: "the last control and parameter sends",
        )
    except TransportError:
        pass  # an env rank that stopped never takes a stale message; nothing is lost


class _ParamBroadcast:
    """Versioned parameter messages to every env rank, double-buffered so one can be in flight
    while the next is written."""

    def __init__(self, comm: MPI.Comm, env_ranks: list[int], nbytes: int):
        self._comm = comm
        self._env_ranks = env_ranks
        self._buffers = [np.empty(nbytes, dtype=np.uint8) for _ in range(2)]
        self._requests: list[list[MPI.Request]] = [[], []]
        self._turn = 0
        self.sent = 0  # messages sent to each env rank; the stop request carries it

    def send(self, message: np.ndarray) -> None:
        turn = self._turn
        pending = self._requests[turn]
        _wait_until(
            lambda: MPI.Request.Testall(pending),
            600.0,
            lambda: "env ranks to take an earlier parameter message",
        )
        self._buffers[turn][...] = message
        self._requests[turn] = [
            self._comm.Isend(self._buffers[turn], dest=rank, tag=TAG_PARAMS)
            for rank in self._env_ranks
        ]
        self._turn = 1 - turn
        self.sent += 1

    def pending(self) -> list[MPI.Request]:
        return [r for requests in self._requests for r in requests]


class MPIActorChannel:
    """An env rank's end of the MPI transport (see `ActorChannel`)."""

    def __init__(self, comm: MPI.Comm, learner_rank: int, param_nbytes: int):
        self._comm = comm
        self._learner = learner_rank
        self._param_inbox = np.empty(param_nbytes, dtype=np.uint8)
        self._latest_params = np.empty(param_nbytes, dtype=np.uint8)
        self._param_req = comm.Irecv(self._param_inbox, source=learner_rank, tag=TAG_PARAMS)
        self._credit_inbox = np.zeros(1, dtype=np.int64)
        self._credit_req = comm.Irecv(self._credit_inbox, source=learner_rank, tag=TAG_CREDIT)
        self._control_req = comm.irecv(source=learner_rank, tag=TAG_CONTROL)
        self._credits = 0
        self._params_received = 0
        self._stop_message: dict[str, Any] | None = None
        self._backoff = _Backoff()
        self._inflight: list[tuple[MPI.Request, np.ndarray]] = []
        self._stopped = False

    def _poll_credits(self) -> None:
        while self._credit_req.Test():
            self._credits += int(self._credit_inbox[0])
            self._backoff.reset()
            self._credit_req = self._comm.Irecv(
                self._credit_inbox, source=self._learner, tag=TAG_CREDIT
            )

    def _poll_stop(self) -> bool:
        if not self._stopped:
            arrived, message = self._control_req.test()
            if arrived:
                self._stopped, self._stop_message = True, message
        return self._stopped

    def poll_params(self) -> np.ndarray | None:
        fresh = False
        # Drain everything that arrived: only the newest version matters.
        while self._param_req.Test():
            self._params_received += 1
            self._latest_params[...] = self._param_inbox
            self._param_req = self._comm.Irecv(
                self._param_inbox, source=self._learner, tag=TAG_PARAMS
            )
            fresh = True
        if fresh:
            self._backoff.reset()
            return self._latest_params
        return None

    def stop_requested(self) -> bool:
        return self._poll_stop()

    def stop_details(self) -> dict[str, Any]:
        """What the learner's stop request carried besides the stop itself."""
        return dict(self._stop_message or {})

    def idle(self) -> None:
        _FAILED_RANKS.check()
        self._backoff.sleep()

    def pump(self, queue: SegmentQueue) -> None:
        self._poll_credits()
        still_inflight = []
        for request, buffer in self._inflight:
            if request.Test():
                queue.release(buffer)
            else:
                still_inflight.append((request, buffer))
        self._inflight = still_inflight
        while self._credits > 0 and queue.depth:
            buffer = queue.pop_ready()
            request = self._comm.Isend(buffer, dest=self._learner, tag=TAG_SEGMENT)
            self._inflight.append((request, buffer))
            self._credits -= 1

    def flush(self, queue: SegmentQueue, timeout_s: float) -> None:
        def sent() -> bool:
            self.pump(queue)
            return not self._inflight

        _wait_until(sent, timeout_s, lambda: f"{len(self._inflight)} segment sends to complete")

    def send_final_report(self, report: dict[str, Any]) -> None:
        # Take every parameter message the learner sent before it asked us to stop, so none of
        # its sends is left unmatched when we cancel our receive.
        sent = (self._stop_message or {}).get("params_sent", 0)

        def all_received() -> bool:
            self.poll_params()
            return self._params_received >= sent

        _wait_until(all_received, 30.0, lambda: "the learner's last parameter message")
        self._comm.send(dict(report), dest=self._learner, tag=TAG_FINAL)
        for request in (self._param_req, self._credit_req):
            request.Cancel()
            request.Wait()
        if not self._stopped:
            self._control_req.cancel()


class MPILearnerChannel:
    """The learner's end of the MPI transport (see `LearnerChannel`).

    For each env rank it keeps `max_inflight` posted receives, one per credit granted, and
    consumes them round-robin (MPI matches messages from one source and tag in posting order).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        env_ranks: list[int],
        segment_nbytes: list[int],
        max_inflight: int,
        param_nbytes: int,
    ):
        self._comm = comm
        self._env_ranks = list(env_ranks)
        self.num_env_ranks = len(env_ranks)
        self._slots = [
            [np.empty(nbytes, dtype=np.uint8) for _ in range(max_inflight)]
            for nbytes in segment_nbytes
        ]
        self._slot_reqs: list[list[MPI.Request | None]] = [
            [self._comm.Irecv(buf, source=rank, tag=TAG_SEGMENT) for buf in slots]
            for rank, slots in zip(self._env_ranks, self._slots, strict=True)
        ]
        self._next_slot = [0] * self.num_env_ranks
        self._small_sends: list[tuple[MPI.Request, Any]] = []
        for rank in self._env_ranks:
            self._send_credits(rank, max_inflight)
        self._params = _ParamBroadcast(comm, self._env_ranks, param_nbytes)
        self._round_taken = False

    def _send_credits(self, rank: int, count: int) -> None:
        buffer = np.array([count], dtype=np.int64)
        self._small_sends.append((self._comm.Isend(buffer, dest=rank, tag=TAG_CREDIT), buffer))
        self._small_sends = [(r, b) for r, b in self._small_sends if not r.Test()]

    def broadcast_params(self, message: np.ndarray) -> None:
        self._params.send(message)

    def receive_round(self, timeout_s: float) -> list[np.ndarray]:
        waiting = set(range(self.num_env_ranks))

        def arrived() -> bool:
            for i in list(waiting):
                if self._slot_reqs[i][self._next_slot[i]].Test():
                    waiting.discard(i)
            return not waiting

        _wait_until(
            arrived,
            timeout_s,
            lambda: (
                "a segment from env rank(s) "
                + ", ".join(str(self._env_ranks[i]) for i in sorted(waiting))
                + " (run.transport_timeout_s)"
            ),
        )
        self._round_taken = True
        return [self._slots[i][self._next_slot[i]] for i in range(self.num_env_ranks)]

    def release_round(self) -> None:
        if not self._round_taken:
            return
        for i, rank in enumerate(self._env_ranks):
            slot = self._next_slot[i]
            self._slot_reqs[i][slot] = self._comm.Irecv(
                self._slots[i][slot], source=rank, tag=TAG_SEGMENT
            )
            self._next_slot[i] = (slot + 1) % len(self._slots[i])
            self._send_credits(rank, 1)
        self._round_taken = False

    def request_stop(self) -> None:
        stop = {"stop": True, "params_sent": self._params.sent}
        for rank in self._env_ranks:
            self._small_sends.append((self._comm.isend(stop, dest=rank, tag=TAG_CONTROL), None))

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        reports = []
        for rank in self._env_ranks:
            _wait_until(
                lambda r=rank: self._comm.Iprobe(source=r, tag=TAG_FINAL),
                timeout_s,
                lambda r=rank: f"the final report of env rank {r}",
            )
            reports.append(self._comm.recv(source=rank, tag=TAG_FINAL))
        # Env ranks wait for their sends before reporting, so any segment still unmatched here
        # was never sent; the ones that did arrive after the last round are counted, not lost.
        late_segments = []
        for i, requests in enumerate(self._slot_reqs):
            for slot, request in enumerate(requests):
                if self._round_taken and slot == self._next_slot[i]:
                    continue  # completed and consumed by the last round
                if not request.Test():
                    request.Cancel()
                    status = MPI.Status()
                    request.Wait(status)
                    if status.Is_cancelled():
                        continue
                late_segments.append((i, self._slots[i][slot].copy()))
        _finish_sends([r for r, _ in self._small_sends] + self._params.pending())
        return reports, late_segments


class MPIReplayActorChannel(MPIActorChannel):
    """An env rank's end in replay mode: parameters in, sample requests answered from the
    rank's partition, new priorities in. The rank serves requests between vector steps, so
    sampling never waits for an episode to finish."""

    def __init__(
        self,
        comm: MPI.Comm,
        learner_rank: int,
        param_nbytes: int,
        request_nbytes: int,
        answer_nbytes: int,
        priority_nbytes: int,
    ):
        super().__init__(comm, learner_rank, param_nbytes)
        self._request_inbox = np.empty(request_nbytes, dtype=np.uint8)
        self._request_req = comm.Irecv(
            self._request_inbox, source=learner_rank, tag=TAG_SAMPLE_REQUEST
        )
        self._priority_inbox = np.empty(priority_nbytes, dtype=np.uint8)
        self._priority_req = comm.Irecv(
            self._priority_inbox, source=learner_rank, tag=TAG_PRIORITIES
        )
        self._answer_bufs = [np.empty(answer_nbytes, dtype=np.uint8) for _ in range(2)]
        self._answer_reqs: list[MPI.Request | None] = [None, None]
        self._answer_turn = 0
        self._taken: np.ndarray | None = None

    def _take(self, request_attr: str, inbox: np.ndarray, tag: int) -> np.ndarray | None:
        if not getattr(self, request_attr).Test():
            return None
        message = inbox.copy()  # re-post at once: the learner may already be sending the next
        setattr(self, request_attr, self._comm.Irecv(inbox, source=self._learner, tag=tag))
        self._backoff.reset()
        return message

    def poll_request(self) -> np.ndarray | None:
        return self._take("_request_req", self._request_inbox, TAG_SAMPLE_REQUEST)

    def poll_priorities(self) -> np.ndarray | None:
        return self._take("_priority_req", self._priority_inbox, TAG_PRIORITIES)

    def send_answer(self, answer: np.ndarray) -> None:
        turn = self._answer_turn
        previous = self._answer_reqs[turn]
        if previous is not None:
            _wait_until(previous.Test, 600.0, lambda: "the learner to take an earlier answer")
        self._answer_bufs[turn][...] = answer
        self._answer_reqs[turn] = self._comm.Isend(
            self._answer_bufs[turn], dest=self._learner, tag=TAG_SAMPLE_ANSWER
        )
        self._answer_turn = 1 - turn

    def send_final_report(self, report: dict[str, Any]) -> None:
        _finish_sends([r for r in self._answer_reqs if r is not None])
        for request in (self._request_req, self._priority_req):
            request.Cancel()
            request.Wait()
        super().send_final_report(report)


class MPIReplayLearnerChannel:
    """The learner's end in replay mode: one outstanding sample request per partition."""

    def __init__(
        self,
        comm: MPI.Comm,
        env_ranks: list[int],
        param_nbytes: int,
        request_nbytes: int,
        answer_nbytes: int,
        priority_nbytes: int,
    ):
        self._comm = comm
        self._env_ranks = list(env_ranks)
        self.num_env_ranks = len(env_ranks)
        self._params = _ParamBroadcast(comm, self._env_ranks, param_nbytes)
        self._request_bufs = [np.empty(request_nbytes, dtype=np.uint8) for _ in env_ranks]
        self._request_reqs: list[MPI.Request | None] = [None] * self.num_env_ranks
        self._answers = [np.empty(answer_nbytes, dtype=np.uint8) for _ in env_ranks]
        self._answer_reqs: list[MPI.Request | None] = [None] * self.num_env_ranks
        self._priority_bufs = [np.empty(priority_nbytes, dtype=np.uint8) for _ in env_ranks]
        self._priority_reqs: list[MPI.Request | None] = [None] * self.num_env_ranks
        self._small_sends: list[MPI.Request] = []

    def broadcast_params(self, message: np.ndarray) -> None:
        self._params.send(message)

    def idle(self) -> None:
        """Nothing to sample yet (rate limit or learning not started): let env ranks step."""
        _FAILED_RANKS.check()
        time.sleep(5e-4)

    def send_requests(self, requests: list[np.ndarray]) -> None:
        for i, rank in enumerate(self._env_ranks):
            if self._request_reqs[i] is not None:
                _wait_until(
                    self._request_reqs[i].Test,
                    600.0,
                    lambda r=rank: f"env rank {r} to take a sample request",
                )
            self._request_bufs[i][...] = requests[i]
            # Post the answer's receive before asking, so the answer always finds it.
            self._answer_reqs[i] = self._comm.Irecv(
                self._answers[i], source=rank, tag=TAG_SAMPLE_ANSWER
            )
            self._request_reqs[i] = self._comm.Isend(
                self._request_bufs[i], dest=rank, tag=TAG_SAMPLE_REQUEST
            )

    def wait_answers(self, timeout_s: float) -> list[np.ndarray]:
        waiting = set(range(self.num_env_ranks))

        def arrived() -> bool:
            for i in list(waiting):
                if self._answer_reqs[i].Test():
                    waiting.discard(i)
            return not waiting

        _wait_until(
            arrived,
            timeout_s,
            lambda: (
                "a sample answer from env rank(s) "
                + ", ".join(str(self._env_ranks[i]) for i in sorted(waiting))
                + " (run.transport_timeout_s)"
            ),
        )
        self._answer_reqs = [None] * self.num_env_ranks  # taken: none is late any more
        return self._answers

    def send_priorities(self, index: int, message: np.ndarray) -> None:
        if self._priority_reqs[index] is not None:
            _wait_until(
                self._priority_reqs[index].Test,
                600.0,
                lambda: f"env rank {self._env_ranks[index]} to take priorities",
            )
        self._priority_bufs[index][...] = message
        self._priority_reqs[index] = self._comm.Isend(
            self._priority_bufs[index], dest=self._env_ranks[index], tag=TAG_PRIORITIES
        )

    def request_stop(self, **details: Any) -> None:
        stop = {"stop": True, "params_sent": self._params.sent, **details}
        for rank in self._env_ranks:
            self._small_sends.append(self._comm.isend(stop, dest=rank, tag=TAG_CONTROL))

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        """Every env rank's final report, and the answers (env-rank index, buffer) to the last
        request that arrived after the learner stopped taking them (the prefetched batch)."""
        reports = []
        for rank in self._env_ranks:
            _wait_until(
                lambda r=rank: self._comm.Iprobe(source=r, tag=TAG_FINAL),
                timeout_s,
                lambda r=rank: f"the final report of env rank {r}",
            )
            reports.append(self._comm.recv(source=rank, tag=TAG_FINAL))
        late = []
        for i, request in enumerate(self._answer_reqs):
            if request is None:
                continue
            # The rank may have stopped before serving the last request: cancel that receive.
            # One that already matched cannot be cancelled and completes with the answer.
            status = MPI.Status()
            request.Cancel()
            request.Wait(status)
            if not status.Is_cancelled():
                late.append((i, self._answers[i]))
        _finish_sends(
            self._small_sends
            + self._params.pending()
            + [r for r in self._request_reqs + self._priority_reqs if r is not None]
        )
        return reports, late
