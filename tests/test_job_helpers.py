"""The test helpers that start jobs (conftest's `run_command` and `start_job`) leave no process
group running: not at run_command's timeout, which comes before the test's pytest-timeout, not
when an exception ends its wait, not when a test fails or times out before waiting on a job."""

from __future__ import annotations

import signal
import sys
import threading
import time
import uuid

import pytest

from conftest import REPO, processes_with, run_command


def _sleeper() -> str:
    """A `sleep` duration no other process has on its command line: the marker of one job."""
    return f"{1000 + uuid.uuid4().int % 10**6}.5"


def _group_of_sleeps(seconds: str, started: str) -> list[str]:
    """A shell whose two `sleep`s (one in the background) are its process group; it writes
    `started` once both run."""
    return ["sh", "-c", f"sleep {seconds} & echo >{started}; sleep {seconds}; wait"]


@pytest.mark.slow
def test_run_command_kills_the_group_at_its_timeout(tmp_path):
    seconds, started = _sleeper(), tmp_path / "started"
    begun = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"did not finish within 1\.0 s\n"):
        run_command(_group_of_sleeps(seconds, started), timeout=1, cwd=REPO)
    assert started.exists() and time.monotonic() - begun < 10
    assert processes_with(f"sleep {seconds}") == []


class _Interrupt(Exception):
    """What a signal handler raises in the middle of run_command's wait, as pytest-timeout's
    does (or Ctrl-C's KeyboardInterrupt)."""


@pytest.mark.slow
def test_run_command_kills_the_group_when_an_exception_ends_its_wait(tmp_path):
    seconds, started = _sleeper(), tmp_path / "started"

    def interrupt(signum, frame):
        raise _Interrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    # Signals reach Python's handlers on the main thread, which waits in run_command.
    timer = threading.Timer(
        1.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1)
    )
    try:
        timer.start()
        with pytest.raises(_Interrupt):
            run_command(_group_of_sleeps(seconds, started), timeout=60, cwd=REPO)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert started.exists()
    assert processes_with(f"sleep {seconds}") == []


@pytest.mark.slow
@pytest.mark.timeout(8)
def test_run_command_gives_up_before_the_tests_own_timeout(tmp_path):
    """run_command(timeout=600) in a test whose pytest-timeout is 8 s waits 8 s less a margin
    (0.8 s), then fails the test itself, saying why, and kills the group; pytest-timeout would
    have failed it with the group still running."""
    seconds, started = _sleeper(), tmp_path / "started"
    begun = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        run_command(_group_of_sleeps(seconds, started), timeout=600, cwd=REPO)
    assert time.monotonic() - begun < 7.5
    assert "(what the test's pytest-timeout of 8 s leaves)" in str(failure.value)
    assert processes_with(f"sleep {seconds}") == []


# Tests that start a job and fail before waiting for it: by an assertion, and by
# pytest-timeout (its default method raises in the test, as SIGALRM's handler).
_ABANDONING_TESTS = """
import pytest

from conftest import start_job

pytestmark = pytest.mark.slow  # they start processes (conftest refuses that unmarked)


def test_fails_before_waiting():
    start_job(["sleep", "{first}"])
    assert False


@pytest.mark.timeout(2, method="signal")
def test_times_out_while_waiting():
    start_job(["sleep", "{second}"]).wait()
"""


@pytest.mark.slow
def test_jobs_a_test_never_waited_for_end_with_it(tmp_path):
    """A pytest session of two such tests, with this conftest as its plugin: both fail, and
    neither `sleep` outlives its test (each is in a session of its own, which pytest's exit
    would not end)."""
    first, second = _sleeper(), _sleeper()
    (tmp_path / "test_abandoning.py").write_text(
        _ABANDONING_TESTS.format(first=first, second=second)
    )
    proc = run_command(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "."],
        timeout=120,
        cwd=tmp_path,
        extra_env={"PYTHONPATH": str(REPO / "tests")},
    )
    assert proc.returncode == 1 and "2 failed" in proc.stdout, proc.stdout + proc.stderr
    assert "Timeout (>2.0s) from pytest-timeout" in proc.stdout, proc.stdout
    assert processes_with(f"sleep {first}") == [] and processes_with(f"sleep {second}") == []
