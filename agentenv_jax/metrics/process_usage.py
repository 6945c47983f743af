"""How busy a process kept its CPU: CPU seconds over wall seconds since a starting point.

Env ranks report it with their final accounting, so a run shows what ranks burn while they
wait (for parameters, credits or the learner's requests): with hundreds of env ranks per job,
a rank that spins while idle costs a core. A share of 1.0 is one core busy all the time. They
report their peak resident memory too, and whether JAX was ever imported in the process: what a
job of hundreds of ranks multiplies.
"""

from __future__ import annotations

import resource
import sys
import time


class ProcessClock:
    """CPU (`time.process_time`, every thread of the process) and wall seconds since creation."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def report(self) -> dict[str, float | bool]:
        """`cpu_s` and `wall_s` so far, the process's peak resident memory (`max_rss_mb`) and
        whether it imported JAX (`jax_loaded`), for a final report."""
        return {
            "cpu_s": time.process_time() - self._cpu,
            "wall_s": time.perf_counter() - self._wall,
            "max_rss_mb": peak_resident_mb(),
            "jax_loaded": "jax" in sys.modules,
        }


def peak_resident_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def env_rank_usage(reports: list[dict]) -> dict[str, list]:
    """The summary's per-env-rank lists, in report order: CPU share (`cpu_s / wall_s`), peak
    resident memory and whether JAX was loaded."""
    return {
        "env_rank_cpu_share": [round(r["cpu_s"] / max(r["wall_s"], 1e-9), 3) for r in reports],
        "env_rank_max_rss_mb": [r["max_rss_mb"] for r in reports],
        "env_rank_jax_loaded": [r["jax_loaded"] for r in reports],
    }
