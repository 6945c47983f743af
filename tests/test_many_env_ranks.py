"""Many env ranks on few cores: 1 learner + 31 env ranks (32 processes on this 2-core machine)
run to the end with exact accounting, and the summary reports what each env rank burned, its
memory, and that it ran without JAX; an env rank waiting for a slow learner sleeps instead of
spinning."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import (
    REPO,
    agentenv_command,
    mpiexec_path,
    read_events,
    run_command,
    settings,
    start_job,
    wait_for_updates,
)

ENV_RANK_GOAL_MB = 80  # an env rank's peak resident memory, at most (docs/benchmarks.md)
# The share of a window in which an env rank waiting for a slow learner may be runnable; a
# wait that spins keeps it runnable all the time (~1).
RUNNABLE_SHARE = 0.5


@pytest.mark.slow
def test_one_learner_and_thirty_one_env_ranks_finish_with_exact_accounting(run_dir):
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            "32",
            *agentenv_command(
                "train",
                "cartpole_ppo",
                *settings(
                    f"run.run_dir={run_dir}",
                    "run.name=many",
                    "run.progress=false",
                    "env.global_num_envs=31",
                    "run.total_env_steps=15000",
                    # On one host auto sends to each env rank; this job takes the broadcast.
                    "topology.param_sync=broadcast",
                ),
            ),
        ],
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "many" / "summary.json").read_text())
    assert summary["topology"].startswith("1 learner + 31 env rank(s), 31 envs")
    accounting = summary["accounting"]
    assert accounting["reconciles"] and accounting["unsent"] == accounting["late"] == 0
    assert accounting["produced"] == accounting["trained"] == summary["env_steps"] >= 15000
    # One share per env rank, each measured (a waiting rank's share is tested below: here 32
    # processes share 2 cores, so any rank averages at most 1/16 of one).
    shares = summary["env_rank_cpu_share"]
    assert len(shares) == 31 and all(share > 0.0 for share in shares)
    # CartPole's 64x64 MLP acts in numpy (`env_rank_inference: auto`): the env ranks never
    # imported JAX, which with XLA's libraries holds ~120 MB more of each (184 MB with it, 3 Dec
    # 2026). Each stays within the documented goal (docs/benchmarks.md, "Hundreds of env
    # ranks"): 67.7-68.4 MB measured here (6 Dec 2026); 79.6-80.4 in CI's freshly installed
    # venv on 7 Dec, whose same library files counted ~5 MB more resident pages; and 5 MB
    # less in both since a Gymnasium env no longer imports the text tasks.
    assert summary["env_rank_jax_loaded"] == [False] * 31
    memory = summary["env_rank_max_rss_mb"]
    assert len(memory) == 31 and all(20 < mb <= ENV_RANK_GOAL_MB for mb in memory), memory


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runnable_seconds(pid: int) -> float:
    """Seconds the main thread of process `pid` has been runnable so far: on a CPU, or in a run
    queue waiting for one (`/proc/PID/schedstat`). A thread that spins is runnable the whole
    time, however many others share the cores; one that sleeps is not, while it sleeps."""
    on_cpu_ns, queued_ns = Path(f"/proc/{pid}/schedstat").read_text().split()[:2]
    return (int(on_cpu_ns) + int(queued_ns)) / 1e9


@pytest.mark.slow
def test_an_env_rank_waiting_for_a_slow_learner_does_not_spin(run_dir):
    """1 learner whose update takes seconds (two 1024x1024 MLPs, 80 epochs) + 1 env rank whose
    rollout takes milliseconds: the env rank spends nearly all its time waiting for parameters,
    and a wait that polled without sleeping would keep it runnable the whole time. Measured
    from the kernel's split of its time (`_runnable_seconds`) over a window after start-up and
    compilation, not over the whole run: unlike its CPU share, which other jobs on the cores
    push down, a spinning rank's runnable share stays ~1 under any load. What a waiting env
    rank costs in CPU is a benchmark's (`benchmarks/scaling_model.py`, docs/scaling.md)."""
    proc = start_job(
        [
            mpiexec_path(),
            "-n",
            "2",
            *agentenv_command(
                "train",
                "cartpole_ppo",
                *settings(
                    f"run.run_dir={run_dir}",
                    "run.name=wait",
                    "run.progress=false",
                    "network.actor_hidden=[1024,1024]",
                    "network.critic_hidden=[1024,1024]",
                    "algorithm.num_epochs=80",
                    "run.total_env_steps=10000000",
                ),
            ),
        ]
    )
    try:
        wait_for_updates(proc, run_dir / "wait", 2, timeout=300)
        start = next(e for e in read_events(run_dir / "wait") if e["event"] == "start")
        env_rank = int(start["processes"]["1"]["pid"])
        updates_before = len((run_dir / "wait" / "metrics.jsonl").read_text().splitlines())
        cpu_before, wall_before = _cpu_seconds(env_rank), time.monotonic()
        runnable_before = _runnable_seconds(env_rank)
        # At least 8 s, and until an update has ended in the window (under a loaded CI an
        # update can take longer than that), at most 120 s.
        metrics = run_dir / "wait" / "metrics.jsonl"
        time.sleep(8)
        while len(metrics.read_text().splitlines()) <= updates_before + 1:
            if time.monotonic() - wall_before > 120 or proc.poll() is not None:
                break
            time.sleep(1)
        runnable = _runnable_seconds(env_rank) - runnable_before
        cpu = _cpu_seconds(env_rank) - cpu_before
        wall = time.monotonic() - wall_before
        updates = len(metrics.read_text().splitlines()) - updates_before
        assert proc.poll() is None, proc.communicate()[1][-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    # The window held an update, and the env rank was runnable for a small part of it: it
    # slept while it waited. Measured on 2 cores under a load average of 13: runnable 0.047 of
    # an 18 s window (CPU share 0.015); with the back-off made to spin, 0.99 (CPU share 0.25,
    # which other jobs kept below the 0.35 this test used to require of it).
    assert updates >= 1, updates
    assert runnable / wall < RUNNABLE_SHARE, (runnable / wall, cpu / wall, wall, updates)
