"""Slurm batch scripts: the generated text line by line, and its start / resume / requeue logic
run by bash with stand-ins for `srun` and `scontrol` (no cluster here)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from agentenv_jax.config import ConfigError
from agentenv_jax.mpi_job import environment_without_launcher
from agentenv_jax.slurm import SlurmJob, SweepArrayJob, sbatch_script, sweep_array_script

from conftest import agentenv_command, read_events, run_command, settings, wait_for_updates

TWO_NODES = SlurmJob(
    job_name="cp",
    config_file="/scratch/jobs/cp.yaml",
    run_dir="/scratch/runs/cp",
    env_ranks=16,
    env_nodes=1,
    gpus=1,
    cpus_per_env_rank=2,
    time="12:00:00",
    gpu_partition="gpu",
    cpu_partition="cpu",
    account="rl",
    grace_s=300,
    python="/opt/venv/bin/python",
)


def test_a_two_node_job_puts_the_learner_on_a_gpu_node_and_env_ranks_on_a_cpu_node():
    expected = """\
#!/bin/bash
#SBATCH --job-name=cp
#SBATCH --time=12:00:00
#SBATCH --account=rl
#SBATCH --signal=B:USR1@300
#SBATCH --output=/scratch/runs/cp.slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
# Component 0: the learner (rank 0) with its GPUs.
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-task=1
#SBATCH hetjob
# Component 1: the env ranks (CPU).
#SBATCH --partition=cpu
#SBATCH --nodes=1
#SBATCH --ntasks=16
#SBATCH --cpus-per-task=2

set -u
RUN_DIR=/scratch/runs/cp
# Resume when an earlier start (before a preemption or requeue) left a checkpoint.
if compgen -G "$RUN_DIR/checkpoints/[0-9]*" > /dev/null; then
  ARGS=(--resume "$RUN_DIR")
else
  ARGS=(/scratch/jobs/cp.yaml)
fi

# Near the time limit: stop the run with a checkpoint, then requeue this job.
stop_and_requeue() {
  kill -TERM "$TRAIN_PID"
  wait "$TRAIN_PID"
  scontrol requeue "$SLURM_JOB_ID"
}
trap stop_and_requeue USR1
srun --mpi=pmix --het-group=0,1 /opt/venv/bin/python -m agentenv_jax.cli train "${ARGS[@]}" &
TRAIN_PID=$!
wait "$TRAIN_PID"
"""
    script = sbatch_script(TWO_NODES)
    assert script.splitlines() == expected.splitlines()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_without_gpus_one_component_holds_every_rank():
    script = sbatch_script(SlurmJob("cp", "/c.yaml", "/runs/cp", env_ranks=7, env_nodes=2, gpus=0))
    assert "hetjob" not in script and "--het-group" not in script
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=8\n" in script
    assert "\nsrun --mpi=pmix python -m agentenv_jax.cli train" in script


@pytest.mark.parametrize(
    "change, message",
    [
        ({"env_ranks": 0}, "env_ranks = 0 is not allowed: expected an integer >= 1"),
        ({"env_nodes": 17}, "env_nodes = 17 is not allowed: expected at most env_ranks (16)"),
        ({"gpus": -1}, "gpus = -1 is not allowed: expected an integer >= 0"),
    ],
)
def test_impossible_jobs_name_the_setting(change, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        sbatch_script(dataclasses.replace(TWO_NODES, **change))


@pytest.mark.slow
def test_the_script_starts_resumes_and_requeues(tmp_path):
    """`srun` is a stand-in that runs the command in this machine's one process; `scontrol`
    one that records what it was asked."""
    bin_dir = _fake_slurm_tools(tmp_path)
    made = run_command(
        [
            *agentenv_command("slurm", "cartpole_ppo", "--gpus", "0", "-o", "job.sbatch"),
            *settings(f"run.run_dir={tmp_path}/runs", "run.name=cp", "run.total_env_steps=1024"),
        ],
        timeout=60,
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    env = environment_without_launcher()
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="42")
    run_dir = tmp_path / "runs" / "cp"

    def start_job(**options):
        return subprocess.Popen(["bash", "job.sbatch"], cwd=tmp_path, env=env, **options)

    first = start_job()
    assert first.wait(timeout=300) == 0
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 1024
    assert not [e for e in read_events(run_dir) if e["event"] == "resume"]

    # Requeued with a larger budget in its config: the second start resumes the run.
    config = run_dir / "config.yaml"
    config.write_text(
        config.read_text().replace("total_env_steps: 1024", "total_env_steps: 200000")
    )
    second = start_job(stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_updates(second, run_dir, 10, timeout=120)
        assert [e["update"] for e in read_events(run_dir) if e["event"] == "resume"] == [4]
        # The time limit nears: Slurm signals the batch shell, which stops the run with a
        # checkpoint and requeues the job.
        second.send_signal(signal.SIGUSR1)
        assert second.wait(timeout=120) is not None
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["env_steps"] < 200_000
    assert (tmp_path / "scontrol.log").read_text() == "requeue 42\n"
    assert sys.executable in (tmp_path / "job.sbatch").read_text()


def _fake_slurm_tools(tmp_path):
    """`srun`: runs the command in this machine's one process; `scontrol`: records its call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scontrol.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


