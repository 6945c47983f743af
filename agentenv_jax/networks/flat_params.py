"""Parameters as one flat float32 vector: the form in which they cross MPI.

The layout (leaf order of `jax.tree_util`, each leaf raveled row-major) is the one
`jax.flatten_util.ravel_pytree` uses, but it is derived from shapes alone (`jax.eval_shape`), so
env ranks learn it without initializing a network, and `unravel` is plain slicing that fuses
into the jitted policy. A layout of nested dicts also travels as its leaves' key paths and
shapes (`leaf_paths`), from which an env rank that acts in numpy rebuilds it without importing
JAX (`from_leaf_paths`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

LeafPaths = list[tuple[tuple[str, ...], tuple[int, ...]]]  # (dict keys, shape), in leaf order


class FlatLayout:
    """Where each parameter leaf lives in the flat vector."""

    def __init__(self, params_shape: Any):
        import jax

        with_paths, treedef = jax.tree_util.tree_flatten_with_path(params_shape)
        self._shapes = [tuple(leaf.shape) for _, leaf in with_paths]
        self._sizes = [math.prod(shape) for shape in self._shapes]
        self.num_params = sum(self._sizes)
        self._unflatten: Callable[[list[Any]], Any] = treedef.unflatten
        keys = [[getattr(entry, "key", None) for entry in path] for path, _ in with_paths]
        # Only a tree of dicts with string keys is rebuilt from its paths alone.
        self._paths = None
        if all(isinstance(k, str) for path in keys for k in path):
            self._paths = [tuple(path) for path in keys]

    @classmethod
    def of(cls, init_fn: Callable[[], Any]) -> FlatLayout:
        """The layout of the pytree `init_fn()` would return, without computing it."""
        import jax

        return cls(jax.eval_shape(init_fn))

    @classmethod
    def from_leaf_paths(cls, leaves: Sequence[tuple[Sequence[str], Sequence[int]]]) -> FlatLayout:
        """The layout whose `leaf_paths()` are `leaves`, without JAX: `unravel` gives nested
        dicts of views into the flat vector (numpy or JAX arrays alike)."""
        layout = cls.__new__(cls)
        layout._paths = [tuple(path) for path, _ in leaves]
        layout._shapes = [tuple(int(n) for n in shape) for _, shape in leaves]
        layout._sizes = [math.prod(shape) for shape in layout._shapes]
        layout.num_params = sum(layout._sizes)
        layout._unflatten = layout._nested_dicts
        return layout

    def leaf_paths(self) -> LeafPaths:
        """Each leaf's dict keys and shape, in leaf order: what `from_leaf_paths` reads. A
        `ValueError` for a tree that is not dicts of string keys all the way down."""
        if self._paths is None:
            raise ValueError("only a layout of nested dicts with string keys has leaf paths")
        return list(zip(self._paths, self._shapes, strict=True))

    def _nested_dicts(self, leaves: list[Any]) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        for path, leaf in zip(self._paths, leaves, strict=True):
            node = tree
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = leaf
        return tree

    def ravel(self, params: Any) -> Any:
        """`params` pytree -> `[num_params]` float32 (a JAX array)."""
        import jax
        import jax.numpy as jnp

        leaves = jax.tree_util.tree_leaves(params)
        return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])

    def unravel(self, flat: Any) -> Any:
        """`[num_params]` -> the params pytree (slices of `flat`)."""
        leaves, offset = [], 0
        for shape, size in zip(self._shapes, self._sizes, strict=True):
            leaves.append(flat[offset : offset + size].reshape(shape))
            offset += size
        return self._unflatten(leaves)
