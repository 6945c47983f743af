"""Helpers the benchmark scripts share: finding `mpiexec`, launching jobs outside a launcher,
reading their results, and the per-seed report's arithmetic."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE
from agentenv_jax.runtime.mpi_job import environment_without_launcher, find_mpiexec


def clean_env() -> dict[str, str]:
    """This environment without an outer launcher's variables (as the package cleans it for its
    own jobs), and an empty JAX compilation cache of the job's own: every measured run starts
    cold, as the runs in docs/benchmarks.md did before the cache was on by default."""
    env = environment_without_launcher()
    env[CACHE_DIR_VARIABLE] = tempfile.mkdtemp(prefix="agentenv-bench-cache-")
    return env


def results_in(stdout: str, result_prefix: str) -> list[dict[str, Any]]:
    """The JSON results a worker printed, one per line after `result_prefix`."""
    return [
        json.loads(line[len(result_prefix) :])
        for line in stdout.splitlines()
        if line.startswith(result_prefix)
    ]


def run_worker(
    script: str,
    worker_args: list[str],
    result_prefix: str,
    label: str,
    timeout: float,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run `python script --worker ... --launched-at T` in a fresh interpreter (so every run
    pays its own imports and compiles; T is the wall-clock time just before the launch, the
    point every side is clocked from) and return the JSON it prints after `result_prefix`."""
    env = clean_env() | (extra_env or {})
    command = [sys.executable, str(Path(script).resolve()), "--worker", *worker_args]
    command += ["--launched-at", repr(time.time())]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{done.stderr}")
    results = results_in(done.stdout, result_prefix)
    if not results:
        raise SystemExit(f"{label} printed no result:\n{done.stdout}\n{done.stderr}")
    return results[0]


def run_script_under_mpiexec(
    script: str, ranks: int, worker_args: list[str], result_prefix: str, timeout: float
) -> list[dict[str, Any]]:
    """`mpiexec -n ranks python script worker_args...`; the JSON results its ranks print."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise SystemExit("mpiexec not found: install the mpich wheel (pip install mpich)")
    command = [mpiexec, "-n", str(ranks), sys.executable, str(Path(script).resolve())]
    done = subprocess.run(
        [*command, *worker_args], capture_output=True, text=True, env=clean_env(), timeout=timeout
    )
    if done.returncode != 0:
        raise SystemExit(
            f"mpiexec -n {ranks} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return results_in(done.stdout, result_prefix)


def add_mpi_job_arguments(parser: argparse.ArgumentParser, job_timeout_s: float) -> None:
    """The options of a benchmark that runs itself as an MPI job: its limits, a JSON copy of
    the results, and the hidden flag its ranks are started with (`worker_args`)."""
    parser.add_argument("--timeout", type=float, default=60.0, help="transport wait limit (s)")
    parser.add_argument(
        "--job-timeout", type=float, default=job_timeout_s, help="mpiexec job limit (s)"
    )
    parser.add_argument("--json", type=Path, help="also write the raw results to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


# The packages every script's numbers depend on (the `bench` extra's among them), by their
# distribution names; a script names its own extras.
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "gymnasium", "mpi4py", "mpich")


def provenance(*extra_packages: str) -> str:
    """Two lines for a report's header: the commit the package was at (`git describe --dirty`:
    a `-dirty` suffix says the numbers are not those of the commit) and the machine with the
    versions of the packages used."""
    import importlib.metadata
    import platform

    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout)"
    versions = []
    for package in (*_PACKAGES, *extra_packages):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} not installed")
    return (
        f"commit {commit}\n{os.cpu_count()} CPUs, python {platform.python_version()}, "
        + ", ".join(versions)
    )


def worker_args() -> list[str]:
    """The arguments of this script's ranks: the options it was given, plus `--worker`."""
    return ["--worker", *sys.argv[1:]]


def run_rank_or_abort(rank_work: Callable[[], Any]) -> None:
    """This rank's part of a benchmark's MPI job; on any error print it and end every rank,
    so that none waits forever."""
    try:
        rank_work()
    except BaseException:
        from mpi4py import MPI

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def run_agentenv_mpi(
    ranks: int, config: Path, overrides: list[str], label: str, timeout: float
) -> float:
    """`mpiexec -n ranks agentenv train config --set ...`; the job's wall-clock seconds."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise SystemExit("mpiexec not found: install the mpich wheel (pip install mpich)")
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "agentenv_jax.workflow.cli"]
    command += ["train", str(config)]
    for override in overrides:
        command += ["--set", override]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{done.stderr}")
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def time_to_solve(run: dict[str, Any]) -> float:
    """A run's seconds to the threshold; infinite when it never got there."""
    return run["wall_s"] if run["solved"] else math.inf


def steps_to_solve(run: dict[str, Any]) -> float:
    return run["env_steps"] if run["solved"] else math.inf


def format_solved(value: float, spec: str) -> str:
    return "unsolved" if math.isinf(value) else format(value, spec)


def run_seeds(
    sides: list[str],
    seeds: list[int],
    run_side: Callable[[str, int, Path], dict[str, Any]],
    describe: Callable[[str, dict[str, Any]], str],
    keep_runs: Path | None,
    temp_prefix: str,
) -> dict[str, list[dict[str, Any]]]:
    """Every side on every seed, `run_side(side, seed, run_root)`, printing `describe(side,
    run)` after each. The side that goes first rotates with the seed, so drift in the machine's
    load does not always favour the same side. Runs go under `keep_runs`, else a temporary
    folder removed at the end; each side's runs come back in seed order."""
    run_root = keep_runs or Path(tempfile.mkdtemp(prefix=temp_prefix))
    run_root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    try:
        for index, seed in enumerate(seeds):
            order = sides[index % len(sides) :] + sides[: index % len(sides)]
            for side in order:
                run = run_side(side, seed, run_root)
                run["seed"] = seed
                runs[side].append(run)
                print(f"  seed {seed} {describe(side, run)}", flush=True)
    finally:
        if keep_runs is None:
            shutil.rmtree(run_root, ignore_errors=True)
    for side_runs in runs.values():
        side_runs.sort(key=lambda r: seeds.index(r["seed"]))
    return runs
