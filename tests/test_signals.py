"""Stop signals, a silent rank and the time-based checkpoint cadence, on real runs.

SIGTERM, SIGINT, SIGHUP and SIGUSR2 ask for a graceful stop (final checkpoint, exit 0); two of
them within a second are one request, a later second one interrupts at once. What each launcher
does with a stop signal sent to it is measured on plain processes. A rank that stops answering is
named by the learner once `run.transport_timeout_s` runs out. `checkpoint.every_minutes` saves
on a clock.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

from agentenv_jax.checkpoint import CheckpointStore

from conftest import (
    EXPERIMENTS,
    REPO,
    agentenv_command,
    end_rank,
    is_open_mpi,
    mpi_launch,
    mpiexec_path,
    read_events,
    restorable_checkpoint,
    run_command,
    settings,
    signal_rank_and_wait,
    start_job,
    wait_for_updates,
)

CARTPOLE = str(EXPERIMENTS / "cartpole_ppo.yaml")


class SlowCartPole(gym.Wrapper):
    """CartPole whose steps take `delay_s` once `fast_steps` steps are done: the first segment
    (and so the first update) comes quickly, every later one takes long enough that a stop
    request is still being honoured when the test acts again."""

    def __init__(self, delay_s: float, fast_steps: int):
        super().__init__(gym.make("CartPole-v1"))
        self._delay_s = delay_s
        self._fast_steps_left = fast_steps

    def step(self, action):
        self._fast_steps_left -= 1
        if self._fast_steps_left < 0:
            time.sleep(self._delay_s)
        return self.env.step(action)


def _linger(seconds: float) -> None:
    time.sleep(seconds)


def slow_cartpole(delay_s: float = 0.01, fast_steps: int = 32, exit_delay_s: float = 0.0):
    """`env.id: test_signals:slow_cartpole` (the tests' folder is on the jobs' PYTHONPATH).
    `exit_delay_s` keeps the process alive that long after the run has returned, as a slow
    teardown would (one exit hook, however many envs are made)."""
    if exit_delay_s:
        atexit.unregister(_linger)
        atexit.register(_linger, exit_delay_s)
    return SlowCartPole(delay_s, fast_steps)


def _kill_group(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _one_process_run(tmp_path: Path, name: str, *overrides: str):
    """A CartPole PPO run in this machine's one process (no launcher), in its own group."""
    return start_job(
        [
            *agentenv_command("train", CARTPOLE),
            *settings(f"run.run_dir={tmp_path}", f"run.name={name}", "run.progress=false"),
            *settings(*overrides),
        ]
    )


def _assert_stopped_gracefully(run_dir: Path, returncode: int, stderr: str) -> None:
    """Exit 0, an interrupted summary, one `interrupted` event, and a final checkpoint of the
    update the run stopped at."""
    assert returncode == 0, stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["accounting"]["reconciles"]
    stopped_at = summary["updates"]
    events = read_events(run_dir)
    assert [e["update"] for e in events if e["event"] == "interrupted"] == [stopped_at]
    assert [e for e in events if e["event"] == "checkpoint"][-1]["update"] == stopped_at
    store = CheckpointStore(run_dir, keep=3)
    assert store.latest_step() == stopped_at
    store.close()


def _stop_checkpointed(events: list[dict]) -> bool:
    """Whether a run's graceful stop has been recorded and its checkpoint written."""
    stops = [e["update"] for e in events if e["event"] == "interrupted"]
    saved = [e["update"] for e in events if e["event"] == "checkpoint"]
    return bool(stops and saved) and saved[-1] == stops[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig", [signal.SIGHUP, signal.SIGINT, signal.SIGUSR2], ids=["SIGHUP", "SIGINT", "SIGUSR2"]
)
def test_hangup_and_ctrl_c_stop_with_a_final_checkpoint(tmp_path, sig):
    """A closed terminal (SIGHUP), Ctrl-C (SIGINT) and SIGUSR2 (the stop request to send
    through Open MPI's mpirun) stop a run like preemption does."""
    run_dir = tmp_path / "stop"
    proc = _one_process_run(tmp_path, "stop")
    try:
        wait_for_updates(proc, run_dir, 3, timeout=120)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        _kill_group(proc)
    _assert_stopped_gracefully(run_dir, proc.returncode, stderr)


