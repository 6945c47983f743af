"""Run a sweep's trials, N at a time, each its own `agentenv train` process or `mpiexec` job.

A sweep is resumable: a trial whose run finished is skipped; one that was stopped with a
checkpoint continues with `agentenv train --resume`; one killed before its first checkpoint
starts again. Killing the sweep itself (even with SIGKILL) stops its trials: each is started
with the kernel's parent-death signal set to SIGTERM, which makes a run checkpoint and stop.
SIGTERM or Ctrl-C on the sweep stops the trials the same way and waits for them.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

import yaml

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import with_defaults
from agentenv_jax.runtime.mpi_job import environment_without_launcher, find_mpiexec
from agentenv_jax.runtime.supervisor import signal_when_parent_dies
from agentenv_jax.workflow.sweeps.results import (
    keep_newest_session,
    require_statistics,
    sessions_file,
    trial_folder,
    trial_row,
    trial_status,
    write_results,
)
from agentenv_jax.workflow.sweeps.spec import SweepSpec, Trial, check_trials, expand

_POLL_S = 0.2


def _die_with_sweep() -> None:
    """In a trial's process, before it runs: SIGTERM (a checkpoint, then stop) when the sweep
    dies."""
    signal_when_parent_dies(signal.SIGTERM)


def prepare(spec: SweepSpec) -> list[Trial]:
    """Check the sweep before anything runs and claim its folder: every trial's config builds,
    rliable is there, and a folder left by an earlier start belongs to this same sweep.
    Returns the trials."""
    trials = expand(spec)
    check_trials(spec, trials)
    require_statistics()
    identity = spec.identity()
    record = spec.folder / "sweep.yaml"
    if record.is_file():
        earlier = yaml.safe_load(record.read_text())
        # Settings added since the sweep began ran with their defaults.
        earlier["base_config"] = with_defaults(earlier.get("base_config", {}))
        changed = [k for k in identity if earlier.get(k) != identity[k]]
        if changed:
            raise ConfigError(
                f"sweep {spec.name!r}: {spec.folder} holds a sweep whose {changed[0]} differs "
                f"from this one's ({earlier.get(changed[0])!r} there, {identity[changed[0]]!r} "
                "here); resuming it would mix two sweeps: give this one another name"
            )
    else:
        spec.folder.mkdir(parents=True, exist_ok=True)
        record.write_text(yaml.safe_dump(identity, sort_keys=False))
    return trials


def trial_command(spec: SweepSpec, trial: Trial, launcher: Sequence[str] = ()) -> list[str]:
    """The trial's `agentenv train` command, resuming its run if it has a checkpoint (after
    keeping the wall time of the session it resumes, whose summary the new one replaces), else
    starting it afresh. With `ranks` > 1 it runs under `launcher` (`srun ...` in a Slurm
    allocation), by default `mpiexec -n RANKS`."""
    from agentenv_jax.checkpoint.run_folder import has_checkpoint

    folder = trial_folder(spec, trial)
    if has_checkpoint(folder):
        keep_newest_session(spec, trial)
        train = ["train", "--resume", str(folder)]
    else:
        if folder.exists():  # killed before its first checkpoint: nothing to continue
            shutil.rmtree(folder)
        sessions_file(spec, trial).unlink(missing_ok=True)  # those of the run just removed
        settings = [
            *spec.overrides,
            *trial.overrides(),
            f"run.run_dir={folder.parent}",
            f"run.name={trial.name}",
            f"run.compilation_cache_dir={spec.folder / 'compilation_cache'}",
        ]
        train = ["train", str(spec.base)] + [a for s in settings for a in ("--set", s)]
    command = [sys.executable, "-m", "agentenv_jax.workflow.cli", *train]
    if launcher:
        return [*launcher, *command]
    if spec.ranks == 1:
        return command
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise ConfigError(f"sweep {spec.name!r}: ranks = {spec.ranks} needs mpiexec; none found")
    return [mpiexec, "-n", str(spec.ranks), *command]


def progress_heads(
    statuses: Mapping[str, str], ended: Sequence[str], running: Collection[str] = ()
) -> list[str]:
    """The `[done/total done]` head of each trial in `ended`, the trials one poll found ended,
    in the order they are reported. `statuses` maps every trial of the sweep to its status on
    disk, where all of `ended` already show theirs, and so may trials still `running` (a run
    writes its summary before its process exits): counting every finished status would give
    two trials ending in one poll the same count. So the trials finished before (here, or in
    another array task) count first, then each finished trial of `ended` in turn ([1/2 done],
    then [2/2 done]), and a running one only when its own end is reported."""
    later = {*ended, *running}
    done = sum(status == "finished" for name, status in statuses.items() if name not in later)
    heads = []
    for name in ended:
        done += statuses[name] == "finished"
        heads.append(f"[{done}/{len(statuses)} done]")
    return heads


@dataclasses.dataclass
class _Running:
    trial: Trial
    process: subprocess.Popen
    log: IO[str]
    started: float


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


class SweepRunner:
    """Runs the trials not yet finished, `spec.parallel` at a time, rewriting the results
    tables as each ends. `run()` returns the exit status (0: every trial finished)."""

    def __init__(
        self,
        spec: SweepSpec,
        trials: Sequence[Trial],
        say: Callable[[str], None] = print,
        launcher: Sequence[str] = (),
    ) -> None:
        self.spec = spec
        self.trials = list(trials)  # every trial of the sweep: the tables cover them all
        self.say = say
        self.launcher = tuple(launcher)
        self.stopping = False
        self.failed: list[Trial] = []

    def _start(self, trial: Trial) -> _Running:
        logs = self.spec.folder / "logs"
        logs.mkdir(exist_ok=True)
        command = trial_command(self.spec, trial, self.launcher)
        log = open(logs / f"{trial.name}.log", "a")  # noqa: SIM115 (closed when it ends)
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment_without_launcher(),
            preexec_fn=_die_with_sweep,
        )
        verb = "resumed" if "--resume" in command else "started"
        self.say(f"{verb} trial {trial.index + 1} of {len(self.trials)}: {trial.name}")
        return _Running(trial, process, log, time.perf_counter())

    def _finished(self, ended: Sequence[_Running], running: Sequence[_Running] = ()) -> None:
        """Report the trials whose processes one poll found ended, in order, after rewriting the
        tables once; `running` are those still running."""
        for r in ended:
            r.log.close()
        rows, _ = write_results(self.spec, self.trials)
        statuses = {row["trial"]: row["status"] for row in rows}
        names = [r.trial.name for r in ended]
        heads = progress_heads(statuses, names, [r.trial.name for r in running])
        for running, head in zip(ended, heads, strict=True):
            self._say_ended(running, head)

    def _say_ended(self, running: _Running, head: str) -> None:
        trial = running.trial
        row = trial_row(self.spec, trial)
        status = row["status"]
        took = time.perf_counter() - running.started
        if status == "finished":
            self.say(
                f"{head} finished {trial.name}: {self.spec.metric} {row[self.spec.metric]:.4g}, "
                f"{took:.0f} s, compiling {row['compile_s'] or 0.0:.1f} s"
            )
        elif status == "interrupted":
            self.say(f"{head} stopped {trial.name} (checkpointed; resumes with the sweep)")
        else:
            self.failed.append(trial)
            log = self.spec.folder / "logs" / f"{trial.name}.log"
            self.say(
                f"{head} FAILED {trial.name} (exit {running.process.returncode}): "
                f"{_last_line(log)}   (log: {log})"
            )

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def run(self, only: Sequence[Trial] | None = None) -> int:
        """Run the unfinished trials (of `only`, if given); 130 when stopped by a signal, 1
        when a trial failed, else 0."""
        chosen = self.trials if only is None else list(only)
        todo = [t for t in chosen if trial_status(trial_folder(self.spec, t)) != "finished"]
        done = len(chosen) - len(todo)
        self.say(
            f"sweep {self.spec.name}: {len(chosen)} trials ({done} finished earlier, "
            f"{len(todo)} to run), {self.spec.parallel} at a time, in {self.spec.folder}"
        )
        handlers = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        running: list[_Running] = []
        try:
            while (todo and not self.stopping) or running:
                while todo and len(running) < self.spec.parallel and not self.stopping:
                    running.append(self._start(todo.pop(0)))
                if self.stopping:
                    for r in running:
                        if r.process.poll() is None:
                            r.process.send_signal(signal.SIGTERM)
                ended = [r for r in running if r.process.poll() is not None]
                if ended:
                    running = [r for r in running if r not in ended]
                    self._finished(ended, running)
                time.sleep(_POLL_S)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        rows, configs = write_results(self.spec, self.trials)
        finished = sum(r["status"] == "finished" for r in rows)
        self.say(
            f"sweep {self.spec.name}: {finished}/{len(rows)} trials finished; results in "
            f"{self.spec.folder / 'results.md'}"
        )
        if configs and configs[0][f"{self.spec.metric}_iqm"] is not None:
            best = configs[0]
            params = ", ".join(f"{k}={best[k]}" for k, _ in self.spec.parameters)
            self.say(
                f"best config {best['config']} ({params or 'base'}): {self.spec.metric} IQM "
                f"{best[f'{self.spec.metric}_iqm']:.4g} "
                f"[{best['ci_low']:.4g}, {best['ci_high']:.4g}] over {best['seeds']} seeds"
            )
        if self.stopping:
            self.say("sweep stopped: run the same command again to continue it")
            return 130
        return 1 if self.failed else 0
