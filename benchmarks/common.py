"""What the benchmark scripts share: their common options, their jobs (a worker of the script
itself, an `mpiexec` job of it, an `agentenv train` run) in a clean environment with a
compilation cache of their own, the folders their runs go to, and the reports' arithmetic."""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE
from agentenv_jax.runtime.mpi_job import environment_without_launcher, find_mpiexec

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"

# --- options --------------------------------------------------------------------------------


def make_parser(
    doc: str,
    *,
    config: Path | None = None,
    config_help: str = "experiment YAML",
    seeds: list[int] | None = None,
    run_timeout: float | None = None,
    keep_runs: bool = False,
    overrides: bool = False,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first line of its docstring `doc`, with the
    options benchmarks share: always `--json FILE`; with `config`, `--config` (that default);
    with `seeds`, `--seeds` (that default); with `run_timeout`, `--timeout` per training run
    (that many seconds); with `keep_runs`, `--keep-runs DIR` (`runs_folder`); with `overrides`,
    `--set KEY=VALUE` (repeatable, for every run)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0], epilog=epilog)
    parser.add_argument("--json", type=Path, help="also write the raw results to this file")
    if config is not None:
        parser.add_argument("--config", type=Path, default=config, help=config_help)
    if seeds is not None:
        parser.add_argument("--seeds", type=int, nargs="+", default=seeds, help="seeds to run")
    if run_timeout is not None:
        parser.add_argument("--timeout", type=float, default=run_timeout, help="limit per run (s)")
    if keep_runs:
        parser.add_argument("--keep-runs", type=Path, help="keep the run folders in this folder")
    if overrides:
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="extra config override for every run (repeatable)",
        )
    return parser


