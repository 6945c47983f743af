"""A run folder while a job uses it: one job at a time (a lock), and one record per update across
the sessions of a resumed run.

The lock is an `flock` on RUN_DIR/run.lock held by the lead learner's process for the whole
session, so the kernel releases it when that process ends however it ends: a lock left by a
killed job is free again without anyone cleaning up. The file names the job that holds it (its
pid, host, start time, command and Slurm job), for the message that refuses a second start.
Where the file system does not support `flock`, the holder's pid is checked instead (on this
host; a holder on another host is trusted until the user removes the file).
"""

from __future__ import annotations

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

LOCK_FILE = "run.lock"
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
