"""The interfaces between the actor and learner loops and whatever carries their messages.

Two implementations exist: `inprocess` (one process, tests, notebooks) and `mpi` (one rank per
process). The loops only see these protocols, so the algorithms never know which one runs.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from agentenv_jax.buffers.segment_queue import SegmentQueue


class TransportError(RuntimeError):
    """A peer did not answer in time, or the message flow broke its protocol."""


class CollectionStopped(Exception):
    """Central inference: the learner asked the env rank to stop while it waited for actions
    (the segment it was filling is dropped uncounted, as one not yet begun)."""


class ActorChannel(Protocol):
    """An env rank's end: parameters in, segments out under credit-based flow control."""

    def poll_params(self) -> np.ndarray | None:
        """The newest parameter message received since the last call, or None; never blocks."""

    def pump(self, queue: SegmentQueue) -> None:
        """Send as many ready segments as there are credits; recycle buffers whose send ended."""

    def stop_requested(self) -> bool:
        """Whether the learner asked this rank to stop; never blocks."""

    def stop_details(self) -> dict[str, Any]:
        """What the stop request carried besides the stop (`save_replay_at`, say)."""

    def idle(self) -> None:
        """Nothing to do until the learner sends something: yield the core for a moment."""

    def flush(self, queue: SegmentQueue, timeout_s: float) -> None:
        """Wait until every segment already sent has left this rank."""

    def send_final_report(self, report: dict[str, Any]) -> None:
        """The env rank's end-of-run accounting (a control message, pickled)."""


class LearnerChannel(Protocol):
    """The learner's end: segments in from every env rank, versioned parameters out."""

    num_env_ranks: int

    def broadcast_params(self, message: np.ndarray) -> None:
        """Send one parameter message to every env rank without waiting for them."""

    def receive_round(self, timeout_s: float, serve: Any = None) -> list[np.ndarray]:
        """Block until the next segment of every env rank has arrived; return their buffers in
        env-rank order. They stay valid until `release_round`. `serve(collecting)`, if given,
        is called while waiting (central inference), with a function that lists the env-rank
        indices whose segment has not arrived yet."""

    def release_round(self) -> None:
        """Hand the last round's buffers back to the transport and grant a credit each."""

    def request_stop(self, **details: Any) -> None:
        """Tell every env rank to stop collecting (passing `details` along)."""

    def collect_final_reports(
        self, timeout_s: float
    ) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]]]:
        """Every env rank's final report, and the segments (env-rank index, buffer) that arrived
        after the last round was taken: received, but never trained on."""


class LearnerGroup(Protocol):
    """The learner processes that share one mesh (`index` of `size`): the small collectives
    that keep global quantities global. Every learner calls each in the same order."""

    index: int
    size: int

    def allgather(self, value: Any) -> list[Any]:
        """Every learner's `value`, in learner order (pickled; not for the hot path)."""

    def any(self, flag: bool) -> bool:
        """Whether any learner's `flag` is set."""

    def exchange(self, local: np.ndarray) -> list[np.ndarray]:
        """Every learner's byte buffer (its size fixed for the run), in learner order."""


class SoloLearnerGroup:
    """The one learner of a run with a single learner process: every collective is itself."""

    index = 0
    size = 1

    def allgather(self, value: Any) -> list[Any]:
        return [value]

    def any(self, flag: bool) -> bool:
        return flag

    def exchange(self, local: np.ndarray) -> list[np.ndarray]:
        return [local]


def gather_final_reports(
    group: LearnerGroup, reports: list[dict[str, Any]], uncounted: int
) -> tuple[list[dict[str, Any]], int]:
    """Every env rank's final report (learner-major) and the sum over learners of `uncounted`
    (experience that arrived after the last round), so every learner accounts for the whole
    run."""
    gathered = group.allgather((reports, uncounted))
    return [r for learner_reports, _ in gathered for r in learner_reports], sum(
        count for _, count in gathered
    )