@pytest.mark.slow
def test_two_stop_signals_within_a_second_are_one_request(tmp_path):
    """Slurm signals a job step's processes directly as well as through their parent, so one
    preemption can arrive twice. The second copy lands while the first is still being honoured
    (a segment of slow steps is being finished) and must not turn it into an interruption."""
    run_dir = tmp_path / "twice"
    # 8 envs x 32 steps x 10 ms: finishing the segment under way takes up to 2.6 s.
    proc = _one_process_run(
        tmp_path, "twice", "env.id=test_signals:slow_cartpole", "env.kwargs={delay_s: 0.01}"
    )
    try:
        wait_for_updates(proc, run_dir, 1, timeout=120)
        time.sleep(0.5)  # into the slow segment, past the end of the first update
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        assert proc.poll() is None  # the second copy arrives during the graceful stop
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        _kill_group(proc)
    _assert_stopped_gracefully(run_dir, proc.returncode, stderr)


@pytest.mark.slow
def test_a_second_copy_after_the_final_checkpoint_is_still_the_same_request(tmp_path):
    """The same request's second copy can also arrive after the graceful stop has written its
    checkpoint, while the process is still exiting (here: for 5 s more). It is still within
    the window (`run.stop_signal_window_s`, widened here so that a loaded machine's slow stop
    cannot use it up), so it must not change the outcome."""
    run_dir = tmp_path / "late-copy"
    proc = _one_process_run(
        tmp_path,
        "late-copy",
        "env.id=test_signals:slow_cartpole",
        "env.kwargs={delay_s: 0.0, exit_delay_s: 5.0}",
        "checkpoint.every_updates=2",  # orbax's first save is slow; have it before the stop
        "run.stop_signal_window_s=60",
    )
    try:
        wait_for_updates(proc, run_dir, 3, timeout=120)
        proc.send_signal(signal.SIGTERM)
        first_at = time.monotonic()
        # The stop is recorded last, with the final checkpoint (unless a periodic one of that
        # update came just before); the process then still exits for 1.5 s.
        while not _stop_checkpointed(read_events(run_dir)):
            assert proc.poll() is None and time.monotonic() - first_at < 30
            time.sleep(0.01)
        time.sleep(0.05)
        assert proc.poll() is None  # still exiting
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        _kill_group(proc)
    _assert_stopped_gracefully(run_dir, proc.returncode, stderr)


@pytest.mark.slow
def test_the_handlers_given_back_still_take_a_late_copy_within_the_window(tmp_path):
    """Between the run's return and the process's exit (the CLI ignores stop signals only
    then), a copy of the honoured request is still the session's: within the window it is
    dropped, after it the handler the run found takes it, and keeps taking the next ones."""
    from types import SimpleNamespace

    from agentenv_jax.config.loading import load_config
    from agentenv_jax.learner.session import LearnerSession

    window_s = 2.0
    config = load_config(CARTPOLE, [f"run.stop_signal_window_s={window_s}"])
    taken = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: taken.append(signum))
    session = LearnerSession(SimpleNamespace(updates=0), config, tmp_path, resume=False)
    try:
        session.install_signal_handlers()
        signal.raise_signal(signal.SIGUSR2)
        first_at = time.monotonic()
        assert session.interrupted and taken == []
        session.restore_signal_handlers()
        signal.raise_signal(signal.SIGUSR2)  # the late copy
        assert time.monotonic() - first_at < window_s and taken == []
        time.sleep(window_s + 0.1)
        signal.raise_signal(signal.SIGUSR2)  # a new signal, for the handler before the run
        assert taken == [signal.SIGUSR2]
        signal.raise_signal(signal.SIGUSR2)  # which is back
        assert taken == [signal.SIGUSR2] * 2
    finally:
        signal.signal(signal.SIGUSR2, before)
        session.store.close()


