"""A rank that dies, and an update that diverges: the job stops, says why, and the last
checkpoint stays good."""

from __future__ import annotations

import time

import pytest

from conftest import (
    EXPERIMENTS,
    REPO,
    agentenv_command,
    mpi_launch,
    mpiexec_path,
    processes_with,
    restorable_checkpoint,
    run_command,
    settings,
    signal_rank_and_wait,
    start_job,
)

CARTPOLE = str(EXPERIMENTS / "cartpole_ppo.yaml")


@pytest.mark.slow
def test_non_finite_update_stops_the_job_and_keeps_the_last_good_checkpoint(tmp_path):
    started = time.monotonic()
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command(
                "train",
                CARTPOLE,
                "--set",
                "env.id=envs_for_tests:nan_reward_cartpole",
                "--set",
                "env.kwargs={nan_after: 600}",
                "--set",
                f"run.run_dir={tmp_path}",
                "--set",
                "run.name=nan",
                "--set",
                "checkpoint.every_updates=2",
            ),
        ],
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert time.monotonic() - started < 120
    assert "agentenv: error: rank 0: update" in proc.stderr
    assert "loss/" in proc.stderr and "is not finite" in proc.stderr
    step = restorable_checkpoint(tmp_path / "nan")
    assert step >= 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "killed_rank, launcher_flags",
    [
        pytest.param(2, [], marks=pytest.mark.openmpi),
        pytest.param(0, [], marks=pytest.mark.openmpi),
        (2, ["-disable-auto-cleanup"]),  # MPICH's
    ],
    ids=["env-rank", "learner", "env-rank-survivors-kept"],
)
def test_killed_rank_is_named_and_the_checkpoint_restores(tmp_path, killed_rank, launcher_flags):
    """SIGKILL one rank's process: its supervisor names the rank and the job stops at once
    (with MPICH's default cleanup, with the survivors kept alive, where they stop on the
    launcher's notice, and under Open MPI's mpirun), and no process of the job is left. The
    last checkpoint restores."""
    run_dir = tmp_path / "kill"
    launch = mpi_launch(3)
    proc = start_job(
        [
            *launch[:1],
            *launcher_flags,
            *launch[1:],
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=kill",
                "checkpoint.every_updates=5",
                "run.transport_timeout_s=20",
            ),
        ]
    )
    ended = signal_rank_and_wait(proc, run_dir, killed_rank, after_updates=12, timeout=60)
    assert proc.returncode != 0
    assert ended.ended_after < 10  # well before the transport timeout
    named = f"rank {killed_rank} (pid {ended.pid}) was killed by SIGKILL"
    assert named in ended.stderr, (ended.stdout + ended.stderr)[-3000:]
    assert processes_with(str(run_dir)) == []
    assert restorable_checkpoint(run_dir) >= 5
