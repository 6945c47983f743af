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
from agentenv_jax.slurm import SlurmJob, sbatch_script

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
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scontrol.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
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
