"""Helpers the benchmark scripts share: finding `mpiexec` and launching jobs outside a launcher."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_mpiexec() -> str | None:
    """The mpiexec next to this Python (the mpich wheel puts it there), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def clean_env() -> dict[str, str]:
    """This environment without an outer MPI launcher's variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
