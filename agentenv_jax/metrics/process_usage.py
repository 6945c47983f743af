"""How busy a process kept its CPU: CPU seconds over wall seconds since a starting point.

Env ranks report it with their final accounting, so a run shows what ranks burn while they
wait (for parameters, credits or the learner's requests): with hundreds of env ranks per job,
a rank that spins while idle costs a core. A share of 1.0 is one core busy all the time.
"""

from __future__ import annotations

import time


class ProcessClock:
    """CPU (`time.process_time`, every thread of the process) and wall seconds since creation."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def report(self) -> dict[str, float]:
        """`cpu_s` and `wall_s` so far, for a final report."""
        return {
            "cpu_s": time.process_time() - self._cpu,
            "wall_s": time.perf_counter() - self._wall,
        }


def cpu_shares(reports: list[dict]) -> list[float]:
    """Each report's CPU share (`cpu_s / wall_s`), in report order."""
    return [round(r["cpu_s"] / max(r["wall_s"], 1e-9), 3) for r in reports]