FOUR_TRIALS = SweepArrayJob(
    job_name="lr",
    sweep_command="/opt/venv/bin/python -m agentenv_jax.cli sweep /home/me/lr.yaml",
    folder="/scratch/runs/lr",
    workdir="/home/me",
    trials=4,
    parallel=2,
    ranks=3,
    nodes=1,
    gpus=1,
    cpus_per_rank=2,
    time="02:00:00",
    partition="gpu",
    account="rl",
    grace_s=300,
)


def test_a_four_trial_sweep_is_a_job_array_one_trial_per_task():
    expected = """\
#!/bin/bash
#SBATCH --job-name=lr
#SBATCH --array=0-3%2
#SBATCH --time=02:00:00
#SBATCH --account=rl
#SBATCH --partition=gpu
#SBATCH --signal=B:USR1@300
#SBATCH --chdir=/home/me
#SBATCH --output=/scratch/runs/lr/logs/slurm-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks=3
#SBATCH --cpus-per-task=2
#SBATCH --gpus=1
#SBATCH --requeue

set -u
# This task's trial; it resumes from its checkpoint after a preemption or requeue.
stop_and_requeue() {
  kill -TERM "$SWEEP_PID"
  wait "$SWEEP_PID"
  scontrol requeue "$SLURM_JOB_ID"
}
trap stop_and_requeue USR1
/opt/venv/bin/python -m agentenv_jax.cli sweep /home/me/lr.yaml --trial "$SLURM_ARRAY_TASK_ID" --launcher 'srun --mpi=pmix' &
SWEEP_PID=$!
wait "$SWEEP_PID"
"""
    script = sweep_array_script(FOUR_TRIALS)
    assert script.splitlines() == expected.splitlines()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    with pytest.raises(ConfigError, match=r"env_nodes = 4 is not allowed .* at most its trials"):
        sweep_array_script(dataclasses.replace(FOUR_TRIALS, nodes=4))


def test_a_sweeps_array_task_runs_its_trial_and_a_requeue_resumes_it(tmp_path):
    """`agentenv slurm SWEEP` claims the sweep folder and writes the array script; bash runs
    it as array task 2 with stand-ins for srun and scontrol; near the time limit the task
    stops its trial with a checkpoint and requeues itself; the next start resumes the trial
    and finishes it."""
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(
        "base: cartpole_ppo\n"
        "set: [run.total_env_steps=200000, run.progress=false]\n"
        "parameters:\n  algorithm.clip_eps: [0.1, 0.2]\n"
        "seeds: 2\nparallel: 2\nrun_dir: runs\n"
    )
    made = run_command(
        agentenv_command("slurm", str(sweep), "--gpus", "0", "-o", "grid.sbatch"), 60, tmp_path
    )
    assert made.returncode == 0, made.stderr
    script = (tmp_path / "grid.sbatch").read_text()
    assert "#SBATCH --array=0-3%2\n" in script and (tmp_path / "runs/grid/sweep.yaml").is_file()
    env = environment_without_launcher()
    env.update(
        PATH=f"{_fake_slurm_tools(tmp_path)}:{os.environ['PATH']}",
        SLURM_JOB_ID="43",
        SLURM_ARRAY_TASK_ID="2",
    )
    trial = tmp_path / "runs/grid/trials/c00-clip_eps=0.1-seed1"

    def start_task():
        return subprocess.Popen(
            ["bash", "grid.sbatch"],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    first = start_task()
    try:
        wait_for_updates(first, trial, 10, timeout=120)
        first.send_signal(signal.SIGUSR1)  # the time limit nears
        assert first.wait(timeout=120) is not None
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    summary = json.loads((trial / "summary.json").read_text())
    assert summary["interrupted"] and summary["env_steps"] < 200_000
    assert (tmp_path / "scontrol.log").read_text() == "requeue 43\n"

    # The requeued task resumes the trial; a smaller budget in its config lets it finish.
    config = trial / "config.yaml"
    budget = summary["env_steps"] + 1024
    config.write_text(
        config.read_text().replace("total_env_steps: 200000", f"total_env_steps: {budget}")
    )
    second = start_task()
    assert second.wait(timeout=300) == 0, second.stderr.read()
    summary = json.loads((trial / "summary.json").read_text())
    assert not summary["interrupted"] and summary["env_steps"] >= budget
    assert len([e for e in read_events(trial) if e["event"] == "resume"]) == 1
    rows = (tmp_path / "runs/grid/trials.csv").read_text().splitlines()
    assert [r.split(",")[4] for r in rows[1:]] == ["pending", "pending", "finished", "pending"]
