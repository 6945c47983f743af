"""Parameters as one flat float32 vector: the form in which they cross MPI.

The layout (leaf order of `jax.tree_util`, each leaf raveled row-major) is the one
`jax.flatten_util.ravel_pytree` uses, but it is derived from shapes alone (`jax.eval_shape`), so
env ranks learn it without initializing a network, and `unravel` is plain slicing that fuses
into the jitted policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


class FlatLayout:
    """Where each parameter leaf lives in the flat vector."""

    def __init__(self, params_shape: Any):
        leaves, self._treedef = jax.tree_util.tree_flatten(params_shape)
        self._shapes = [tuple(leaf.shape) for leaf in leaves]
        self._sizes = [math.prod(shape) for shape in self._shapes]
        self.num_params = sum(self._sizes)

    @classmethod
    def of(cls, init_fn: Callable[[], Any]) -> FlatLayout:
        """The layout of the pytree `init_fn()` would return, without computing it."""
        return cls(jax.eval_shape(init_fn))

    def ravel(self, params: Any) -> jax.Array:
        """`params` pytree -> `[num_params]` float32."""
        leaves = jax.tree_util.tree_leaves(params)
        return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])

    def unravel(self, flat: jax.Array) -> Any:
        """`[num_params]` -> the params pytree (slices of `flat`)."""
        leaves, offset = [], 0
        for shape, size in zip(self._shapes, self._sizes, strict=True):
            leaves.append(flat[offset : offset + size].reshape(shape))
            offset += size
        return jax.tree_util.tree_unflatten(self._treedef, leaves)