@pytest.mark.slow
def test_a_later_second_stop_signal_interrupts_at_once(tmp_path):
    """Someone who signals again after a second does not want to wait for the graceful stop:
    the run ends at once (exit 130, like Ctrl-C), without the final checkpoint."""
    run_dir = tmp_path / "now"
    # 8 envs x 32 steps x 100 ms: the graceful stop would first finish a 25 s segment.
    proc = _one_process_run(
        tmp_path,
        "now",
        "env.id=test_signals:slow_cartpole",
        "env.kwargs={delay_s: 0.1}",
        "checkpoint.every_updates=1",
        "run.stop_signal_window_s=1.0",
    )
    try:
        wait_for_updates(proc, run_dir, 1, timeout=120)
        time.sleep(0.5)  # into the slow segment, past the end of the first update
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # past the window
        assert proc.poll() is None  # still finishing the segment: the stop is in progress
        proc.send_signal(signal.SIGTERM)
        second_at = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        ended_after = time.monotonic() - second_at
    finally:
        _kill_group(proc)
    assert proc.returncode == 130, stderr[-3000:]
    assert ended_after < 10, ended_after  # the graceful path had 20 s and more to go
    assert not (run_dir / "summary.json").exists()
    events = read_events(run_dir)
    interrupted = [e for e in events if e["event"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["at_once"] is True, interrupted
    # Only the periodic checkpoint of update 1: nothing was saved for the stop.
    assert [e["update"] for e in events if e["event"] == "checkpoint"] == [1]
    assert restorable_checkpoint(run_dir) == 1


@pytest.mark.slow
def test_a_silent_env_rank_is_named_after_the_transport_timeout(tmp_path):
    """An env rank that stops answering (SIGSTOP: alive, but silent, as a hung one is) is named
    by the learner once run.transport_timeout_s has passed, never by the other env rank (which
    waits on the learner twice as long); the job stops and the last periodic checkpoint
    restores."""
    run_dir = tmp_path / "silent"
    silent_rank = 2
    proc = start_job(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=silent",
                "checkpoint.every_updates=5",
                # Env ranks wait twice this for the first parameters, while the learner
                # compiles its update: keep that well above a loaded 2-core machine's compile.
                "run.transport_timeout_s=10",
                "run.progress=false",
            ),
        ]
    )
    ended = signal_rank_and_wait(proc, run_dir, silent_rank, 8, signal.SIGSTOP, timeout=60)
    end_rank(ended.pid)
    stderr, ended_after = ended.stderr, ended.ended_after
    assert proc.returncode != 0
    named = (
        "agentenv: error: rank 0: timed out after 10 s waiting for a segment from env "
        f"rank(s) {silent_rank} (run.transport_timeout_s)"
    )
    assert named in stderr, stderr[-3000:]
    assert "env rank waited" not in stderr  # the other env rank did not speak first
    # Not before the timeout has run out (the learner's wait began at most a round earlier),
    # and not long after.
    assert 9 < ended_after < 40, ended_after
    assert restorable_checkpoint(run_dir) >= 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, message",
    [
        ("cartpole_ppo.yaml", "env rank waited 16 s for parameters version"),
        ("pendulum_sac.yaml", "env rank heard nothing from the learner for 16 s"),
    ],
    ids=["ppo", "sac"],
)
def test_a_silent_learner_is_named_by_an_env_rank(tmp_path, experiment, message):
    """A learner that stops answering is noticed by the env ranks after twice
    run.transport_timeout_s (on-policy: waiting for parameters; replay: waiting for requests
    while the rate limiter holds them back), and the job stops."""
    run_dir = tmp_path / "silent"
    proc = start_job(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command("train", str(EXPERIMENTS / experiment)),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=silent",
                "run.transport_timeout_s=8",
                "run.progress=false",
            ),
            *(settings("algorithm.log_interval=10") if "sac" in experiment else []),
        ]
    )
    ended = signal_rank_and_wait(proc, run_dir, 0, 2, signal.SIGSTOP, timeout=60)
    end_rank(ended.pid)
    stderr, ended_after = ended.stderr, ended.ended_after
    assert proc.returncode != 0
    assert message in stderr and "the learner is silent" in stderr, stderr[-3000:]
    # The wait that ran out may have begun a round before the learner stopped.
    assert 10 < ended_after < 50, ended_after


