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
