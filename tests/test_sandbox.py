"""The sandbox against hostile programs: each is stopped by its own limit with one failure,
the host process lives on, nothing the program started is left running (read from /proc), and
nothing outside the sandbox is read or written. Bubblewrap is the isolation CI has (`.ci/run`
installs it); a few checks also run under `unshare` and with no isolation."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentenv_jax.envs.sandbox import SandboxError, SandboxPool, SandboxSettings
from agentenv_jax.envs.sandbox.isolation import child_uid

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the sandbox isolates with Linux namespaces"
    ),
]

# The CPU-time limit above the wall clock's: a busy loop is then stopped by the wall clock
# alone (with the two equal, an idle machine gives it its CPU second first, SIGXCPU).
LIMITS = {"wall_s": 2.0, "cpu_s": 4.0, "memory_mb": 512, "file_mb": 4, "processes": 16}
SECRET = "agentenv-test-secret-7f3a"


def require_bubblewrap() -> None:
    if shutil.which("bwrap") is None:
        message = "bwrap is not installed (apt install bubblewrap; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module")
def pool():
    require_bubblewrap()
    # A secret in the host's environment, which no program may see.
    os.environ["AGENTENV_TEST_SECRET"] = SECRET
    try:
        with SandboxPool(SandboxSettings(isolation="bubblewrap", workers=2, **LIMITS)) as pool:
            yield pool
    finally:
        del os.environ["AGENTENV_TEST_SECRET"]


def sandbox_processes(pool: SandboxPool) -> list[int]:
    """Host pids of processes running as any of the pool's program user ids."""
    uids = {str(child_uid(slot)) for slot in range(pool.settings.workers)}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        if uid_line.split()[1] in uids:
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it, from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
    found = [pid]
    for candidate in found:
        found += [child for child, parent in parents.items() if parent == candidate]
    return found


def run(pool: SandboxPool, source: str):
    result = pool.run_source(textwrap.dedent(source))
    assert not sandbox_processes(pool), "a program's process outlived its call"
    return result


def test_a_program_runs_and_its_output_comes_back(pool):
    result = run(pool, "import sys; print(6 * 7); print('warn', file=sys.stderr)")
    assert result.ok and result.stdout == "42\n" and result.stderr == "warn\n"
    assert pool.isolation == "bubblewrap"
    assert "no network" in pool.description


def test_stdin_and_exit_status_and_traceback(pool):
    echoed = pool.run_source("import sys; print(sys.stdin.read()[::-1])", stdin="abc")
    assert echoed.stdout == "cba\n"
    failed = run(pool, "def f():\n    raise ValueError('no')\nf()")
    assert failed.exit_code == 1 and not failed.ok
    assert failed.stderr.splitlines()[-1] == "ValueError: no"
    assert "worker.py" not in failed.stderr  # the program's frames only
    assert failed.failure(pool.settings) == "exited with status 1: ValueError: no"
    exited = run(pool, "raise SystemExit(3)")
    assert exited.exit_code == 3
    # As Python exits: sys.exit() is status 0, sys.exit("why") prints it with status 1.
    assert run(pool, "import sys; print('done'); sys.exit()").ok
    said = run(pool, "import sys; sys.exit('no input')")
    assert (said.exit_code, said.stderr) == (1, "no input\n")


def test_an_infinite_loop_is_killed_at_the_wall_clock_limit(pool):
    result = run(pool, "while True:\n    pass")
    assert result.timed_out and not result.sandbox_lost
    assert result.wall_s >= LIMITS["wall_s"]
    assert result.failure(pool.settings) == "killed at the wall-clock limit of 2 s"


def test_a_busy_loop_is_killed_at_the_cpu_time_limit():
    require_bubblewrap()
    settings = SandboxSettings(isolation="bubblewrap", workers=1, wall_s=10, cpu_s=1)
    with SandboxPool(settings) as pool:
        result = pool.run_source("while True:\n    pass")
        assert result.signal == signal.SIGXCPU and not result.timed_out
        assert result.failure(settings) == "killed at the CPU-time limit of 1 s"


def test_a_loop_in_c_that_holds_the_gil_is_killed(pool):
    # One call into C that runs for a minute: no Python-level check could interrupt it.
    result = run(pool, "sum([[0] * 4000] * 4000, [])")
    assert result.timed_out or result.failure(pool.settings).startswith("killed at the CPU")
    assert not result.ok


def test_sleeping_past_the_limit(pool):
    result = run(pool, "import time; time.sleep(60)")
    assert result.timed_out and result.cpu_s < 1.0


def test_a_memory_bomb_runs_out_of_memory(pool):
    result = run(pool, "x = bytearray(8 << 30)")
    assert result.failure(pool.settings) == "ran out of memory (limit 512 MB)"
    formatted = run(pool, "'%999999999d' % 1")
    assert "MemoryError" in formatted.stderr


def test_a_fork_bomb_is_contained(pool):
    result = run(
        pool,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
    )
    assert not result.ok
    # The pool still serves programs afterwards.
    assert pool.run_source("print('after')").stdout == "after\n"