def add_worker_arguments(parser: argparse.ArgumentParser, workers: list[str] | None = None) -> None:
    """The hidden options a script's worker process is started with (`run_worker`): which
    worker (`workers`, or a plain `--worker` flag), its seed, its run folder and the time it
    was launched at."""
    if workers is None:
        parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    else:
        parser.add_argument("--worker", choices=workers, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--launched-at", type=float, help=argparse.SUPPRESS)


def add_mpi_job_arguments(
    parser: argparse.ArgumentParser, job_timeout_s: float, transport_timeout_s: float = 60.0
) -> None:
    """The options of a benchmark that runs itself as an MPI job: its limits and the hidden
    flag its ranks are started with (`run_self_under_mpiexec`)."""
    parser.add_argument(
        "--timeout", type=float, default=transport_timeout_s, help="transport wait limit (s)"
    )
    parser.add_argument(
        "--job-timeout", type=float, default=job_timeout_s, help="mpiexec job limit (s)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def add_round_arguments(
    parser: argparse.ArgumentParser, rounds: int, chunk_seconds: float, seconds: float | None
) -> None:
    """The options of a benchmark whose sides take turns in chunks within each round: rounds,
    seconds per chunk and (`seconds`: its default, None: no such option) per side per round."""
    parser.add_argument("--rounds", type=int, default=rounds, help="rounds (ratios) per case")
    if seconds is not None:
        parser.add_argument(
            "--seconds", type=float, default=seconds, help="approx. seconds per side per round"
        )
    parser.add_argument(
        "--chunk-seconds",
        type=float,
        default=chunk_seconds,
        help="approx. seconds per chunk: within a round the sides alternate chunk by chunk",
    )


def rounds_line(args: argparse.Namespace, ratio: str, goal: float) -> str:
    """The header line saying how a round-based benchmark (`add_round_arguments`) is timed."""
    return (
        f"{args.rounds} rounds of ~{args.seconds:g} s per side; ratio = {ratio}, median over "
        f"rounds (goal >= {goal})\n"
    )


def save_json(path: Path | None, data: Any) -> None:
    """`--json FILE`: the raw results, written when a file was named."""
    if path is not None:
        path.write_text(json.dumps(data, indent=1) + "\n")


def save_report(args: argparse.Namespace, *packages: str, **fields: Any) -> None:
    """`--json FILE` of a script's runs: its arguments, `provenance(*packages)`, `fields` and
    when it finished, written when a file was named."""
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "provenance": provenance(*packages),
        **fields,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    save_json(args.json, report)


# --- jobs -----------------------------------------------------------------------------------


@contextlib.contextmanager
def job_environment(extra_env: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """This environment without an outer launcher's variables (as the package cleans it for its
    own jobs), with an empty JAX compilation cache of the job's own, removed when the block
    ends: every measured run starts cold, as the runs in docs/benchmarks.md did before the cache
    was on by default. `extra_env` is added last (a cache folder of the caller's replaces it)."""
    cache = tempfile.mkdtemp(prefix="agentenv-bench-cache-")
    try:
        yield environment_without_launcher() | {CACHE_DIR_VARIABLE: cache} | (extra_env or {})
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run_job(
    command: list[str], label: str, timeout: float, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """`command` in a `job_environment`, its output captured; it and its wall-clock seconds
    (launch to exit). A failure ends the benchmark."""
    with job_environment(extra_env) as env:
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        output = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{output}")
    return done, seconds


def rank_memory_mb(marker: str, world: int) -> tuple[dict[int, float], dict[int, float]]:
    """Resident MB of a job's processes (`agentenv_jax.workflow.cli train` with `marker` on the
    command line), by pid: the ranks themselves, and under mpiexec their small supervisors
    (`runtime.supervisor`; none in one process)."""
    ranks, supervisors = {}, {}
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if marker not in cmdline or "agentenv_jax.workflow.cli" not in cmdline:
                continue
            is_rank = world == 1 or b"AGENTENV_RANK_PROCESS=1" in (proc / "environ").read_bytes()
            status = (proc / "status").read_text()
            mb = int(status.split("VmRSS:")[1].split()[0]) / 1024
            (ranks if is_rank else supervisors)[int(proc.name)] = mb
        except (OSError, IndexError, ValueError):
            continue
    return ranks, supervisors


def require_mpiexec() -> str:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise SystemExit("mpiexec not found: install the mpich wheel (pip install mpich)")
    return mpiexec


def under_mpiexec(ranks: int, command: list[str]) -> list[str]:
    return [require_mpiexec(), "-n", str(ranks), *command]


def results_in(stdout: str, result_prefix: str) -> list[dict[str, Any]]:
    """The JSON results a worker printed, one per line after `result_prefix`."""
    return [
        json.loads(line[len(result_prefix) :])
        for line in stdout.splitlines()
        if line.startswith(result_prefix)
    ]


def script_command(script: str, worker_args: list[str]) -> list[str]:
    """`python script worker_args...`, with this interpreter."""
    return [sys.executable, str(Path(script).resolve()), *worker_args]


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
    command = script_command(script, ["--worker", *worker_args])
    command += ["--launched-at", repr(time.time())]
    done, _ = run_job(command, label, timeout, extra_env)
    results = results_in(done.stdout, result_prefix)
    if not results:
        raise SystemExit(f"{label} printed no result:\n{done.stdout}\n{done.stderr}")
    return results[0]


def run_self_under_mpiexec(
    script: str, ranks: int, result_prefix: str, timeout: float
) -> list[dict[str, Any]]:
    """`mpiexec -n ranks python script --worker OPTIONS...`, `script` being the running one and
    OPTIONS those it was given; the JSON results its ranks print."""
    command = under_mpiexec(ranks, script_command(script, ["--worker", *sys.argv[1:]]))
    done, _ = run_job(command, f"mpiexec -n {ranks}", timeout)
    return results_in(done.stdout, result_prefix)


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


def work_if_rank(args: argparse.Namespace, rank_work: Callable[[argparse.Namespace], Any]) -> bool:
    """Whether this process is a rank of the script's own MPI job (`--worker`); if so, its part
    `rank_work(args)` is done (`run_rank_or_abort`)."""
    if args.worker:
        run_rank_or_abort(lambda: rank_work(args))
    return bool(args.worker)


def run_settings(run_dir: Path, name: str, **run_fields: object) -> list[str]:
    """`--set` strings of a benchmark's training run: `run.FIELD=VALUE` for each of
    `run_fields`, its folder `run_dir/name`, and no progress bar."""
    fields = [f"run.{field}={value}" for field, value in run_fields.items()]
    return [*fields, f"run.run_dir={run_dir}", f"run.name={name}", "run.progress=false"]


def train_seed(
    args: argparse.Namespace, root: Path, seed: int, extra_env: dict[str, str] | None = None
) -> tuple[Path, float]:
    """Train `args.config` with `args.set` at `seed` into `root/seed<seed>` within
    `args.timeout`: the run's folder and its wall-clock seconds, launch to exit."""
    name = f"seed{seed}"
    settings = [*args.set, *run_settings(root, name, seed=seed)]
    _, train_s = run_job(train_command(args.config, settings), name, args.timeout, extra_env)
    return root / name, train_s


def train_command(config: Path, settings: list[str]) -> list[str]:
    """`agentenv train config --set SETTING ...` in this interpreter."""
    command = [sys.executable, "-m", "agentenv_jax.workflow.cli", "train", str(config)]
    return command + [part for setting in settings for part in ("--set", setting)]


def run_agentenv_mpi(
    ranks: int,
    config: Path,
    overrides: list[str],
    label: str,
    timeout: float,
    extra_env: dict[str, str] | None = None,
) -> float:
    """`mpiexec -n ranks agentenv train config --set ...`; the job's wall-clock seconds."""
    command = under_mpiexec(ranks, train_command(config, overrides))
    return run_job(command, label, timeout, extra_env)[1]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def update_seconds(timings: list[dict[str, Any]]) -> list[float]:
    """Each update's seconds after the first (which holds the XLA compiles), from a run's
    `timings.jsonl` records: the differences of their `wall_s`, the end of each update."""
    ends = [record["wall_s"] for record in timings]
    return [later - earlier for earlier, later in zip(ends, ends[1:], strict=False)]


@contextlib.contextmanager
def runs_folder(keep_runs: Path | None, prefix: str) -> Iterator[Path]:
    """Where a benchmark's training runs go: `keep_runs` (created if need be, and kept), else a
    temporary folder removed when the block ends."""
    root = keep_runs or Path(tempfile.mkdtemp(prefix=prefix))
    root.mkdir(parents=True, exist_ok=True)
    try:
        yield root
    finally:
        if keep_runs is None:
            shutil.rmtree(root, ignore_errors=True)


# The packages every script's numbers depend on (the `bench` extra's among them), by their
# distribution names; a script names its own extras.
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "gymnasium", "mpi4py", "mpich")


def provenance(*extra_packages: str) -> str:
    """Two lines for a report's header: the commit the package was at (`git describe --dirty`:
    a `-dirty` suffix says the numbers are not those of the commit) and the machine with the
    versions of the packages used."""
    import importlib.metadata
    import platform

    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
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


# --- reports --------------------------------------------------------------------------------


def print_header(header: str) -> None:
    """A text table's header line and the rule under it."""
    print(header)
    print("-" * len(header))


def ratio_cells(ratios: list[float], goal: float) -> str:
    """Median, least and greatest of a case's ratios, and `ok`/`MISS` for the median against
    a goal it should reach."""
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio >= goal else "MISS"
    return f"{ratio:5.3f} {min(ratios):5.3f} {max(ratios):5.3f} {verdict:>5}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def time_to_solve(run: dict[str, Any]) -> float:
    """A run's seconds to the threshold; infinite when it never got there."""
    return run["wall_s"] if run["solved"] else math.inf


def steps_to_solve(run: dict[str, Any]) -> float:
    return run["env_steps"] if run["solved"] else math.inf


def format_solved(value: float, spec: str) -> str:
    return "unsolved" if math.isinf(value) else format(value, spec)


def solve_medians(side_runs: list[dict[str, Any]]) -> tuple[float, float]:
    """The median seconds and env steps to the threshold of a side's runs (`time_to_solve`,
    `steps_to_solve`)."""
    return (
        median([time_to_solve(r) for r in side_runs]),
        median([steps_to_solve(r) for r in side_runs]),
    )


def solved_cells(side_runs: list[dict[str, Any]], med_time: float, med_steps: float) -> str:
    """A side's cells `solved/runs | median s median steps |` in a time-to-threshold report."""
    solved = sum(r["solved"] for r in side_runs)
    return (
        f"{solved:>2}/{len(side_runs):<3} | {format_solved(med_time, '8.1f'):>8} "
        f"{format_solved(med_steps, ',.0f'):>12} |"
    )


def run_seeds(
    sides: list[str],
    seeds: list[int],
    run_side: Callable[[str, int, Path], dict[str, Any]],
    describe: Callable[[str, dict[str, Any]], str],
    run_root: Path,
) -> dict[str, list[dict[str, Any]]]:
    """Every side on every seed, `run_side(side, seed, run_root)`, printing `describe(side,
    run)` after each. The side that goes first rotates with the seed, so drift in the machine's
    load does not always favour the same side. Each side's runs come back in seed order."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for index, seed in enumerate(seeds):
        order = sides[index % len(sides) :] + sides[: index % len(sides)]
        for side in order:
            run = run_side(side, seed, run_root)
            run["seed"] = seed
            runs[side].append(run)
            print(f"  seed {seed} {describe(side, run)}", flush=True)
    for side_runs in runs.values():
        side_runs.sort(key=lambda r: seeds.index(r["seed"]))
    return runs
