"""Experience accounting: every transition is counted where it is produced, sent, received and
trained on, and the end-of-run summary reconciles the counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Accounting:
    """Valid transitions (auto-reset padding rows excluded) at each stage of their journey.

    Each stage is counted where it happens: env ranks count what they step, send and still hold
    at the end; the learner counts the rows of each segment as it arrives, the update counts the
    rows it trained on (on the device), and the channel counts segments that arrived after the
    last update. A row lost or doubled between two stages breaks an equation.
    """

    produced: int = 0  # stepped by env ranks
    sent: int = 0  # left env ranks in segments
    received: int = 0  # arrived at the learner, including `late`
    trained: int = 0  # consumed by an update
    unsent: int = 0  # produced but still queued on env ranks at shutdown
    late: int = 0  # arrived after the last update: received, not trained on
    discarded: int = 0  # received, left out of an update that dynamic sampling refilled

    @property
    def reconciles(self) -> bool:
        return (
            self.produced == self.sent + self.unsent
            and self.sent == self.received
            and self.received == self.trained + self.late + self.discarded
        )

    def __add__(self, other: Accounting) -> Accounting:
        """Two sessions of one run (a run and its resumption) together."""
        theirs = other.counts()
        return Accounting(**{name: n + theirs[name] for name, n in self.counts().items()})

    @classmethod
    def trained_so_far(cls, trained: int, discarded: int = 0) -> Accounting:
        """What a checkpoint taken between updates carries forward: the rows trained on (and
        those discarded by the updates so far). The rest of what env ranks stepped by then is
        in flight and is stepped anew by a run that resumes from this checkpoint."""
        taken = trained + discarded
        return cls(produced=taken, sent=taken, received=taken, trained=trained, discarded=discarded)

    def counts(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def as_dict(self) -> dict[str, Any]:
        return {**self.counts(), "reconciles": self.reconciles}


def reconcile(
    env_reports: Sequence[dict[str, Any]],
    received: int,
    trained: int,
    late: int,
    discarded: int = 0,
) -> Accounting:
    """Combine env ranks' final reports with the learner's own counts (`received` excludes
    `late`: it is what the updates were given, or `discarded` from)."""
    return Accounting(
        produced=sum(int(r["produced"]) for r in env_reports),
        sent=sum(int(r["sent"]) for r in env_reports),
        received=received + late,
        trained=trained,
        unsent=sum(int(r["unsent"]) for r in env_reports),
        late=late,
        discarded=discarded,
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
        cls, reports: Sequence[dict[str, Any]], received: int, trained: int, prefetched: int
    ) -> ReplayAccounting:
        """Partitions' final reports with the learner's counts: `received`, the rows it took
        from answers; `trained`, the rows its updates consumed; `prefetched`, the rows of
        answers that arrived after its last update."""
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
        return cls(**total, received=received, trained=trained, prefetched=prefetched)

    @property
    def reconciles(self) -> bool:
        return (
            self.produced == self.inserted + self.pending + self.dropped
            and self.inserted + self.restored == self.stored + self.overwritten
            and self.received == self.trained
            and self.sampled == self.received + self.prefetched
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reconciles": self.reconciles}
