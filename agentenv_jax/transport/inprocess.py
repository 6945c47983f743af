"""The in-process transports: one learner and one env rank sharing a process.

They keep the MPI transports' semantics — copies rather than shared buffers, credits, a stop
request and a final report — so the actor and learner loops run unchanged. The caller
interleaves them (`agentenv_jax.runtime.launch.run_single_process`); a call that would have
to wait for the other side raises instead of deadlocking.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from agentenv_jax.buffers.segment_queue import SegmentQueue
from agentenv_jax.transport.base import TransportError


class _Hub:
    """What both modes share: the newest parameters, the stop flag, the final report."""

    def __init__(self) -> None:
        self.params: np.ndarray | None = None
        self.params_serial = 0
        self.stop = False
        self.stop_details: dict[str, Any] = {}
        self.reports: list[dict[str, Any]] = []


class _ActorEndBase:
    def __init__(self, hub: _Hub):
        self._hub = hub
        self._seen_serial = 0

    def poll_params(self) -> np.ndarray | None:
        if self._hub.params_serial == self._seen_serial:
            return None
        self._seen_serial = self._hub.params_serial
        return self._hub.params

    def stop_requested(self) -> bool:
        return self._hub.stop

    def stop_details(self) -> dict[str, Any]:
        return dict(self._hub.stop_details)

    def idle(self) -> None:
        raise TransportError(
            "in-process env rank would wait for the learner: the loops were interleaved out "
            "of order (call run_once only while ready())"
        )

    def send_final_report(self, report: dict[str, Any]) -> None:
        self._hub.reports.append(dict(report))


class _LearnerEndBase:
    num_env_ranks = 1

    def __init__(self, hub: _Hub):
        self._hub = hub

    def broadcast_params(self, message: np.ndarray) -> None:
        self._hub.params = message.copy()
        self._hub.params_serial += 1

    def request_stop(self, **details: Any) -> None:
        self._hub.stop = True
        self._hub.stop_details = dict(details)

    def _final_reports(self) -> list[dict[str, Any]]:
        if len(self._hub.reports) != 1:
            raise TransportError("in-process env rank has not sent its final report")
        return list(self._hub.reports)


class InProcessTransport(_Hub):
    """On-policy mode: `.actor` is an `ActorChannel`, `.learner` a `LearnerChannel`."""

    def __init__(self, max_inflight_segments: int):
        super().__init__()
        self.segments: collections.deque[np.ndarray] = collections.deque()
        self.credits = max_inflight_segments
        self.actor = _ActorEnd(self)
        self.learner = _LearnerEnd(self)


class _ActorEnd(_ActorEndBase):
    _hub: InProcessTransport

    def pump(self, queue: SegmentQueue) -> None:
        while queue.depth and self._hub.credits > 0:
            buffer = queue.pop_ready()
            self._hub.segments.append(buffer.copy())
            self._hub.credits -= 1
            queue.release(buffer)

    def flush(self, queue: SegmentQueue, timeout_s: float) -> None:
        return None  # sends complete immediately: they are copies


class _LearnerEnd(_LearnerEndBase):
    _hub: InProcessTransport

    def __init__(self, hub: InProcessTransport):
        super().__init__(hub)
        self._round: list[np.ndarray] = []

    def receive_round(self, timeout_s: float, serve: Any = None) -> list[np.ndarray]:
        # (`serve`: central inference is answered as each request is made, in one process.)
        if not self._hub.segments:
            raise TransportError(
                "in-process learner waits for a segment the env rank has not "
                "produced: the loops were interleaved out of order"
            )
        self._round = [self._hub.segments.popleft()]
        return self._round

    def release_round(self) -> None:
        self._hub.credits += len(self._round)
        self._round = []

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        reports = self._final_reports()
        late = [(0, segment) for segment in self._hub.segments]
        self._hub.segments.clear()
        return reports, late


class InProcessReplayTransport(_Hub):
    """Replay mode: `.actor` serves sample requests, `.learner` sends them."""

    def __init__(self) -> None:
        super().__init__()
        self.request: np.ndarray | None = None
        self.answer: np.ndarray | None = None
        self.priorities: collections.deque[np.ndarray] = collections.deque()
        self.actor = _ReplayActorEnd(self)
        self.learner = _ReplayLearnerEnd(self)


class _ReplayActorEnd(_ActorEndBase):
    _hub: InProcessReplayTransport

    def poll_request(self) -> np.ndarray | None:
        request, self._hub.request = self._hub.request, None
        return request

    def poll_priorities(self) -> np.ndarray | None:
        return self._hub.priorities.popleft() if self._hub.priorities else None

    def send_answer(self, answer: np.ndarray) -> None:
        self._hub.answer = answer.copy()


class _ReplayLearnerEnd(_LearnerEndBase):
    _hub: InProcessReplayTransport

    def idle(self) -> None:
        return None  # the env rank runs between the learner's rounds anyway

    def send_requests(self, requests: list[np.ndarray]) -> None:
        self._hub.request = requests[0].copy()

    def wait_answers(self, timeout_s: float) -> list[np.ndarray]:
        if self._hub.answer is None:
            raise TransportError(
                "in-process learner waits for an answer the env rank has not "
                "sent: the loops were interleaved out of order"
            )
        answer, self._hub.answer = self._hub.answer, None
        return [answer]

    def send_priorities(self, index: int, message: np.ndarray) -> None:
        self._hub.priorities.append(message.copy())

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        late = [] if self._hub.answer is None else [(0, self._hub.answer)]
        self._hub.answer = None
        return self._final_reports(), late


class InProcessInference:
    """Central inference in one process: the env rank's request is answered at once by the
    learner's server (`learner.inference_server`), which the learner attaches."""

    def __init__(self, request_spec: Any, reply_spec: Any):
        self._request_spec = request_spec
        self._reply_spec = reply_spec
        self._reply = reply_spec.allocate()
        self.server: Any = None

    def attach(self, server: Any) -> None:
        self.server = server

    def poll(self) -> list[int]:
        return []  # every request is answered as it is made

    def close(self) -> None:
        return None  # nothing posted

    def call(self, request: np.ndarray) -> np.ndarray:
        if self.server is None:
            raise TransportError("in-process central inference: no learner server attached")
        self.server.answer(
            [0], [self._request_spec.views(request)], [self._reply_spec.views(self._reply)]
        )
        return self._reply
