"""A run folder: what it holds, whether it holds a run, whether it can resume with a config, and
which checkpoint; and, while a job uses it, one job at a time (a lock) and one record per update
across the sessions of a resumed run.

RUN_DIR = `run.run_dir`/`run.name` holds config.yaml (the resolved config), metrics.jsonl and
timings.jsonl (one record per update), events.jsonl, summary.json (when a session ends),
checkpoints/N (orbax, N the update) with the replay partitions saved beside them, and run.lock.
Launch, the learner's session, the JAX-env learner, the API and sweeps ask here. The checkpoint
store (which imports jax) is imported by the functions that open one: the supervisor, the
CLI and sweeps ask about folders without paying for jax.

The lock is an `flock` on RUN_DIR/run.lock held by the lead learner's process for the whole
session, so the kernel releases it when that process ends however it ends: a lock left by a
killed job is free again without anyone cleaning up. The file names the job that holds it (its
pid, host, start time, command and Slurm job), for the message that refuses a second start.
Where the file system does not support `flock`, the holder's pid is checked instead (on this
host; a holder on another host is trusted until the user removes the file).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import config_to_dict, with_defaults
from agentenv_jax.config.schema import ExperimentConfig

LOCK_FILE = "run.lock"
CHECKPOINTS = "checkpoints"
# Settings a checkpoint's learner state depends on: a resumed run may change budgets, topology,
# logging and checkpoint cadence, but not these. With `env.backend: jax` the envs' state is part
# of the learner's, one row per env, so their count is too.
_STATE_DEFINING = ("env.id", "env.backend", "network", "algorithm.name")
_JAX_ENV_STATE_DEFINING = ("env.global_num_envs",)
# Per-update record files of a run: cut back to the restored checkpoint when a run resumes.
RECORD_FILES = ("metrics.jsonl", "timings.jsonl")


class RunFolderInUse(ConfigError):
    """Another job is training into this run folder."""


class RunFolderLock:
    """Holds RUN_DIR/run.lock until `release` (or until this process ends)."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir = run_dir
        self._fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file, then drop the lock (a job that opened the file meanwhile finds
        it gone once it holds the lock, and takes the new one), and the run folder if it stayed
        empty (a start called off before it wrote anything)."""
        if self._fd is None:
            return
        (self.run_dir / LOCK_FILE).unlink(missing_ok=True)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None
        try:
            self.run_dir.rmdir()
        except OSError:
            pass  # it holds the run


def _holder_record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
    }


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def describe_holder(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "a job whose lock record is unreadable"
    job = f", Slurm job {holder['slurm_job']}" if holder.get("slurm_job") else ""
    return (
        f"pid {holder.get('pid')} on {holder.get('host')}{job}, started {holder.get('started')}: "
        f"{holder.get('command')}"
    )


def _pid_alive_here(holder: dict[str, Any]) -> bool:
    """Whether the holder (without flock to tell) may still run: alive on this host, or on
    another host, which cannot be checked from here."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True
    return True


def lock_run_folder(run_dir: str | Path) -> RunFolderLock:
    """Take RUN_DIR's lock for this process, or raise `RunFolderInUse` naming the job that holds
    it. A lock whose holder has ended is taken over."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _take(fd, path):
                raise RunFolderInUse(
                    f"{run_dir} is in use by a running job "
                    f"({describe_holder(_read_holder(path))}); wait for it to end or stop it "
                    "first (a lock left by a job that has ended is taken over; where the file "
                    f"system has no flock, remove {path} once that job is gone)"
                )
            if os.fstat(fd).st_ino != _inode(path):
                os.close(fd)  # released and removed while this process waited: take the new one
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(_holder_record()) + "\n").encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return RunFolderLock(run_dir, fd)


def _take(fd: int, path: Path) -> bool:
    """Whether this process now holds the lock on `fd`."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        holder = _read_holder(path)
        return holder is None or not _pid_alive_here(holder)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def cut_records_after(run_dir: str | Path, update: int) -> int:
    """Drop the per-update records past `update` (the checkpoint a resume restored), which a
    session that died after its last checkpoint left behind: the resumed session writes those
    updates again. Returns how many metrics records were cut."""
    cut = 0
    for name in RECORD_FILES:
        path = Path(run_dir) / name
        if not path.exists():
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _update_of(line) <= update]
        if len(kept) == len(lines):
            continue
        if name == RECORD_FILES[0]:
            cut = len(lines) - len(kept)
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(kept))
        os.replace(partial, path)  # a crash now leaves either file whole
    return cut


