"""Language-model weights from a local orbax checkpoint, checked leaf by leaf against a model.

A pretrained checkpoint is one directory written by `save_language_model` (orbax's
`StandardCheckpointer`): the parameter pytree of `networks.language_model` and nothing else. A
run that starts from one restores it with `load_language_model`, which compares every leaf's path
and shape with the model's `param_shapes()` before reading any array, so a checkpoint of another
size or critic layout fails with the name of the first leaf that differs rather than orbax's
message about tensorstore specs.

orbax is imported inside the functions: its import takes most of a second (see `store`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

from agentenv_jax.checkpoint.store import CheckpointError


def save_language_model(
    path: str | os.PathLike[str], params: Any, *, overwrite: bool = False
) -> Path:
    """Write `params` (a pytree of arrays) as an orbax checkpoint directory at `path` and wait
    until it is complete on disk; the absolute path. An existing `path` is an error unless
    `overwrite`."""
    import orbax.checkpoint as ocp

    directory = Path(path).resolve()
    if directory.exists() and not overwrite:
        raise CheckpointError(f"{directory} exists already (pass overwrite=True to replace it)")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory, params, force=overwrite)
        checkpointer.wait_until_finished()
    return directory


def _leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """`{"['policy']['final_norm']['scale']": shape}` for each leaf of `tree`, in tree order."""
    return {
        jax.tree_util.keystr(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def _first_mismatch(
    saved: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]
) -> str | None:
    """What is wrong with the first leaf (in the model's order) that differs, or None."""
    for name, shape in expected.items():
        if name not in saved:
            return f"leaf {name} (expected shape {list(shape)}) is missing"
        if saved[name] != shape:
            return f"leaf {name} has shape {list(saved[name])}, expected {list(shape)}"
    for name, shape in saved.items():
        if name not in expected:
            return f"leaf {name} (shape {list(shape)}) is not a parameter of this model"
    return None


def load_language_model(path: str | os.PathLike[str], expected_shapes: Any) -> Any:
    """The parameters saved at `path`, shaped, typed and (where `expected_shapes` carries
    shardings) sharded like `expected_shapes`, a pytree of `jax.ShapeDtypeStruct` (e.g.
    `lm.param_shapes()`); leaves without a sharding come back as host numpy arrays.

    Raises `CheckpointError` if `path` is not a checkpoint, or names the first leaf that is
    missing, unexpected or of another shape.
    """
    import orbax.checkpoint as ocp

    directory = Path(path).resolve()
    if not directory.is_dir():
        raise CheckpointError(f"no language-model checkpoint at {directory}: not a directory")
    expected = _leaf_shapes(expected_shapes)
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            metadata = checkpointer.metadata(directory).item_metadata
        except Exception as err:  # orbax raises several kinds for a folder it cannot read
            raise CheckpointError(
                f"{directory} is not a readable orbax checkpoint: {type(err).__name__}: "
                f"{str(err)[:300]}"
            ) from err
        saved = _leaf_shapes(getattr(metadata, "tree", metadata))
        problem = _first_mismatch(saved, expected)
        if problem is not None:
            raise CheckpointError(
                f"language-model checkpoint {directory} does not fit this model: {problem} "
                f"(the model has {len(expected)} parameter leaves, the checkpoint {len(saved)})"
            )
        try:
            return checkpointer.restore(directory, expected_shapes)
        except Exception as err:  # e.g. a truncated array file
            raise CheckpointError(
                f"could not restore language-model checkpoint {directory}: "
                f"{type(err).__name__}: {str(err)[:300]}"
            ) from err
