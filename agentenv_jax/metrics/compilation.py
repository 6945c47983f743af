"""Time this process spends compiling XLA programs, and JAX's persistent compilation cache.

JAX reports each compilation (or fetch from the persistent cache) as a monitoring event; a
listener registered once per process adds them up, so a run can record how long it compiled
and how many programs came from the cache. The cache is on by default, in a user cache folder
that every rank and every run shares: a run compiled once starts warm the next time, and a
sweep's later seeds of a config fetch the programs its first seed compiled.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

# Wraps `compile_or_get_cached`: a persistent-cache hit is timed too (the fetch, short).
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# Where every run's cache goes unless `run.compilation_cache_dir` says otherwise.
CACHE_DIR_VARIABLE = "AGENTENV_CACHE_DIR"


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


def cache_folder(directory: str | None) -> Path:
    """The persistent cache's folder: `directory`, else `$AGENTENV_CACHE_DIR`, else
    `$XDG_CACHE_HOME/agentenv_jax/jax` (`~/.cache/agentenv_jax/jax`)."""
    if directory is not None:
        return Path(directory).expanduser()
    if os.environ.get(CACHE_DIR_VARIABLE):
        return Path(os.environ[CACHE_DIR_VARIABLE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agentenv_jax" / "jax"


def use_persistent_cache(enabled: bool, directory: str | None) -> Path | None:
    """Turn JAX's persistent compilation cache on in `cache_folder(directory)` (made if
    missing), or off; returns the folder in use. JAX opens the cache at the first compilation
    and keeps it, so a change (a second run in a notebook) resets it."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    folder = cache_folder(directory) if enabled else None
    current = (
        jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
    )
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    if current == (None if folder is None else str(folder)):
        return folder
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
    else:
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", str(folder))
        # Cache everything: an RL step's programs are small, and each one saved is a compile
        # the next run skips.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    return folder
