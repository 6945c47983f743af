"""Save and restore the learner with orbax's `CheckpointManager`.

A checkpoint is one step folder under `RUN_DIR/checkpoints/` holding two items: `state` (the
learner's train-state pytree: parameters, optimizer state, target networks, PRNG key, update
count) and `meta` (JSON: counters, normalizer statistics, the return window, the resolved
config). Orbax writes each step into a temporary folder and renames it when complete, so a
crash mid-save never leaves a checkpoint that looks finished.

orbax is imported by the methods that use it, not with this module: its import takes most of a
second, and a learner opens its store after it has started compiling its update, so the two
overlap; env ranks, which never checkpoint, do not load it at all.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or from an incompatible experiment."""


class CheckpointStore:
    """The checkpoints of one run directory; keeps the newest `keep`."""

    def __init__(self, run_dir: Path, keep: int):
        import orbax.checkpoint as ocp

        self.directory = Path(run_dir).resolve() / "checkpoints"
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
        )
        self._last_save = time.monotonic()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def steps(self) -> list[int]:
        """The steps of the checkpoints on disk, oldest first."""
        return sorted(self._manager.all_steps())

    def seconds_since_save(self) -> float:
        return time.monotonic() - self._last_save

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write checkpoint `step` and wait until it is complete on disk."""
        import orbax.checkpoint as ocp

        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self._manager.wait_until_finished()
        self._last_save = time.monotonic()

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The metadata of the newest (or given) checkpoint, without loading the state."""
        import orbax.checkpoint as ocp

        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def restore_raw(self, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """The newest (or given) checkpoint as saved, for inspection: every array whole on this
        process's first device, whatever mesh (and however many learner processes) saved it."""
        import jax
        import orbax.checkpoint as ocp

        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        saved = self._manager.item_metadata(step)["state"]
        one_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=one_device),
            getattr(saved, "tree", saved),
        )
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["meta"])

    def restore(self, like_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """The newest (or given) checkpoint: a state shaped and sharded like `like_state`, and
        its metadata."""
        import jax
        import orbax.checkpoint as ocp

        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_state)
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
                ),
            )
        except Exception as err:  # orbax raises many kinds on structure or shape mismatches
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} does not match this experiment's "
                f"learner state: {type(err).__name__}: {str(err)[:300]}"
            ) from err
        return restored["state"], dict(restored["meta"])

    def close(self) -> None:
        self._manager.close()
