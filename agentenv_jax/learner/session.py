"""A learner's run from start to end: resume, periodic and final checkpoints, preemption.

SIGTERM (Slurm preemption), SIGINT (Ctrl-C), SIGHUP (a closed terminal) and SIGUSR2 (the stop
request Open MPI's `mpirun` passes on without ending the job) only set a flag; the
loop stops collecting at the next update boundary, writes a final checkpoint and returns
normally, so every rank shuts down through the same stop protocol as a finished run. A second
signal, more than `run.stop_signal_window_s` (a second) later, interrupts at once.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentenv_jax.checkpoint import replay_files
from agentenv_jax.checkpoint.run_folder import check_compatible, cut_records_after
from agentenv_jax.checkpoint.store import CheckpointStore
from agentenv_jax.config.loading import config_to_dict
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.transport.base import LearnerGroup, SoloLearnerGroup

# Signals that ask the run to stop: preemption, Ctrl-C, the hang-up of a closed terminal (which
# would otherwise kill the rank without a checkpoint), and SIGUSR2. NOTE: Open MPI's `mpirun`
# takes SIGTERM, SIGINT and SIGHUP as "end the job": it passes the signal on and kills every rank
# ~0.2 s later, before a final checkpoint; SIGUSR2 it only passes on (docs/cluster.md).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)


def state_checksum(state: Any) -> float:
    """A fingerprint of a train state: the float64 sum of |x| over its floating-point leaves."""
    import jax  # here: env ranks read STOP_SIGNALS from this module

    leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]
    return float(
        sum(
            np.abs(x.astype(np.float64)).sum()
            for x in leaves
            if np.issubdtype(x.dtype, np.floating)
        )
    )


class LearnerSession:
    """Drives `learner` (`start`, `run_once`, `done`, `updates`, `state`, `checkpoint_meta`,
    `restore`) and owns its checkpoints.

    With several learner processes (`group`), every one runs a session: checkpoints are saved
    by all of them together (orbax, multi-process), and the decisions that lead to a collective
    (stop after a signal, save on the clock) are agreed first, so none waits alone; learner 0
    alone writes events.
    """

    def __init__(
        self,
        learner: Any,
        config: ExperimentConfig,
        run_dir: Path,
        resume: bool,
        group: LearnerGroup | None = None,
    ):
        self.learner = learner
        self.config = config
        self._group = group or SoloLearnerGroup()
        self._run_dir = Path(run_dir)
        self._events = self._run_dir / "events.jsonl"
        self.store = CheckpointStore(run_dir, config.checkpoint.keep)
        self.interrupted = False
        self._first_signal_at: float | None = None
        self._stopped_at_once = False
        self._previous_handlers: dict[int, Any] = {}
        self._late_copy_handlers: dict[int, Any] = {}
        self._last_saved_update = -1
        self._resumed = resume
        self._records_cut = 0
        if resume:
            check_compatible(self.store.read_meta()["config"], config, self.store.directory)
            state, meta = self.store.restore(learner.state)
            learner.restore(state, meta["learner"])
            self._last_saved_update = learner.updates
            if self._group.index == 0:  # the writer of the records
                self._records_cut = cut_records_after(self._run_dir, learner.updates)

    def _event(self, kind: str, **fields: Any) -> None:
        """One line in RUN_DIR/events.jsonl: resumes, checkpoints, interruptions."""
        if self._group.index != 0:
            return
        record = {"event": kind, "time": time.time(), "update": self.learner.updates, **fields}
        with open(self._events, "a") as f:
            f.write(json.dumps(record) + "\n")

    def record_start(
        self, processes: dict[int, dict[str, Any]], runtime: dict[str, Any] | None = None
    ) -> None:
        """Once every rank has started: which process plays which rank (for whoever has to
        find a stuck or dead one), what the job runs on (`runtime`: launcher, PMI, MPI library;
        see `doctor.runtime_record`) and, for a resumed run, the restored state's checksum. A
        start that is called off before this writes nothing into the run."""
        self._event(
            "start",
            processes={str(rank): info for rank, info in processes.items()},
            runtime=runtime or {},
        )
        if self._resumed:
            # `records_cut`: updates the session before had recorded past its last checkpoint,
            # which this one trains again (one record per update stays in metrics.jsonl).
            self._event(
                "resume",
                state_checksum=state_checksum(self.learner.state),
                records_cut=self._records_cut,
            )

    def _on_signal(self, signum: int, frame: Any) -> None:
        # One request can arrive twice: from the rank's supervisor and, under Slurm, which
        # signals every process of a job step, directly. Only a later signal means "now".
        now = time.monotonic()
        if self._first_signal_at is None:
            self._first_signal_at = now
            self.interrupted = True
        elif now - self._first_signal_at > self.config.run.stop_signal_window_s:
            self._event("interrupted", at_once=True)
            self._stopped_at_once = True  # even mid-shutdown: no final checkpoint follows
            raise KeyboardInterrupt

    def install_signal_handlers(self) -> None:
        """Take stop signals until `restore_signal_handlers`, which the caller does only once
        the run has returned: a copy of the request that arrives after the final checkpoint
        must still count as the same request."""
        for sig in STOP_SIGNALS:
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def restore_signal_handlers(self) -> None:
        """Give the stop signals back to their previous handlers. After a stop request, each
        first passes through `_late_copy` until the request's window has passed: the process
        (or the caller's notebook) still ends what it was doing after the run returned, and a
        copy arriving then must not kill it."""
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler if self._first_signal_at is None else self._late_copy)
        self._late_copy_handlers = dict(self._previous_handlers)
        self._previous_handlers.clear()

    def _late_copy(self, signum: int, frame: Any) -> None:
        # Within the window: the same request, already honoured. Later: a new signal for
        # whoever handled it before the run, delivered again once their handler is back.
        if time.monotonic() - self._first_signal_at <= self.config.run.stop_signal_window_s:
            return
        for sig, handler in self._late_copy_handlers.items():
            signal.signal(sig, handler)
        signal.raise_signal(signum)

    @property
    def running(self) -> bool:
        """Whether to take another round (call once per round: with several learners it is a
        collective, so a signal that reached one of them stops all of them)."""
        self.interrupted = self._group.any(self.interrupted)
        return not self.learner.done and not self.interrupted

    def after_round(self) -> None:
        """Checkpoint if the cadence says so (call after each `learner.run_once`)."""
        every = self.config.checkpoint.every_updates
        minutes = self.config.checkpoint.every_minutes
        updates = self.learner.updates
        if updates == self._last_saved_update:
            return
        due = bool(every and updates % every == 0) or bool(
            minutes and self.store.seconds_since_save() >= 60 * minutes
        )
        if self._group.any(due):  # learners' clocks differ; the save is collective
            self.save()

    def save(self) -> None:
        self.store.save(
            self.learner.updates,
            self.learner.state,
            {"learner": self.learner.checkpoint_meta(), "config": config_to_dict(self.config)},
        )
        self._last_saved_update = self.learner.updates
        if self._group.index == 0:
            self._event("checkpoint", state_checksum=state_checksum(self.learner.state))
        if self.config.checkpoint.save_replay:
            self.learner.checkpoint_saved(self.learner.updates)
            replay_files.prune(self._run_dir, set(self.store.steps()))

    def _final_save_due(self) -> bool:
        return (
            self.config.checkpoint.on_exit
            and self._last_saved_update != self.learner.updates
            and not self._stopped_at_once
        )

    def before_stop(self) -> None:
        """Call before the learner asks env ranks to stop. The final checkpoint is written
        after they have reported (`close`), so it carries the run's whole accounting; replay
        partitions to be saved with it are told so by the stop request."""
        if self._final_save_due() and self.config.checkpoint.save_replay:
            self.learner.checkpoint_saved(self.learner.updates)

    def close(self) -> None:
        """The final checkpoint (unless disabled or already written) and cleanup."""
        if self.interrupted:
            self._event("interrupted")
        if self._final_save_due():
            self.save()
        self.store.close()
