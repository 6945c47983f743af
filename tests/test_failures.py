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


@pytest.mark.slow
def test_a_killed_env_rank_stops_a_job_of_thirty_two_ranks_at_once(tmp_path):
    """SIGKILL one of 31 env ranks (32 processes oversubscribed on the machine's cores, numpy
    policies): the stop reaches every rank through the launcher, long before the learner's
    transport timeout (120 s here) could end the job, and no process is left. Measured on 2
    cores: 0.5 s at 1 + 31 ranks, 1.1-1.5 s at 1 + 127 (killed after 3 updates, and during
    start-up)."""
    run_dir = tmp_path / "many"
    proc = start_job(
        [
            mpiexec_path(),
            "-n",
            "32",
            *agentenv_command(
                "train",
                CARTPOLE,
                *settings(
                    f"run.run_dir={tmp_path}",
                    "run.name=many",
                    "run.progress=false",
                    "env.global_num_envs=31",
                    "run.total_env_steps=10000000",
                    "run.transport_timeout_s=120",
                ),
            ),
        ]
    )
    ended = signal_rank_and_wait(proc, run_dir, 17, after_updates=2, timeout=150)
    assert proc.returncode != 0
    assert f"rank 17 (pid {ended.pid}) was killed by SIGKILL" in ended.stderr, ended.stderr[-3000:]
    assert "timed out" not in ended.stderr and "timeout" not in ended.stderr, ended.stderr[-3000:]
    assert ended.ended_after < 60, ended.ended_after  # not the 120 s transport timeout
    assert processes_with(str(tmp_path)) == []
