"""The replay MPI channels (SAC): sample requests out to every partition, answers and new
priorities, the stop request and final reports."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from agentenv_jax.transport.messages import (
    TAG_CONTROL,
    TAG_PRIORITIES,
    TAG_SAMPLE_ANSWER,
    TAG_SAMPLE_REQUEST,
)
from agentenv_jax.transport.mpi.on_policy import MPIActorChannel, param_sender
from agentenv_jax.transport.mpi.world import (
    FAILED_RANKS,
    cancel_receives,
    finish_sends,
    receive_final_reports,
    wait_until,
)


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
        param_group: MPI.Comm | None = None,
    ):
        super().__init__(comm, learner_rank, param_nbytes, param_group)
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

    def abandon(self) -> None:
        super().abandon()
        cancel_receives([self._request_req, self._priority_req])

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
            wait_until(previous.Test, 600.0, lambda: "the learner to take an earlier answer")
        self._answer_bufs[turn][...] = answer
        self._answer_reqs[turn] = self._comm.Isend(
            self._answer_bufs[turn], dest=self._learner, tag=TAG_SAMPLE_ANSWER
        )
        self._answer_turn = 1 - turn

    def send_final_report(self, report: dict[str, Any]) -> None:
        finish_sends([r for r in self._answer_reqs if r is not None])
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
        param_group: MPI.Comm | None = None,
    ):
        self._comm = comm
        self._env_ranks = list(env_ranks)
        self.num_env_ranks = len(env_ranks)
        self._params = param_sender(comm, self._env_ranks, param_nbytes, param_group)
        self._request_bufs = [np.empty(request_nbytes, dtype=np.uint8) for _ in env_ranks]
        self._request_reqs: list[MPI.Request | None] = [None] * self.num_env_ranks
        self._answers = [np.empty(answer_nbytes, dtype=np.uint8) for _ in env_ranks]
        self._answer_reqs: list[MPI.Request | None] = [None] * self.num_env_ranks
        self._priority_bufs = [np.empty(priority_nbytes, dtype=np.uint8) for _ in env_ranks]
        self._priority_reqs: list[MPI.Request | None] = [None] * self.num_env_ranks
        self._small_sends: list[MPI.Request] = []

    def abandon(self) -> None:
        """The start was called off: nothing is posted before the first request."""

    def broadcast_params(self, message: np.ndarray) -> None:
        self._params.send(message)

    def idle(self) -> None:
        """Nothing to sample yet (rate limit or learning not started): let env ranks step."""
        FAILED_RANKS.check()
        time.sleep(5e-4)

    def send_requests(self, requests: list[np.ndarray]) -> None:
        for i, rank in enumerate(self._env_ranks):
            if self._request_reqs[i] is not None:
                wait_until(
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
        pending = self._answer_reqs  # every rank was just asked (`send_requests`)
        wait_until(
            lambda: MPI.Request.Testall(pending),
            timeout_s,
            lambda: (
                "a sample answer from env rank(s) "
                + ", ".join(
                    str(rank)
                    for rank, request in zip(self._env_ranks, pending, strict=True)
                    if not request.Get_status()
                )
                + " (run.transport_timeout_s)"
            ),
        )
        self._answer_reqs = [None] * self.num_env_ranks  # taken: none is late any more
        return self._answers

    def send_priorities(self, index: int, message: np.ndarray) -> None:
        if self._priority_reqs[index] is not None:
            wait_until(
                self._priority_reqs[index].Test,
                600.0,
                lambda: f"env rank {self._env_ranks[index]} to take priorities",
            )
        self._priority_bufs[index][...] = message
        self._priority_reqs[index] = self._comm.Isend(
            self._priority_bufs[index], dest=self._env_ranks[index], tag=TAG_PRIORITIES
        )

    def request_stop(self, **details: Any) -> None:
        self._params.close()
        stop = {"stop": True, "params_sent": self._params.sent, **details}
        for rank in self._env_ranks:
            self._small_sends.append(self._comm.isend(stop, dest=rank, tag=TAG_CONTROL))

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        """Every env rank's final report, and the answers (env-rank index, buffer) to the last
        request that arrived after the learner stopped taking them (the prefetched batch)."""
        reports = receive_final_reports(self._comm, self._env_ranks, timeout_s)
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
        finish_sends(
            self._small_sends
            + self._params.pending()
            + [r for r in self._request_reqs + self._priority_reqs if r is not None]
        )
        return reports, late
