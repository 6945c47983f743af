"""The on-policy MPI channels (PPO, IMPALA): segments in under credit flow control,
versioned parameters out, the stop request and final reports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from agentenv_jax.buffers.segment_queue import SegmentQueue
from agentenv_jax.transport.messages import (
    TAG_CONTROL,
    TAG_CREDIT,
    TAG_FINAL,
    TAG_SEGMENT,
)
from agentenv_jax.transport.mpi.params import (
    ParamBroadcast,
    ParamInbox,
    TreeParamBroadcast,
    TreeParamInbox,
)
from agentenv_jax.transport.mpi.world import (
    FAILED_RANKS,
    Backoff,
    cancel_receives,
    finish_sends,
    receive_final_reports,
    wait_until,
)


def param_sender(
    comm: MPI.Comm, env_ranks: list[int], nbytes: int, group: MPI.Comm | None
) -> ParamBroadcast:
    """The learner's parameter sender: a broadcast over `group` (its env ranks'
    communicator, `MPIWorld.split_param_groups`), or an `Isend` per env rank without one."""
    if group is not None:
        return TreeParamBroadcast(group, nbytes)
    return ParamBroadcast(comm, env_ranks, nbytes)


def param_inbox(
    comm: MPI.Comm, learner_rank: int, nbytes: int, group: MPI.Comm | None
) -> ParamInbox | TreeParamInbox:
    """An env rank's parameter receiver, matching its learner's `param_sender`."""
    if group is not None:
        return TreeParamInbox(group, nbytes)
    return ParamInbox(comm, learner_rank, nbytes)


class MPIActorChannel:
    """An env rank's end of the MPI transport (see `ActorChannel`); parameters arrive by
    broadcast over `param_group` where given (`topology.param_sync: broadcast`)."""

    def __init__(
        self,
        comm: MPI.Comm,
        learner_rank: int,
        param_nbytes: int,
        param_group: MPI.Comm | None = None,
    ):
        self._comm = comm
        self._learner = learner_rank
        self._params = param_inbox(comm, learner_rank, param_nbytes, param_group)
        self._credit_inbox = np.zeros(1, dtype=np.int64)
        self._credit_req = comm.Irecv(self._credit_inbox, source=learner_rank, tag=TAG_CREDIT)
        self._control_req = comm.irecv(source=learner_rank, tag=TAG_CONTROL)
        self._credits = 0
        self._stop_message: dict[str, Any] | None = None
        self._backoff = Backoff()
        self._inflight: list[tuple[MPI.Request, np.ndarray]] = []
        self._stopped = False

    def abandon(self) -> None:
        """The start was called off before any segment moved: withdraw the posted receives."""
        self._params.close()
        cancel_receives([self._credit_req, self._control_req])

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
        message = self._params.poll()
        if message is not None:
            self._backoff.reset()
        return message

    def stop_requested(self) -> bool:
        return self._poll_stop()

    def stop_details(self) -> dict[str, Any]:
        """What the learner's stop request carried besides the stop itself."""
        return dict(self._stop_message or {})

    def idle(self) -> None:
        FAILED_RANKS.check()
        self._backoff.pause()

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

        wait_until(sent, timeout_s, lambda: f"{len(self._inflight)} segment sends to complete")

    def send_final_report(self, report: dict[str, Any]) -> None:
        # Take every parameter message the learner sent before it asked us to stop, so none of
        # its sends is left unmatched when we cancel our receive.
        sent = (self._stop_message or {}).get("params_sent", 0)
        wait_until(
            lambda: self._params.done(sent), 30.0, lambda: "the learner's last parameter message"
        )
        self._comm.send(dict(report), dest=self._learner, tag=TAG_FINAL)
        self._params.close()
        self._credit_req.Cancel()
        self._credit_req.Wait()
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
        param_group: MPI.Comm | None = None,
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
        # Credit messages are read from these two never-written buffers, so any number of
        # credit sends may be in flight without a buffer (or an allocation) each.
        credits = np.array([max_inflight, 1], dtype=np.int64)
        credits.flags.writeable = False
        self._first_credits, self._one_credit = credits[:1], credits[1:]
        self._small_sends: list[MPI.Request] = []
        for rank in self._env_ranks:
            self._send_credit(rank, self._first_credits)
        self._params = param_sender(comm, self._env_ranks, param_nbytes, param_group)
        self._round_taken = False

    def abandon(self) -> None:
        """The start was called off before any segment moved: withdraw the posted receives
        and let the credits already sent go."""
        cancel_receives([r for slots in self._slot_reqs for r in slots])
        finish_sends(self._small_sends)

    def _send_credit(self, rank: int, count: np.ndarray) -> None:
        self._small_sends.append(self._comm.Isend(count, dest=rank, tag=TAG_CREDIT))

    def _forget_completed_sends(self) -> None:
        # A small send is eager: it has almost always completed by now, and one `Testall`
        # (which completes them all, or none) is cheaper than a `Test` each.
        if MPI.Request.Testall(self._small_sends):
            self._small_sends.clear()
        else:
            self._small_sends = [r for r in self._small_sends if not r.Test()]

    def broadcast_params(self, message: np.ndarray) -> None:
        self._params.send(message)

    def receive_round(
        self, timeout_s: float, serve: Callable[[Callable[[], list[int]]], Any] | None = None
    ) -> list[np.ndarray]:
        # Each env rank's next segment lands in the slot whose receive was posted first.
        current = [reqs[slot] for reqs, slot in zip(self._slot_reqs, self._next_slot, strict=True)]

        def collecting() -> list[int]:
            """Env ranks whose segment of this round has not arrived (they still step)."""
            return [i for i, request in enumerate(current) if not request.Get_status()]

        def arrived() -> bool:
            if serve is not None:
                # Central inference: the env ranks' requests are answered while we wait.
                serve(collecting)
            return MPI.Request.Testall(current)

        wait_until(
            arrived,
            timeout_s,
            lambda: (
                "a segment from env rank(s) "
                + ", ".join(
                    str(rank)
                    for rank, request in zip(self._env_ranks, current, strict=True)
                    if not request.Get_status()
                )
                + " (run.transport_timeout_s)"
            ),
        )
        self._round_taken = True
        return [slots[slot] for slots, slot in zip(self._slots, self._next_slot, strict=True)]

    def release_round(self) -> None:
        if not self._round_taken:
            return
        for i, rank in enumerate(self._env_ranks):
            slot = self._next_slot[i]
            # NOTE: re-post the slot's receive before granting the credit it stands for, so the
            # segment that credit lets the env rank send always finds a receive posted (no
            # unexpected-message copy), in the order this rank's slots are consumed.
            self._slot_reqs[i][slot] = self._comm.Irecv(
                self._slots[i][slot], source=rank, tag=TAG_SEGMENT
            )
            self._next_slot[i] = (slot + 1) % len(self._slots[i])
            self._send_credit(rank, self._one_credit)
        self._forget_completed_sends()
        self._round_taken = False

    def request_stop(self) -> None:
        self._params.close()
        stop = {"stop": True, "params_sent": self._params.sent}
        for rank in self._env_ranks:
            self._small_sends.append(self._comm.isend(stop, dest=rank, tag=TAG_CONTROL))

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        reports = receive_final_reports(self._comm, self._env_ranks, timeout_s)
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
        finish_sends(self._small_sends + self._params.pending())
        return reports, late_segments
