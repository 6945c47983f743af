"""Which launcher started this process, and how it hands ranks to MPI: read off the environment.

Every launcher leaves its own variables in the processes it starts:
- MPICH's (and Intel MPI's) Hydra `mpiexec`: `PMI_RANK`, `PMI_SIZE` and `HYDI_CONTROL_FD`; the
  rank talks PMI-1 over the inherited socket `PMI_FD`.
- Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`/`_SIZE`; PMIx (`PMIX_RANK`) underneath.
- Slurm's `srun`: `SLURM_STEP_ID`, `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, plus the variables of
  its `--mpi` plugin: `PMI_FD` and `PMI_JOBID` for `pmi2`, `PMIX_RANK` for `pmix`, none for
  `none` (Slurm's default), where the MPI library finds no job at all and every task would start
  a world of its own.

Nothing here imports mpi4py: the supervisor and `agentenv doctor` use it before (or without)
MPI starting.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from agentenv_jax.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Launcher:
    """What the environment says about this process's launcher."""

    name: str  # "srun", "mpiexec (Hydra)", "mpirun (Open MPI)", "a PMIx launcher", "none"
    pmi: str  # how ranks reach the launcher: "PMI-1", "PMI-2", "PMIx", "none"
    rank: int | None  # this process's rank, as the launcher numbered it
    size: int | None  # how many ranks the launcher started
    slurm_step: str | None = None  # "JOB.STEP" under srun (also under mpiexec in an allocation)

    @property
    def started_ranks(self) -> bool:
        """Whether a launcher started several ranks (or one rank of an MPI job)."""
        return self.name != "none"

    def describe(self) -> str:
        """One line, for `agentenv doctor` and error messages."""
        if not self.started_ranks:
            return "none (one process)"
        where = f", Slurm step {self.slurm_step}" if self.slurm_step else ""
        return f"{self.name} with {self.size} ranks (PMI: {self.pmi}{where})"


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def slurm_step(env: Mapping[str, str] | None = None) -> str | None:
    """`JOB.STEP` of the Slurm job step this process runs in (not the batch shell's), if any."""
    env = os.environ if env is None else env
    job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")
    if job is None or step is None:
        return None
    return f"{job}.{step}"


# Launchers that say the world size and the rank in variables of their own, checked first:
# (size variable, rank variable, launcher, how its ranks reach it).
_OWN_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpirun (Open MPI)", "PMIx"),
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "mpirun_rsh (MVAPICH)", "PMI-1"),
)


def detect_launcher(env: Mapping[str, str] | None = None) -> Launcher:
    """The launcher of the process whose environment is `env` (this one's by default)."""
    env = os.environ if env is None else env
    step = slurm_step(env)
    for size, rank, name, pmi in _OWN_VARIABLES:
        if size in env:
            return Launcher(name, pmi, _int(env.get(rank)), _int(env[size]), step)
    if "HYDI_CONTROL_FD" in env or ("PMI_RANK" in env and step is None):
        return Launcher(
            "mpiexec (Hydra)", "PMI-1", _int(env.get("PMI_RANK")), _int(env.get("PMI_SIZE")), step
        )
    if step is not None:
        if "PMIX_RANK" in env:
            pmi = "PMIx"
        elif "PMI_JOBID" in env or "PMI_FD" in env:
            pmi = "PMI-2"
        else:
            pmi = "none"
        size = _int(env.get("SLURM_STEP_NUM_TASKS"))
        if pmi == "none" and (size or 1) <= 1:
            # A one-task step (`srun agentenv train ...`) is a run in one process.
            return Launcher("none", "none", None, None)
        return Launcher("srun", pmi, _int(env.get("SLURM_PROCID")), size, step)
    if "PMIX_RANK" in env:
        return Launcher("a PMIx launcher", "PMIx", _int(env.get("PMIX_RANK")), None, step)
    if "PMI_SIZE" in env:
        return Launcher("a PMI launcher", "PMI-1", _int(env.get("PMI_RANK")), _int(env["PMI_SIZE"]))
    return Launcher("none", "none", None, None)


# Overrides the launcher detection: "mpi" for a launcher that sets none of the variables above,
# "inprocess" for one process where they are inherited (a notebook inside a Slurm step, say).
TRANSPORT_VARIABLE = "AGENTENV_TRANSPORT"
_TRANSPORT_CHOICES = ("mpi", "inprocess")


def launched_by_mpi() -> bool:
    """Whether this process is one rank of an MPI job: `AGENTENV_TRANSPORT` if set, else
    whether a launcher started this process (`launcher.detect_launcher`: without one, no MPI is
    initialized at all). `ConfigError` for an unknown value."""
    choice = os.environ.get(TRANSPORT_VARIABLE, "")
    if choice and choice not in _TRANSPORT_CHOICES:
        raise ConfigError(
            f"{TRANSPORT_VARIABLE} = {choice!r} is not allowed: expected "
            f"{' or '.join(map(repr, _TRANSPORT_CHOICES))}, or unset to detect the launcher"
        )
    if choice:
        return choice == "mpi"
    return detect_launcher().started_ranks


def launcher_rank(env: Mapping[str, str] | None = None) -> str | None:
    """This process's rank as the launcher set it, if a launcher started it."""
    rank = detect_launcher(env).rank  # None without a launcher
    return None if rank is None else str(rank)


class LaunchError(RuntimeError):
    """The launcher and the MPI library disagree about the job (every rank raises it)."""


def world_mismatch(launcher: Launcher, world_size: int, library: str) -> LaunchError:
    """The error for a job whose MPI world is not the one its launcher started: the library
    did not find the launcher's PMI, so every rank would train alone."""
    if launcher.name == "srun":
        fix = (
            "start the step with srun --mpi=pmi2 (MPICH, Intel MPI) or --mpi=pmix (Open MPI); "
            "`srun --mpi=list` shows this cluster's plugins"
        )
    else:
        fix = (
            "start the job with the mpiexec/mpirun of the MPI library mpi4py loads, or point "
            "mpi4py at the launcher's library with MPI4PY_LIBMPI=/path/to/libmpi.so "
            "(docs/cluster.md)"
        )
    return LaunchError(
        f"{launcher.name} started {launcher.size} ranks (PMI: {launcher.pmi}), but the MPI "
        f"library mpi4py loaded ({library}) sees a world of {world_size}: it did not join the "
        f"launcher's job, and each rank would train alone. {fix[0].upper()}{fix[1:]}; "
        "`agentenv doctor` shows what a job gets"
    )
