"""Sandboxes on the host side: settings, one warm worker, and a pool of them per process.

A `SandboxWorker` is one sandbox (see `isolation`) with a worker inside that has already
started Python and imported the common modules; each program it runs is a fork of that
worker, so a call costs a fork, not an interpreter start. The worker enforces the program's
limits, and the host enforces the worker's: a reply that does not come within the wall-clock
limit plus a grace ends the whole sandbox (its process group, and with it the PID namespace),
and the next call starts a fresh one. A `SandboxPool` holds `workers` of them, so that up to
that many programs run at once; `pool.map` runs a batch of requests concurrently, and a call
that comes while every worker is busy waits for one.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentenv_jax.envs.sandbox.isolation import (
    DESCRIPTIONS,
    ISOLATIONS,
    SANDBOX_TMP,
    available,
    bubblewrap_command,
    child_uid,
    isolation_order,
    plain_command,
    unshare_command,
)
from agentenv_jax.envs.spaces import EnvError

# Modules the worker imports once, so that programs using them start at once.
DEFAULT_PRELOAD = (
    "collections",
    "dataclasses",
    "fractions",
    "functools",
    "heapq",
    "itertools",
    "json",
    "math",
    "random",
    "re",
    "statistics",
    "string",
    "typing",
)
# The environment every program gets: nothing of the host's (no tokens, no keys).
_ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_START_TIMEOUT_S = 30.0
# How long past a program's wall-clock limit the host waits for the worker's reply before it
# ends the sandbox itself: the worker kills at the limit, sweeps and answers well within this.
_REPLY_GRACE_S = 5.0


class SandboxError(EnvError):
    """A sandbox that cannot be started, or settings that are not allowed."""


@dataclasses.dataclass(frozen=True)
class SandboxSettings:
    """How programs are isolated and limited (`env.kwargs.sandbox` of tasks that run code)."""

    isolation: str = "auto"  # auto (bubblewrap, else unshare), bubblewrap, unshare, none
    wall_s: float = 5.0  # wall-clock seconds a program may run, enforced from outside
    cpu_s: float = 5.0  # CPU seconds a program may use (RLIMIT_CPU)
    memory_mb: int = 1024  # address space, the interpreter's included (RLIMIT_AS)
    file_mb: int = 16  # the largest file a program may write (RLIMIT_FSIZE)
    tmp_mb: int = 64  # the private /tmp's size (bubblewrap)
    processes: int = 32  # processes and threads a program may have at once (RLIMIT_NPROC)
    open_files: int = 64  # file descriptors a program may hold (RLIMIT_NOFILE)
    output_bytes: int = 65536  # stdout + stderr kept; a program writing more is killed
    workers: int = 4  # warm sandboxes per process: programs that run at once
    preload: tuple[str, ...] = DEFAULT_PRELOAD  # modules each worker imports once

    def __post_init__(self) -> None:
        object.__setattr__(self, "preload", tuple(self.preload))

    def validate(self, prefix: str = "env.kwargs.sandbox") -> SandboxSettings:
        def require(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                value = getattr(self, name)
                raise SandboxError(f"{prefix}.{name} = {value!r}: expected {allowed}")

        require(self.isolation in ISOLATIONS, "isolation", f"one of {', '.join(ISOLATIONS)}")
        for name in ("wall_s", "cpu_s"):
            value = getattr(self, name)
            require(_is_number(value) and 0 < value <= 3600, name, "seconds in (0, 3600]")
        for name, lowest in (
            ("memory_mb", 64),
            ("file_mb", 1),
            ("tmp_mb", 1),
            ("processes", 1),
            ("open_files", 8),
            ("output_bytes", 64),
            ("workers", 1),
        ):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= lowest,
                name,
                f"an integer >= {lowest}",
            )
        require(all(isinstance(m, str) for m in self.preload), "preload", "module names")
        return self

    @classmethod
    def from_config(
        cls,
        value: Mapping[str, Any] | str | None,
        prefix: str = "env.kwargs.sandbox",
        defaults: Mapping[str, Any] | None = None,
    ) -> SandboxSettings:
        """Settings from a config's mapping, or an isolation name alone (`sandbox: none`);
        `defaults` (a task's own, e.g. its time limit) fill what the mapping leaves out."""
        defaults = dict(defaults or {})
        if value is None:
            return cls(**defaults).validate(prefix)
        if isinstance(value, str):
            return cls(**defaults, isolation=value).validate(prefix)
        if not isinstance(value, Mapping):
            raise SandboxError(
                f"{prefix} = {value!r}: expected an isolation name or a mapping of "
                f"{', '.join(f.name for f in dataclasses.fields(cls))}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise SandboxError(
                f"{prefix}.{unknown[0]}: no such setting; settings: {', '.join(sorted(names))}"
            )
        return cls(**(defaults | dict(value))).validate(prefix)

    def limits(self) -> dict[str, Any]:
        """The per-program limits as the worker reads them."""
        return {
            "wall_s": float(self.wall_s),
            "cpu_s": float(self.cpu_s),
            "memory_bytes": self.memory_mb << 20,
            "file_bytes": self.file_mb << 20,
            "processes": self.processes,
            "open_files": self.open_files,
            "output_bytes": self.output_bytes,
        }


@dataclasses.dataclass(frozen=True)
class SandboxContents:
    """What a sandbox holds besides the system and Python: read-only paths (a user's tool's
    module or package), folders put first on `sys.path`, modules its worker imports once, and
    files it loads once as modules under a name (`{"agentenv_tools": ".../tools.py"}`)."""

    read_only: tuple[str, ...] = ()
    sys_path: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    preload_files: tuple[tuple[str, str], ...] = ()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """How one program ended: its output (capped), exit status and what stopped it."""

    stdout: str
    stderr: str
    exit_code: int | None  # None: ended by a signal
    signal: int | None
    timed_out: bool  # killed at the wall-clock limit
    output_exceeded: bool  # killed when its output passed the cap
    wall_s: float
    cpu_s: float
    left_behind: int = 0  # processes it left running, killed after it
    value: dict[str, Any] | None = None  # a function call's outcome
    sandbox_lost: bool = False  # the sandbox itself ended (the program killed its worker)

    @property
    def ok(self) -> bool:
        return (
            self.exit_code == 0
            and not self.timed_out
            and not self.output_exceeded
            and not self.sandbox_lost
        )

    def failure(self, settings: SandboxSettings) -> str | None:
        """Why the program failed, in one line (None: it succeeded)."""
        if self.sandbox_lost:
            return "the sandbox stopped while the program ran (it killed its own sandbox)"
        if self.timed_out:
            return f"killed at the wall-clock limit of {settings.wall_s:g} s"
        if self.output_exceeded:
            return f"killed when its output passed {settings.output_bytes:,} bytes"
        # SIGXCPU at the soft limit (the kernel's tick may count a little under it), SIGKILL
        # at the hard limit a second later.
        if self.signal == signal.SIGXCPU or (
            self.signal == signal.SIGKILL and self.cpu_s >= settings.cpu_s
        ):
            return f"killed at the CPU-time limit of {settings.cpu_s:g} s"
        if self.signal == signal.SIGXFSZ:
            return f"killed when a file passed {settings.file_mb} MB"
        if "MemoryError" in self.stderr:
            return f"ran out of memory (limit {settings.memory_mb} MB)"
        if self.signal is not None:
            return f"killed by {signal.Signals(self.signal).name}"
        if self.exit_code != 0:
            last = self.stderr.strip().splitlines()[-1:] or ["no error output"]
            return f"exited with status {self.exit_code}: {last[0][:200]}"
        return None


def _lost(wall_s: float, why: str = "") -> SandboxResult:
    return SandboxResult("", why, None, None, False, False, wall_s, 0.0, sandbox_lost=True)


class SandboxWorker:
    """One sandbox with its warm worker (see the module). Not thread-safe: a pool hands each
    worker to one caller at a time."""

    def __init__(
        self,
        isolation: str,
        settings: SandboxSettings,
        slot: int = 0,
        contents: SandboxContents = SandboxContents(),
    ):
        self.isolation = isolation
        self.settings = settings
        as_root = os.geteuid() == 0
        self.child_uid = child_uid(slot) if as_root and isolation != "none" else None
        self._host_folder = None
        if isolation == "bubblewrap":
            workdir = SANDBOX_TMP
        else:
            self._host_folder = tempfile.mkdtemp(prefix="agentenv-sandbox-")
            workdir = self._host_folder
        worker_settings = json.dumps(
            {
                "workdir": workdir,
                "child_uid": self.child_uid,
                "environment": _ENVIRONMENT,
                "preload": [*settings.preload, *contents.preload],
                "preload_files": dict(contents.preload_files),
                "sys_path": list(contents.sys_path),
            }
        )
        if isolation == "bubblewrap":
            argv = bubblewrap_command(
                worker_settings,
                # Only the paths themselves: a sys.path folder (a project's root, say) is
                # there as the empty folder above them, never with the rest of its files.
                list(contents.read_only),
                settings.tmp_mb << 20,
                as_root,
            )
        elif isolation == "unshare":
            argv = unshare_command(worker_settings, as_root)
        else:
            argv = plain_command(worker_settings)
        self._errors = tempfile.TemporaryFile()
        started = time.monotonic()
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            env=_ENVIRONMENT,
            start_new_session=True,
        )
        self._buffer = b""
        ready = self._read_reply(started + _START_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            why = self._start_failure()
            self.close()
            raise SandboxError(why)

    def _start_failure(self) -> str:
        self._kill()
        lines = self._worker_errors().strip().splitlines()
        code = self._process.returncode
        return f"its worker exited ({code}) before it was ready: {(lines or ['no output'])[-1]}"

    def _read_reply(self, deadline: float) -> dict[str, Any] | None:
        """The worker's next JSON line, or None if it ends or `deadline` passes first."""
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def run(self, request: Mapping[str, Any]) -> SandboxResult:
        """Run one request (`kind`: source, command or call) under `settings`' limits."""
        request = {"limits": self.settings.limits(), **request}
        started = time.monotonic()
        try:
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill()
            return _lost(0.0, self._worker_errors())
        reply = self._read_reply(started + request["limits"]["wall_s"] + _REPLY_GRACE_S)
        if reply is None:
            # The worker did not answer in time (or ended): end the sandbox and everything in
            # it; the pool starts a fresh one.
            timed_out = self.alive
            self._kill()
            wall_s = time.monotonic() - started
            if timed_out:
                return SandboxResult("", "", None, signal.SIGKILL, True, False, wall_s, 0.0)
            return _lost(wall_s, self._worker_errors())
        return SandboxResult(**reply)

    def _worker_errors(self) -> str:
        """What the worker (or bubblewrap) wrote to its stderr: why a sandbox ended."""
        self._errors.seek(0)
        return self._errors.read()[-4000:].decode("utf-8", "replace")

    def _kill(self) -> None:
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._process.kill()
        self._process.wait()

    def close(self) -> None:
        """End the sandbox: the worker, anything left in it, its private folder."""
        for stream in (self._process.stdin, self._process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._kill()
        self._errors.close()
        if self._host_folder is not None:
            shutil.rmtree(self._host_folder, ignore_errors=True)


class SandboxPool:
    """`settings.workers` warm sandboxes of the best isolation available (see the module).
    Thread-safe: each call takes an idle worker, waiting for one when all are busy."""

    def __init__(self, settings: SandboxSettings, contents: SandboxContents = SandboxContents()):
        self.settings = settings.validate()
        self._contents = contents
        # NOTE: every sandbox is started from these threads, which live as long as the pool.
        # bubblewrap's --die-with-parent ends a sandbox when the *thread* that started it ends,
        # so a sandbox started (or restarted) from a short-lived thread, a map's or a vector
        # step's, would be killed with it.
        self._spawner = concurrent.futures.ThreadPoolExecutor(
            min(settings.workers, 8), thread_name_prefix="sandbox-start"
        )
        try:
            self.isolation, first = self._spawner.submit(self._first_worker).result()
        except BaseException:
            self._spawner.shutdown()
            raise
        self.description = DESCRIPTIONS[self.isolation]
        self._idle: queue.Queue[SandboxWorker | None] = queue.Queue()
        self._idle.put(first)
        self._lock = threading.Lock()
        self._workers = [first]
        self._closed = False
        for worker in self._spawner.map(self._start, range(1, settings.workers)):
            self._workers.append(worker)
            self._idle.put(worker)
        self.restarts = 0

    def _start(self, slot: int) -> SandboxWorker:
        return SandboxWorker(self.isolation, self.settings, slot, self._contents)

    def _first_worker(self) -> tuple[str, SandboxWorker]:
        reasons = []
        for isolation in isolation_order(self.settings.isolation):
            why = available(isolation)
            if why is None:
                try:
                    worker = SandboxWorker(isolation, self.settings, 0, self._contents)
                    probe = worker.run({"kind": "source", "source": "print(6 * 7)"})
                    if probe.ok and probe.stdout.strip() == "42":
                        return isolation, worker
                    worker.close()
                    why = f"a test program failed: {probe.failure(self.settings)}"
                except SandboxError as err:
                    why = str(err)
            reasons.append(f"{isolation}: {why}")
        raise SandboxError(
            f"env.kwargs.sandbox.isolation = {self.settings.isolation!r}: no isolation works "
            f"here ({'; '.join(reasons)}). Install bubblewrap (Debian/Ubuntu: apt install "
            "bubblewrap), or set env.kwargs.sandbox.isolation: none to run programs without "
            "isolation (resource limits only)"
        )

    def run(self, request: Mapping[str, Any]) -> SandboxResult:
        """Run one request on an idle worker (waiting for one if all are busy)."""
        worker = self._idle.get()
        if worker is None or self._closed:
            self._idle.put(None)
            raise SandboxError("the sandbox pool is closed")
        try:
            if not worker.alive:
                worker = self._replace(worker)
            result = worker.run(request)
            if not worker.alive:
                worker = self._replace(worker)
            return result
        finally:
            self._idle.put(worker)

    def _replace(self, worker: SandboxWorker) -> SandboxWorker:
        worker.close()
        slot = self._workers.index(worker)
        fresh = self._spawner.submit(self._start, slot).result()
        with self._lock:
            self._workers[slot] = fresh
            self.restarts += 1
        return fresh

    def map(self, requests: Sequence[Mapping[str, Any]]) -> list[SandboxResult]:
        """Each request's result, up to `settings.workers` running at once."""
        if len(requests) <= 1:
            return [self.run(r) for r in requests]
        with concurrent.futures.ThreadPoolExecutor(
            min(len(requests), self.settings.workers)
        ) as running:
            return list(running.map(self.run, requests))

    def run_source(
        self, source: str, stdin: str = "", history: Sequence[str] = ()
    ) -> SandboxResult:
        """Run Python `source` as `__main__` (after `history`'s cells, their output discarded)."""
        return self.run(
            {"kind": "source", "source": source, "stdin": stdin, "history": list(history)}
        )

    def run_command(self, argv: Sequence[str], stdin: str = "") -> SandboxResult:
        """Run a command (`argv[0]` found on the sandbox's PATH)."""
        return self.run({"kind": "command", "argv": list(argv), "stdin": stdin})

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
        for worker in workers:
            worker.close()
        self._spawner.shutdown()
        self._idle.put(None)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: dict[tuple, SandboxPool] = {}
_shared_lock = threading.Lock()


def shared_pool(
    settings: SandboxSettings, contents: SandboxContents = SandboxContents()
) -> SandboxPool:
    """The process's pool for these settings, started (and its isolation reported on stderr)
    at the first call; every task of an env rank with the same settings shares it, and it
    closes when the process exits."""
    key = (settings, contents)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None:
            pool = SandboxPool(settings, contents)
            _shared[key] = pool
            if len(_shared) == 1:
                atexit.register(close_shared_pools)
            print(
                f"agentenv: sandbox {pool.description}; {settings.workers} warm workers, "
                f"{settings.wall_s:g} s and {settings.memory_mb} MB per program",
                file=sys.stderr,
                flush=True,
            )
        return pool


def close_shared_pools() -> None:
    """End every shared pool of this process (at exit, and between tests)."""
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
    for pool in pools:
        pool.close()
