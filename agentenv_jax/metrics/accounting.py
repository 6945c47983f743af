"""Experience accounting: every transition is counted where it is produced, sent, received and
trained on, and the end-of-run summary reconciles the counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Accounting:
    """Valid transitions (auto-reset padding rows excluded) at each stage of their journey."""

    produced: int  # stepped by env ranks
    sent: int  # left env ranks in segments
    received: int  # arrived at the learner, including `late`
    trained: int  # consumed by an update
    unsent: int  # produced but still queued on env ranks at shutdown
    late: int  # arrived after the last update: received, not trained on

    @property
    def reconciles(self) -> bool:
        return (
            self.produced == self.sent + self.unsent
            and self.sent == self.received
            and self.received == self.trained + self.late
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reconciles": self.reconciles}


def reconcile(
    env_reports: Sequence[dict[str, Any]], received: int, trained: int, late: int
) -> Accounting:
    """Combine env ranks' final reports with the learner's own counts."""
    return Accounting(
        produced=sum(int(r["produced"]) for r in env_reports),
        sent=sum(int(r["sent"]) for r in env_reports),
        received=received + late,
        trained=trained,
        unsent=sum(int(r["unsent"]) for r in env_reports),
        late=late,
    )


@dataclasses.dataclass(frozen=True)
class ReplayAccounting:
    """Transitions through the sharded replay buffer, summed over partitions."""

    produced: int  # env steps taken by env ranks (valid rows)
    inserted: int  # transitions written into partitions
    restored: int  # transitions loaded from saved partitions when the run resumed
    pending: int  # steps still waiting for their n-step return at shutdown
    dropped: int  # steps of n-step windows discarded because their episode faulted
    stored: int  # transitions held at shutdown
    overwritten: int  # transitions evicted by the rings
    sampled: int  # rows partitions handed out
    received: int  # rows that reached the learner
    trained: int  # rows consumed by updates
    prefetched: int  # rows drawn for a batch the run ended before training on

    @classmethod
    def from_reports(
        cls, reports: Sequence[dict[str, Any]], received: int, trained: int
    ) -> ReplayAccounting:
        total = {
            key: sum(int(r[key]) for r in reports)
            for key in (
                "produced",
                "inserted",
                "restored",
                "pending",
                "dropped",
                "stored",
                "overwritten",
                "sampled",
            )
        }
        return cls(
            **total, received=received, trained=trained, prefetched=total["sampled"] - received
        )

    @property
    def reconciles(self) -> bool:
        return (
            self.produced == self.inserted + self.pending + self.dropped
            and self.inserted + self.restored == self.stored + self.overwritten
            and self.received == self.trained
            and self.sampled == self.received + self.prefetched
            and self.prefetched >= 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reconciles": self.reconciles}
