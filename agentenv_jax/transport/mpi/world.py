"""MPI start-up and the waiting every MPI channel shares: `MPIWorld`, failed-rank notices and
the polled back-off wait.

NOTE: MPICH's blocking waits spin on a core for as long as they last. With several ranks per core
that steals time from env stepping, so every wait here polls `Test` instead: first without pausing
for `SPIN_S` (a message that arrives within it is taken microseconds later, as a blocking wait
would take it), then with sleeps backing off from 20 us to 250 us, so that an idle rank yields its
core and a round trip gains at most a quarter millisecond.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from agentenv_jax.transport.base import TransportError
from agentenv_jax.transport.launcher import detect_launcher, world_mismatch
from agentenv_jax.transport.messages import TAG_FINAL

# How long a wait polls before its first sleep. Here a 20 us sleep lasts ~40 us with the timer
# slack cut (~95 us without; even `sleep(0)` ~15 us): a message that comes within about one
# sleep's cost, such as the next segment or credit of a tight round trip, should not pay for it.
# Spinning for about what a sleep costs keeps any wait within about twice the cost of the better
# of spinning and sleeping, known only in hindsight (the spin-then-block bound).
SPIN_S = 50e-6

_PR_SET_TIMERSLACK = 29  # from <linux/prctl.h>


@functools.cache
def _tighten_timer_slack() -> None:
    """Let the calling thread's short sleeps end on time (Linux only; once per process, from
    the thread that polls MPI).

    NOTE: Linux lets a sleep overrun by the thread's timer slack (50 us by default) to batch
    wake-ups: the back-off's first 20 us sleep lasted ~95 us here, ~40 us with a slack of 1 us.
    A platform without `prctl` keeps its default.
    """
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Backoff:
    """The pauses between the polls of one wait: none for its first `spin_s`, then sleeps that
    double from `first_s` up to `max_s`, and past that up to `late_share` of the time the wait
    has lasted (at most `longest_s`). `reset` (a message came) makes the next wait spin first.

    The growing cap is for the long waits: an env rank waiting seconds for the learner's first
    compile would otherwise wake 4000 times a second (~0.2 of a core, measured), and a job of
    31 such ranks on 2 cores spent most of the learner's CPU on their polls. A wake-up that
    late adds at most `late_share` to a wait's length.
    """

    def __init__(
        self,
        spin_s: float = SPIN_S,
        first_s: float = 20e-6,
        max_s: float = 250e-6,
        late_share: float = 0.01,
        longest_s: float = 0.02,
    ):
        _tighten_timer_slack()
        self._spin, self._first, self._max = spin_s, first_s, max_s
        self._late_share, self._longest = late_share, longest_s
        self._next = first_s
        self._began: float | None = None  # set by the first pause of a wait

    def pause(self) -> None:
        now = time.perf_counter()
        if self._began is None:
            self._began = now
        if now < self._began + self._spin:
            return
        time.sleep(self._next)
        cap = min(max(self._max, (now - self._began) * self._late_share), self._longest)
        self._next = min(self._next * 2, cap)

    def reset(self) -> None:
        self._next = self._first
        self._began = None


def process_gone(pid: int) -> bool:
    """Whether process `pid` of this host has exited (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class FailedRankWatch:
    """Names a rank of the job that has died, for the ranks that wait on it.

    MPICH's mpiexec by default kills the whole job the moment one process dies and names only
    its PID. Run with `-disable-auto-cleanup`, it keeps the survivors alive and sends them
    SIGUSR1 instead (whose default action would kill them too). On that notice every wait checks
    which ranks of this host have gone and names them at once; a rank that died on another host
    is named by the rank waiting on it when run.transport_timeout_s runs out.
    """

    def __init__(self) -> None:
        self.notice_received = False
        self._local: dict[int, int] = {}  # rank -> pid, for the ranks on this host

    def install(self, processes: dict[int, dict[str, Any]]) -> None:
        host = socket.gethostname()
        self._local = {r: int(p["pid"]) for r, p in processes.items() if p["host"] == host}
        signal.signal(signal.SIGUSR1, self._on_notice)

    def _on_notice(self, signum: int, frame: Any) -> None:
        self.notice_received = True

    def check(self) -> None:
        """Raise `TransportError` naming the ranks of this host that have died, once the
        launcher has said that a process of the job failed."""
        if not self.notice_received:
            return
        dead = [rank for rank, pid in sorted(self._local.items()) if process_gone(pid)]
        if dead:
            raise TransportError(
                ", ".join(f"rank {rank} (pid {self._local[rank]})" for rank in dead)
                + " died; stopping the job"
            )

    def describe(self) -> str:
        """A note for timeout messages."""
        if self.notice_received:
            return "; the launcher reported that a process of the job failed"
        return ""


FAILED_RANKS = FailedRankWatch()


def wait_until(done: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    """Poll `done` until it is true (see `Backoff`); raise `TransportError` naming `what()` after
    `timeout_s`, or at once when a rank of the job has died."""
    if done():
        return  # the common case in a busy run: no clock, no back-off
    deadline = time.monotonic() + timeout_s
    backoff = Backoff()
    while not done():
        FAILED_RANKS.check()
        if time.monotonic() > deadline:
            raise TransportError(
                f"timed out after {timeout_s:.0f} s waiting for {what()}" + FAILED_RANKS.describe()
            )
        backoff.pause()


def mpi_library() -> dict[str, str]:
    """The MPI library this process runs on: `name` (its version line, e.g. "MPICH Version:
    5.0.2" or "Open MPI v5.0.11"), `path` (the shared library file mpi4py loaded; "" where the
    process's memory map cannot be read) and `mpi4py` (its version)."""
    import mpi4py

    name = " ".join(MPI.Get_library_version().splitlines()[0].split())
    name = name.split(",")[0]  # Open MPI appends its package and release date
    path = ""
    try:
        with open("/proc/self/maps") as maps:
            found = [line.split()[-1] for line in maps if "libmpi" in line.rsplit("/", 1)[-1]]
        path = found[0] if found else ""
    except OSError:
        pass
    return {"name": name, "path": path, "mpi4py": mpi4py.__version__}


class MPIWorld:
    """COMM_WORLD as the launcher made it: size, rank, and the pickled start-up collectives.
    `LaunchError` when it is not the world the launcher started (a library that missed the
    launcher's PMI sees every rank alone)."""

    def __init__(self) -> None:
        self.comm = MPI.COMM_WORLD
        self.size = self.comm.Get_size()
        self.rank = self.comm.Get_rank()
        self.param_comm: MPI.Comm | None = None  # `split_param_groups`
        launcher = detect_launcher()
        if launcher.size is not None and launcher.size != self.size:
            library = mpi_library()
            raise world_mismatch(launcher, self.size, f"{library['name']}, {library['path']}")

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's `value` (a start-up or error-agreement collective; pickled).

        Ranks reach it at very different times (the learner compiles for seconds); a
        non-blocking barrier polled with back-off keeps the early ones from spinning a core.
        """
        barrier = self.comm.Ibarrier()
        wait_until(barrier.Test, 3600.0, lambda: "every rank to finish starting up")
        return self.comm.allgather(value)

    def broadcast_from_lead(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank (a start-up collective; pickled)."""
        return self.comm.bcast(value, root=0)

    def split_param_groups(self, learner_rank: int, broadcast: bool = True) -> None:
        """Make `param_comm`: the communicator of this rank's learner (`learner_rank`, its rank
        0) and that learner's env ranks, over which parameters are broadcast; kept only where
        its group `broadcast`s (every member decides alike). Collective: every rank of the
        world calls it, at the same point of start-up."""
        key = 0 if learner_rank == self.rank else 1 + self.rank
        group = self.comm.Split(color=learner_rank, key=key)
        if broadcast:
            self.param_comm = group
        else:
            group.Free()

    def watch_for_failed_ranks(self, processes: dict[int, dict[str, Any]]) -> None:
        """From now on, waits name a rank whose process died (see `FailedRankWatch`);
        `processes` maps every rank to its `pid` and `host`."""
        FAILED_RANKS.install(processes)

    def abort(self, exit_code: int) -> None:
        """Kill every rank of the job now (used after an unexpected error on one rank)."""
        # NOTE: what this rank just printed travels through the launcher's proxy, which the
        # abort tears down; on a loaded machine the message was sometimes lost. A moment's
        # grace lets the proxy forward it first.
        time.sleep(0.5)
        self.comm.Abort(exit_code)


def receive_final_reports(
    comm: MPI.Comm, env_ranks: list[int], timeout_s: float
) -> list[dict[str, Any]]:
    """Every env rank's end-of-run report (pickled control messages), in env-rank order."""
    reports = []
    for rank in env_ranks:
        wait_until(
            lambda r=rank: comm.Iprobe(source=r, tag=TAG_FINAL),
            timeout_s,
            lambda r=rank: f"the final report of env rank {r}",
        )
        reports.append(comm.recv(source=rank, tag=TAG_FINAL))
    return reports


def cancel_receives(requests: list[MPI.Request | None]) -> None:
    """Withdraw posted receives when a start is called off, so that MPI finalizes without
    requests still pending (MPICH would say so, once per rank). One that already matched a
    message cannot be cancelled and simply completes."""
    for request in requests:
        if request is not None:
            request.Cancel()
            request.Wait()


def finish_sends(requests: list[MPI.Request]) -> None:
    """Give the last control and parameter sends a moment to complete at shutdown."""
    try:
        wait_until(
            lambda: MPI.Request.Testall(requests),
            5.0,
            lambda: "the last control and parameter sends",
        )
    except TransportError:
        pass  # an env rank that stopped never takes a stale message; nothing is lost
