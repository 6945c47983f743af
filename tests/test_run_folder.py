"""A run folder in use: one job at a time (a second start or resume is refused, naming the job;
a killed job's lock is taken over), and one record per update after a crash and a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agentenv_jax.checkpoint.run_folder import (
    LOCK_FILE,
    RunFolderInUse,
    cut_records_after,
    lock_run_folder,
)
from agentenv_jax.metrics.logger import read_metrics

from conftest import (
    EXPERIMENTS,
    REPO,
    agentenv_command,
    mpi_launch,
    read_events,
    run_command,
    settings,
    start_job,
    wait_for_updates,
)

_HOLD = (
    "import sys, time; from agentenv_jax.checkpoint.run_folder import lock_run_folder; "
    "lock_run_folder(sys.argv[1]); print('held', flush=True); time.sleep(600)"
)


def _holding_process(folder) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.slow
def test_a_held_run_folder_is_refused_naming_the_holder_until_it_ends(tmp_path):
    folder = tmp_path / "run"
    holder = _holding_process(folder)
    try:
        with pytest.raises(RunFolderInUse, match=rf"in use by a running job \(pid {holder.pid} "):
            lock_run_folder(folder)
    finally:
        holder.kill()  # the lock's owner dies without releasing it
        holder.wait()
    lock = lock_run_folder(folder)  # a dead job's lock is free again
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / LOCK_FILE).exists()
    assert not folder.exists()  # nothing else was written there: no folder left behind


def test_records_past_the_restored_checkpoint_are_cut(tmp_path):
    metrics = [json.dumps({"update": u, "env_steps": 256 * u}) for u in range(1, 8)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(metrics) + '\n{"update": 8, "env_st')
    (tmp_path / "timings.jsonl").write_text(
        "".join(json.dumps({"update": u, "wall_s": 0.1}) + "\n" for u in range(1, 8))
    )
    assert cut_records_after(tmp_path, 5) == 3  # updates 6 and 7, and the torn update 8
    assert [r["update"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert [r["update"] for r in read_metrics(tmp_path / "timings.jsonl")] == [1, 2, 3, 4, 5]
    assert cut_records_after(tmp_path, 5) == 0


@pytest.mark.slow
def test_a_running_run_refuses_a_second_job_and_resumes_after_a_crash(tmp_path):
    """A run in one process; meanwhile a resume under `mpiexec -n 3` and a new start with the
    same name are refused on every rank within seconds, and nothing of the run changes. Then
    the run is killed between two checkpoints: its lock is taken over by the resume, which cuts
    the records the dead session wrote past its last checkpoint."""
    run_dir = tmp_path / "busy"
    proc = start_job(
        agentenv_command(
            "train",
            str(EXPERIMENTS / "cartpole_ppo.yaml"),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=busy",
                "run.total_env_steps=10000000",
                "checkpoint.every_updates=10",
            ),
        )
    )
    try:
        wait_for_updates(proc, run_dir, 15, timeout=180)
        config_before = (run_dir / "config.yaml").read_bytes()
        for command in (
            [*mpi_launch(3), *agentenv_command("train", "--resume", str(run_dir))],
            agentenv_command(
                "train",
                "cartpole_ppo",
                *settings(f"run.run_dir={tmp_path}", "run.name=busy"),
            ),
        ):
            started = time.monotonic()
            refused = run_command(command, timeout=120, cwd=REPO)
            assert refused.returncode == 2, refused.stderr[-3000:]
            assert f"is in use by a running job (pid {proc.pid} on " in refused.stderr
            assert time.monotonic() - started < 60
        assert proc.poll() is None  # the run itself goes on
        assert (run_dir / "config.yaml").read_bytes() == config_before
        events = [e["event"] for e in read_events(run_dir)]  # no second start among them
        assert events[0] == "start" and set(events[1:]) == {"checkpoint"}, events
        # Killed past a checkpoint, so that some records are the dead session's alone: frozen
        # to look, and let go on while the newest record is a checkpoint's. The checkpoint is
        # the newest finished one on disk (its event may not be written yet when frozen).
        while True:
            os.kill(proc.pid, signal.SIGSTOP)
            written = read_metrics(run_dir / "metrics.jsonl")
            saved = max(
                int(folder.name)
                for folder in (run_dir / "checkpoints").iterdir()
                if folder.name.isdigit()
            )
            if len(written) > saved:
                break
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    total = saved + 20  # updates of 256 steps: 20 after the checkpoint
    resumed = run_command(
        agentenv_command(
            "train", "--resume", str(run_dir), "--set", f"run.total_env_steps={256 * total}"
        ),
        timeout=300,
        cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resume = next(e for e in read_events(run_dir) if e["event"] == "resume")
    assert resume["update"] == saved and resume["records_cut"] == len(written) - saved
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["update"] for r in records] == list(range(1, total + 1))
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps)
    timings = read_metrics(run_dir / "timings.jsonl")
    assert [t["update"] for t in timings] == list(range(1, total + 1))
    assert not (run_dir / LOCK_FILE).exists()  # released at the end of the run
