"""The in-process transport: one learner and one env rank sharing a process.

It keeps the MPI transport's semantics — copies rather than shared buffers, credits, a stop
request and a final report — so the actor and learner loops run unchanged. The caller
interleaves them (`agentenv_jax.launch.run_single_process`); a call that would have to wait for
the other side raises instead of deadlocking.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from agentenv_jax.buffers.segment_queue import SegmentQueue
from agentenv_jax.transport.base import TransportError


class InProcessTransport:
    """Both ends at once: `.actor` is an `ActorChannel`, `.learner` a `LearnerChannel`."""

    def __init__(self, max_inflight_segments: int):
        self._params: np.ndarray | None = None
        self._params_serial = 0
        self._segments: collections.deque[np.ndarray] = collections.deque()
        self._credits = max_inflight_segments
        self._stop = False
        self._reports: list[dict[str, Any]] = []
        self.actor = _ActorEnd(self)
        self.learner = _LearnerEnd(self)


class _ActorEnd:
    def __init__(self, hub: InProcessTransport):
        self._hub = hub
        self._seen_serial = 0

    def poll_params(self) -> np.ndarray | None:
        if self._hub._params_serial == self._seen_serial:
            return None
        self._seen_serial = self._hub._params_serial
        return self._hub._params

    def stop_requested(self) -> bool:
        return self._hub._stop

    def idle(self) -> None:
        raise TransportError(
            "in-process env rank would wait for the learner: the loops were interleaved out "
            "of order (call run_once only while ready())"
        )

    def pump(self, queue: SegmentQueue) -> None:
        while queue.depth and self._hub._credits > 0:
            buffer = queue.pop_ready()
            self._hub._segments.append(buffer.copy())
            self._hub._credits -= 1
            queue.release(buffer)

    def flush(self, queue: SegmentQueue, timeout_s: float) -> None:
        return None  # sends complete immediately: they are copies

    def send_final_report(self, report: dict[str, Any]) -> None:
        self._hub._reports.append(dict(report))


class _LearnerEnd:
    num_env_ranks = 1

    def __init__(self, hub: InProcessTransport):
        self._hub = hub
        self._round: list[np.ndarray] = []

    def broadcast_params(self, message: np.ndarray) -> None:
        self._hub._params = message.copy()
        self._hub._params_serial += 1

    def receive_round(self, timeout_s: float) -> list[np.ndarray]:
        if not self._hub._segments:
            raise TransportError(
                "in-process learner waits for a segment the env rank has not "
                "produced: the loops were interleaved out of order"
            )
        self._round = [self._hub._segments.popleft()]
        return self._round

    def release_round(self) -> None:
        self._hub._credits += len(self._round)
        self._round = []

    def request_stop(self) -> None:
        self._hub._stop = True

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        if len(self._hub._reports) != 1:
            raise TransportError("in-process env rank has not sent its final report")
        late = [(0, segment) for segment in self._hub._segments]
        self._hub._segments.clear()
        return list(self._hub._reports), late


class InProcessReplayTransport:
    """Replay mode in one process: `.actor` is a `ReplayActorChannel`, `.learner` a
    `ReplayLearnerChannel`. Messages are copies, as over MPI; the caller interleaves the loops."""

    def __init__(self) -> None:
        self._params: np.ndarray | None = None
        self._params_serial = 0
        self._request: np.ndarray | None = None
        self._answer: np.ndarray | None = None
        self._priorities: collections.deque[np.ndarray] = collections.deque()
        self._stop = False
        self._reports: list[dict[str, Any]] = []
        self.actor = _ReplayActorEnd(self)
        self.learner = _ReplayLearnerEnd(self)


class _ReplayActorEnd:
    def __init__(self, hub: InProcessReplayTransport):
        self._hub = hub
        self._seen_serial = 0

    def poll_params(self) -> np.ndarray | None:
        if self._hub._params_serial == self._seen_serial:
            return None
        self._seen_serial = self._hub._params_serial
        return self._hub._params

    def stop_requested(self) -> bool:
        return self._hub._stop

    def idle(self) -> None:
        raise TransportError(
            "in-process env rank would wait for the learner: the loops were interleaved out "
            "of order (call run_once only while ready())"
        )

    def poll_request(self) -> np.ndarray | None:
        request, self._hub._request = self._hub._request, None
        return request

    def poll_priorities(self) -> np.ndarray | None:
        return self._hub._priorities.popleft() if self._hub._priorities else None

    def send_answer(self, answer: np.ndarray) -> None:
        self._hub._answer = answer.copy()

    def send_final_report(self, report: dict[str, Any]) -> None:
        self._hub._reports.append(dict(report))


class _ReplayLearnerEnd:
    num_env_ranks = 1

    def __init__(self, hub: InProcessReplayTransport):
        self._hub = hub

    def broadcast_params(self, message: np.ndarray) -> None:
        self._hub._params = message.copy()
        self._hub._params_serial += 1

    def idle(self) -> None:
        return None  # the env rank runs between the learner's rounds anyway

    def send_requests(self, requests: list[np.ndarray]) -> None:
        self._hub._request = requests[0].copy()

    def wait_answers(self, timeout_s: float) -> list[np.ndarray]:
        if self._hub._answer is None:
            raise TransportError(
                "in-process learner waits for an answer the env rank has not "
                "sent: the loops were interleaved out of order"
            )
        answer, self._hub._answer = self._hub._answer, None
        return [answer]

    def send_priorities(self, index: int, message: np.ndarray) -> None:
        self._hub._priorities.append(message.copy())

    def request_stop(self) -> None:
        self._hub._stop = True

    def collect_final_reports(self, timeout_s: float) -> list[dict[str, Any]]:
        if len(self._hub._reports) != 1:
            raise TransportError("in-process env rank has not sent its final report")
        return list(self._hub._reports)