@pytest.mark.slow
def test_every_minutes_checkpoints_on_a_clock(tmp_path):
    """`checkpoint.every_minutes` alone (no count) saves each time that long has passed since
    the last save; 0 turns it off, leaving only the final checkpoint."""
    budget = "run.total_env_steps=30000"
    timed = run_command(
        [
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=timed",
                "run.progress=false",
                budget,
                "checkpoint.every_updates=0",
                "checkpoint.every_minutes=0.005",  # 0.3 s
                "checkpoint.keep=100",
            ),
        ],
        timeout=180,
        cwd=REPO,
    )
    assert timed.returncode == 0, timed.stderr[-3000:]
    final_update = json.loads((tmp_path / "timed" / "summary.json").read_text())["updates"]
    saved = [e for e in read_events(tmp_path / "timed") if e["event"] == "checkpoint"]
    assert saved[-1]["update"] == final_update
    # The final save comes at the end whatever the clock says; the ones before are periodic.
    periodic = saved[:-1]
    assert len(periodic) >= 3, saved
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(periodic)]
    assert min(gaps) >= 0.3, gaps
    store = CheckpointStore(tmp_path / "timed", keep=100)
    assert store.steps() == [e["update"] for e in saved]
    store.close()

    untimed = run_command(
        [
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=untimed",
                "run.progress=false",
                budget,
                "checkpoint.every_updates=0",
                "checkpoint.every_minutes=0",
                "checkpoint.keep=100",
            ),
        ],
        timeout=180,
        cwd=REPO,
    )
    assert untimed.returncode == 0, untimed.stderr[-3000:]
    final_update = json.loads((tmp_path / "untimed" / "summary.json").read_text())["updates"]
    saved = [e["update"] for e in read_events(tmp_path / "untimed") if e["event"] == "checkpoint"]
    assert saved == [final_update]


# A rank that notes the first signal it gets and beats every 10 ms for 6 s more (60 s at most
# without one): its last beat is when it died.
_SIGNALLED_RANK = """
import os, signal, sys, time
rank = os.environ.get("PMI_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]
log = open(os.path.join(sys.argv[1], rank), "w", buffering=1)
end = [time.time() + 60]
def noted(number, frame):
    log.write(f"signal {number} {time.time()}\\n")
    end[0] = min(end[0], time.time() + 6)
for sig in (signal.SIGTERM, signal.SIGUSR2):
    signal.signal(sig, noted)
log.write("up\\n")
while time.time() < end[0]:
    time.sleep(0.01)
    log.write(f"beat {time.time()}\\n")
"""


def _launcher_signalled(tmp_path: Path, sig: int) -> tuple[int, list[float]]:
    """Start 2 plain ranks under this environment's launcher, send `sig` to the launcher, and
    return its exit status and how long each rank lived after the signal reached it (6 s: to
    its own end)."""
    logs = tmp_path / signal.Signals(sig).name
    logs.mkdir()
    proc = start_job([*mpi_launch(2), sys.executable, "-c", _SIGNALLED_RANK, str(logs)])
    try:
        deadline = time.monotonic() + 60
        while len([p for p in logs.iterdir() if "up" in p.read_text()]) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.communicate(timeout=90)
    finally:
        _kill_group(proc)
    lived = []
    for path in sorted(logs.iterdir()):
        lines = path.read_text().splitlines()
        received = [float(line.split()[2]) for line in lines if line.startswith("signal")]
        assert received, f"rank {path.name} never got {signal.Signals(sig).name}: {lines[-3:]}"
        last_beat = float(lines[-1].split()[1])
        lived.append(last_beat - received[0])
    return proc.returncode, lived


@pytest.mark.slow
@pytest.mark.openmpi
def test_what_the_launcher_does_with_a_stop_signal(tmp_path):
    """Why a job under Open MPI is stopped with SIGUSR2 (docs/cluster.md): its mpirun passes
    SIGTERM on and kills every rank a fraction of a second later (too soon for a final
    checkpoint on a loaded machine), and passes SIGUSR2 on without ending the job. MPICH's
    mpiexec passes SIGTERM on and waits for the ranks (SIGUSR2 ends mpiexec itself)."""
    status, lived = _launcher_signalled(tmp_path, signal.SIGTERM)
    if is_open_mpi():
        assert status != 0 and all(0 <= t < 1.0 for t in lived), (status, lived)
        status, lived = _launcher_signalled(tmp_path, signal.SIGUSR2)
    assert all(t > 5 for t in lived), (status, lived)  # lived on to its own end