def _update_of(line: str) -> float:
    """A record's update number; a torn last line (a kill mid-write) counts as past any."""
    try:
        return float(json.loads(line)["update"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


def restore_kept(run_dir: str | Path, keep: int, checkpoint: int | None = None):
    """`(step, state, meta)` of run `run_dir`'s checkpoint `checkpoint` (the newest when None),
    as saved; `CheckpointError` naming the kept ones when it is not among them."""
    from agentenv_jax.checkpoint.store import CheckpointError, CheckpointStore

    store = CheckpointStore(Path(run_dir), keep)
    try:
        kept = store.steps()
        if checkpoint is not None and checkpoint not in kept:
            raise CheckpointError(
                f"checkpoint = {checkpoint} is not in {store.directory}: kept are {kept}"
            )
        step = checkpoint if checkpoint is not None else store.latest_step()
        state, meta = store.restore_raw(step)
    finally:
        store.close()
    return step, state, meta


def policy_params(run_dir: str | Path, config: Any) -> Any:
    """The policy's parameters (a host pytree) in run `run_dir`'s newest checkpoint: the
    actor-critic's for PPO and IMPALA, the actor's for SAC (`config` is the run's
    `ExperimentConfig`); `CheckpointError` when the folder has no checkpoint."""
    from agentenv_jax.checkpoint.store import CheckpointStore

    store = CheckpointStore(Path(run_dir), config.checkpoint.keep)
    try:
        state, _ = store.restore_raw()
    finally:
        store.close()
    return state["actor_params" if config.algorithm.name == "sac" else "params"]


def folder_of(config: ExperimentConfig) -> Path:
    """RUN_DIR of a config whose `run.name` is set (`with_run_name`)."""
    if config.run.name is None:
        raise ValueError("the run directory of an unnamed run is not decided yet")
    return Path(config.run.run_dir) / config.run.name


def with_run_name(config: ExperimentConfig, name: str | None = None) -> ExperimentConfig:
    """`config` with `run.name` set: to `name`, or for an unnamed run to a fresh
    `<env>-<algorithm>-<time>` folder name, so that every rank agrees on RUN_DIR."""
    if name is None:
        if config.run.name is not None:
            return config
        name = stem = (
            f"{config.env.id.replace(':', '_').replace('/', '_')}-{config.algorithm.name}-"
            f"{time.strftime('%Y%m%d-%H%M%S')}"
        )
        suffix = 1
        while (Path(config.run.run_dir) / name).exists():  # unnamed runs started together
            suffix += 1
            name = f"{stem}-{suffix}"
    return dataclasses.replace(config, run=dataclasses.replace(config.run, name=name))


def has_checkpoint(path: str | Path) -> bool:
    """Whether folder `path` holds at least one checkpoint (checkpoints/N)."""
    checkpoints = Path(path) / CHECKPOINTS
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


def holds_run(path: str | Path) -> bool:
    """Whether folder `path` holds a run: records or a checkpoint. A start called off early
    leaves at most config.yaml and an empty checkpoints folder: not a run."""
    return (Path(path) / "metrics.jsonl").exists() or has_checkpoint(path)


def check_new_run(config: ExperimentConfig, resume: bool) -> None:
    """A new run must not write into an earlier run's folder (its metrics and checkpoints)."""
    if resume or config.run.name is None:
        return  # resuming is the point; unnamed runs get a fresh timestamped folder
    path = folder_of(config)
    if holds_run(path):
        raise ConfigError(
            f"run.name = {config.run.name!r}: {path} already holds a run; continue it with "
            f"`agentenv train --resume {path}`, or choose another run.name"
        )


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def check_compatible(saved: dict[str, Any], current: ExperimentConfig, where: Path) -> None:
    """`CheckpointError` naming the first setting that makes a checkpoint written with config
    `saved` (a dict) unusable by `current`."""
    from agentenv_jax.checkpoint.store import CheckpointError

    now = config_to_dict(current)
    saved = with_defaults(saved)
    settings = _STATE_DEFINING
    if current.env.backend == "jax":
        settings += _JAX_ENV_STATE_DEFINING
    for dotted in settings:
        before, after = _lookup(saved, dotted), _lookup(now, dotted)
        if isinstance(before, dict) and isinstance(after, dict):
            for key in sorted(set(before) | set(after)):
                if before.get(key) != after.get(key):
                    raise CheckpointError(
                        f"checkpoint {where} was written with {dotted}.{key} = "
                        f"{before.get(key)!r}; this config has {after.get(key)!r}"
                    )
        elif before != after:
            raise CheckpointError(
                f"checkpoint {where} was written with {dotted} = {before!r}; "
                f"this config has {after!r}"
            )


def check_resumable(config: ExperimentConfig, path: str | Path) -> None:
    """Fail early (before any rank starts its loop) if folder `path` cannot be resumed with
    this config: no checkpoint, or one written by an incompatible experiment."""
    from agentenv_jax.checkpoint.store import CheckpointStore

    store = CheckpointStore(Path(path), config.checkpoint.keep)
    try:
        check_compatible(store.read_meta()["config"], config, store.directory)
    finally:
        store.close()


def newest_checkpoint(config: ExperimentConfig, path: str | Path) -> int | None:
    """The update of folder `path`'s newest checkpoint, None when it has none."""
    from agentenv_jax.checkpoint.store import CheckpointStore

    store = CheckpointStore(Path(path), config.checkpoint.keep)
    try:
        return store.latest_step()
    finally:
        store.close()


def saved_replay_to_restore(config: ExperimentConfig, path: str | Path) -> tuple[int, int] | None:
    """The (checkpoint update, partition count) of the replay set a resumed run loads back: the
    one saved with the newest checkpoint, if `checkpoint.save_replay` is on and every partition
    of it is on disk."""
    if not config.checkpoint.save_replay:
        return None
    update = newest_checkpoint(config, path)
    if update is None:
        return None
    from agentenv_jax.checkpoint import replay_files

    count = replay_files.complete_set(Path(path), update)
    return None if count is None else (update, count)
