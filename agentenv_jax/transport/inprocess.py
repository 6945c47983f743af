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