def test_a_gigabyte_of_output_is_cut_off(pool):
    result = run(pool, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert result.output_exceeded
    assert len(result.stdout) + len(result.stderr) <= pool.settings.output_bytes


def test_a_huge_file_is_stopped_at_the_file_size_limit(pool):
    result = run(
        pool,
        """
        with open('big', 'wb') as f:
            for _ in range(10 * 1024):
                f.write(bytes(1 << 20))
        """,
    )
    assert result.failure(pool.settings) == "killed when a file passed 4 MB"
    # Many files under the size limit fill the private /tmp, not the host's disk.
    many = run(
        pool,
        """
        for i in range(10 * 1024):
            with open(f'part{i}', 'wb') as f:
                f.write(bytes(2 << 20))
        """,
    )
    assert "No space left on device" in many.stderr
    # Each call starts with an empty folder.
    assert run(pool, "import os; print(os.listdir('.'))").stdout == "[]\n"


def test_files_outside_its_folder_cannot_be_read_or_written(pool, tmp_path):
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / "metrics.jsonl").write_text("private\n")
    for target in (run_folder / "metrics.jsonl", Path("/etc/shadow"), Path.home() / ".bashrc"):
        result = run(pool, f"print(open({str(target)!r}).read())")
        assert not result.ok and "private" not in result.stdout
        assert "FileNotFoundError" in result.stderr or "PermissionError" in result.stderr
    for target in (run_folder / "written", Path(sys.prefix) / "written", Path("/usr/written")):
        result = run(pool, f"open({str(target)!r}, 'w').write('x')")
        assert not result.ok and not target.exists()


def test_no_secret_reaches_the_environment(pool):
    assert os.environ["AGENTENV_TEST_SECRET"] == SECRET
    result = run(pool, "import os; print(dict(os.environ))")
    assert result.ok and SECRET not in result.stdout
    assert "AGENTENV_TEST_SECRET" not in result.stdout


def test_no_network_to_the_host(pool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        result = run(
            pool,
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)",
        )
        assert "ConnectionRefusedError" in result.stderr or "OSError" in result.stderr
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_a_program_cannot_kill_its_worker(pool):
    result = run(pool, "import os, signal; os.kill(os.getppid(), signal.SIGKILL)")
    assert "PermissionError" in result.stderr
    init = run(pool, "import os, signal; os.kill(1, signal.SIGKILL)")
    assert not init.ok
    assert pool.run_source("print('alive')").stdout == "alive\n"


def test_a_double_forked_setsid_grandchild_does_not_survive(pool):
    result = run(
        pool,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        time.sleep(0.2)
        print('parent done')
        """,
    )
    assert result.ok and result.stdout == "parent done\n"
    assert result.left_behind >= 1  # the grandchild, killed after the call by the sweep


def test_a_worker_that_stops_answering_is_ended_from_outside(tmp_path):
    require_bubblewrap()
    settings = SandboxSettings(isolation="bubblewrap", workers=1, wall_s=0.5, cpu_s=0.5)
    with SandboxPool(settings) as pool:
        worker = pool._workers[0]
        # Stop bwrap and everything under it: the worker can no longer answer.
        for pid in descendants(worker._process.pid):
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        result = pool.run_source("print(1)")
        assert result.timed_out and not worker.alive
        assert time.monotonic() - started >= 0.5
        # The pool starts a fresh sandbox for the next call.
        assert pool.run_source("print(2)").stdout == "2\n" and pool.restarts == 1


def test_calls_run_concurrently_up_to_the_worker_count(pool):
    requests = [{"kind": "source", "source": "import time; time.sleep(0.5)"}] * 2
    results = pool.map(requests)
    assert all(r.ok for r in results)
    # Recorded by each worker: both ran their whole half second (no timing of the batch).
    assert all(r.wall_s >= 0.5 for r in results)


def test_commands_run_from_the_sandbox_path(pool):
    result = pool.run_command(["sh", "-c", "echo $HOME; id -u"])
    assert result.ok
    home, uid = result.stdout.split()
    assert home == "/tmp" and int(uid) >= 2**31
    missing = pool.run_command(["no-such-program"])
    assert missing.exit_code == 127 and "FileNotFoundError" in missing.stderr


@pytest.mark.parametrize("isolation", ["unshare", "none"])
def test_other_isolations_run_and_limit_programs(isolation):
    if shutil.which("unshare") is None and isolation == "unshare":
        pytest.skip("unshare is not installed")
    settings = SandboxSettings(isolation=isolation, workers=1, wall_s=1, cpu_s=2)
    with SandboxPool(settings) as pool:
        assert pool.isolation == isolation
        assert pool.run_source("print(6 * 7)").stdout == "42\n"
        assert pool.run_source("while True:\n    pass").timed_out


def test_settings_are_checked():
    with pytest.raises(SandboxError, match=r"env.kwargs.sandbox.isolation = 'docker': expected"):
        SandboxSettings.from_config({"isolation": "docker"})
    with pytest.raises(SandboxError, match=r"env.kwargs.sandbox.wall_s = 0: expected seconds"):
        SandboxSettings.from_config({"wall_s": 0})
    with pytest.raises(SandboxError, match=r"env.kwargs.sandbox.wal_s: no such setting"):
        SandboxSettings.from_config({"wal_s": 1})
    with pytest.raises(SandboxError, match=r"env.kwargs.sandbox.workers = True"):
        SandboxSettings.from_config({"workers": True})
    assert SandboxSettings.from_config("none").isolation == "none"


def test_no_isolation_found_is_refused_with_the_way_out(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError) as refused:
        SandboxPool(SandboxSettings(isolation="auto", workers=1))
    message = str(refused.value)
    assert "bubblewrap: bwrap is not installed" in message
    assert "unshare: unshare (util-linux) is not installed" in message
    assert "isolation: none" in message


def test_a_closed_pool_refuses_calls_and_leaves_nothing():
    require_bubblewrap()
    pool = SandboxPool(SandboxSettings(isolation="bubblewrap", workers=2))
    pids = [worker._process.pid for worker in pool._workers]
    pool.close()
    with pytest.raises(SandboxError, match="the sandbox pool is closed"):
        pool.run_source("print(1)")
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
