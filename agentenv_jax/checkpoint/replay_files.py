"""Saved replay partitions: RUN_DIR/replay/<update>/partition-<i>-of-<n>.npz, one file per env rank.

Env ranks write their own partition when the learner asks (`checkpoint.save_replay`), after the
learner's checkpoint of the same update; a run resumed from that checkpoint loads the set back,
spread over however many env ranks it now has. Each file is written under a temporary name and
renamed when complete, so a set with all `n` files is a whole one. Files are plain numpy arrays:
no pickling, readable without agentenv_jax.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np

from agentenv_jax.checkpoint.store import CheckpointError

_NAME = re.compile(r"partition-(\d+)-of-(\d+)\.npz")


def replay_dir(run_dir: Path, update: int) -> Path:
    return Path(run_dir) / "replay" / str(update)


def save_partition(
    run_dir: Path, update: int, index: int, num_partitions: int, snapshot: dict[str, np.ndarray]
) -> Path:
    """Write env rank `index`'s partition snapshot for checkpoint `update` (atomically)."""
    folder = replay_dir(run_dir, update)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"partition-{index}-of-{num_partitions}.npz"
    unfinished = folder / f".partition-{index}-of-{num_partitions}.{os.getpid()}.npz"
    with open(unfinished, "wb") as f:
        np.savez(f, **snapshot)
    os.replace(unfinished, path)
    return path


def complete_set(run_dir: Path, update: int) -> int | None:
    """How many partitions the saved set of checkpoint `update` has, if every file is there."""
    folder = replay_dir(run_dir, update)
    if not folder.is_dir():
        return None
    found = [_NAME.fullmatch(p.name) for p in folder.iterdir()]
    found = [(int(m[1]), int(m[2])) for m in found if m]
    if not found:
        return None
    num_partitions = found[0][1]
    indices = {i for i, n in found if n == num_partitions}
    return num_partitions if indices == set(range(num_partitions)) else None


def load_share(
    run_dir: Path, update: int, num_saved: int, index: int, num_partitions: int
) -> list[dict[str, np.ndarray]]:
    """The saved transitions env rank `index` of `num_partitions` takes back.

    With as many env ranks as saved partitions each rank takes its own file back unchanged;
    otherwise every rank takes every `num_partitions`-th transition of every file, so the items
    are spread evenly whatever the old and new rank counts.
    """
    folder = replay_dir(run_dir, update)
    shares = []
    for saved in range(num_saved) if num_saved != num_partitions else [index]:
        path = folder / f"partition-{saved}-of-{num_saved}.npz"
        try:
            with np.load(path) as data:
                snapshot = {name: data[name] for name in data.files}
        except (OSError, ValueError, KeyError) as err:
            raise CheckpointError(
                f"cannot read saved replay partition {path} (not a numpy .npz archive as "
                f"saved: {err}); to resume with empty partitions, move {folder} away"
            ) from err
        if num_saved != num_partitions:
            snapshot = {
                name: value if value.ndim == 0 else value[index::num_partitions]
                for name, value in snapshot.items()
            }
        shares.append(snapshot)
    return shares


def prune(run_dir: Path, keep_updates: set[int]) -> None:
    """Delete saved sets whose checkpoint is gone (orbax keeps the newest `checkpoint.keep`),
    sparing any newer than the newest kept checkpoint: env ranks may still be writing it."""
    root = Path(run_dir) / "replay"
    if not root.is_dir() or not keep_updates:
        return
    newest = max(keep_updates)
    for folder in root.iterdir():
        if folder.name.isdigit() and int(folder.name) not in keep_updates:
            if int(folder.name) < newest:
                shutil.rmtree(folder, ignore_errors=True)
