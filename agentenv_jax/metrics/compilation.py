"""Time this process spends compiling XLA programs, and JAX's persistent compilation cache.

JAX reports each compilation (or fetch from the persistent cache) as a monitoring event; a
listener registered once per process adds them up, so a run can record how long it compiled
and how many programs came from the cache. A sweep points its trials at one cache folder, so
the second trial of a config fetches its programs instead of compiling them again.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

# Wraps `compile_or_get_cached`: a persistent-cache hit is timed too (the fetch, short).
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(frozen=True)
class CompileTotals:
    """Compilation so far in this process: seconds, programs, and persistent-cache hits."""

    seconds: float = 0.0
    programs: int = 0
    cache_hits: int = 0

    def since(self, earlier: CompileTotals) -> CompileTotals:
        return CompileTotals(
            self.seconds - earlier.seconds,
            self.programs - earlier.programs,
            self.cache_hits - earlier.cache_hits,
        )


_lock = threading.Lock()
_totals = CompileTotals()
_registered = False


def _on_duration(event: str, duration: float, **_: object) -> None:
    global _totals
    if event == _COMPILE_EVENT:
        with _lock:
            _totals = dataclasses.replace(
                _totals, seconds=_totals.seconds + duration, programs=_totals.programs + 1
            )


def _on_event(event: str, **_: object) -> None:
    global _totals
    if event == _CACHE_HIT_EVENT:
        with _lock:
            _totals = dataclasses.replace(_totals, cache_hits=_totals.cache_hits + 1)


def compile_totals() -> CompileTotals:
    """This process's compilation so far (counted from the first call of this function)."""
    global _registered
    import jax

    with _lock:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _registered = True
        return _totals


def use_persistent_cache(directory: str | None) -> None:
    """Cache every compiled program in `directory` (made if missing); None leaves JAX's own
    setting. JAX opens the cache at the first compilation, so call this before any."""
    if directory is None:
        return
    import jax

    Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Cache everything: an RL step's programs are small, and each one saved is a compile
    # the next trial skips.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
