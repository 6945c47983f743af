"""Parameter initialization on the host, for every network of the framework.

`flax.linen.initializers.orthogonal` builds each matrix inside a jitted `init` with a QR
decomposition, and XLA takes most of a second on CPU to lower and compile those decompositions,
once per run and network, before anything else can start. Here a network's initializers only
*describe* each parameter (`HostInit`: orthogonal with a scale, or a constant); `init_on_host`
reads the descriptions from an abstract trace of `module.init` (`jax.eval_shape`, no compile)
and draws the values in numpy, seeded by the key and the parameter's path. So parameters are a
pure function of the key, and initializing compiles nothing: no XLA program to wait for on a
cold start, nothing uncacheable in a warm one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

Initializer = Callable[..., Any]


class HostInit(flax.struct.PyTreeNode, meta.AxisMetadata):
    """A parameter boxed with how `init_on_host` draws it: `kind` "orthogonal" (times
    `scale`) or "constant" (every entry `scale`). Flax unboxes it wherever the parameter is
    used, so the network's `apply` sees plain arrays."""

    value: Any
    kind: str = flax.struct.field(pytree_node=False)
    scale: float = flax.struct.field(pytree_node=False)

    def unbox(self) -> Any:
        return self.value

    def replace_boxed(self, val: Any) -> HostInit:
        return self.replace(value=val)

    def add_axis(self, index: int, params: dict[Any, Any]) -> HostInit:
        return self

    def remove_axis(self, index: int, params: dict[Any, Any]) -> HostInit:
        return self


def orthogonal(scale: float = 1.0) -> Initializer:
    """A kernel initializer: `orthogonal_matrix` of the parameter's shape, times `scale`."""

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> HostInit:
        if len(shape) < 2:
            raise ValueError(f"an orthogonal initializer needs a shape of rank >= 2, got {shape}")
        return HostInit(jnp.zeros(shape, dtype), "orthogonal", float(scale))

    return init


def constant(value: float) -> Initializer:
    """An initializer that fills the parameter with `value` (biases: `constant(0.0)`)."""

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> HostInit:
        return HostInit(jnp.zeros(shape, dtype), "constant", float(value))

    return init


zeros = constant(0.0)


def orthogonal_matrix(rng: np.random.Generator, shape: Sequence[int], scale: float) -> np.ndarray:
    """A `scale`-times orthogonal float64 array of `shape`.

    The last axis is the columns and the others flatten into rows (as a dense kernel
    `[in, out]` or a conv kernel `[kh, kw, in, out]` is used); rows are orthonormal if there
    are fewer rows than columns, columns otherwise. Signs follow R's diagonal so the matrix is
    drawn uniformly from the orthogonal group (Mezzadri, 2007).
    """
    rows, cols = int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])
    gaussian = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(gaussian)
    q = q * np.where(np.diag(r) < 0, -1.0, 1.0)
    if rows < cols:
        q = q.T
    return (scale * q).reshape(tuple(shape))


def _described(module: Any, inputs: Sequence[jax.ShapeDtypeStruct]) -> Any:
    """The `HostInit` boxes of `module`'s parameters, with abstract values."""
    return jax.eval_shape(lambda *xs: module.init(jax.random.PRNGKey(0), *xs)["params"], *inputs)


def _is_box(x: Any) -> bool:
    return isinstance(x, HostInit)


def param_shapes(module: Any, inputs: Sequence[jax.ShapeDtypeStruct]) -> Any:
    """The `jax.ShapeDtypeStruct` of each parameter `module.init` would make for `inputs`."""
    return meta.unbox(_described(module, inputs))


def init_on_host(module: Any, key: jax.Array, inputs: Sequence[jax.ShapeDtypeStruct]) -> Any:
    """`module`'s parameters for `inputs` (abstract, e.g. one observation `[1, *obs_shape]`) as
    numpy float arrays: each drawn by its `HostInit` from a numpy generator seeded by `key`'s
    bits and the parameter's path. Every parameter needs a `HostInit` initializer."""
    words = np.asarray(jax.random.key_data(key), np.uint32).ravel().tolist()

    def draw(path: Any, box: Any) -> np.ndarray:
        name = jax.tree_util.keystr(path)
        if not isinstance(box, HostInit):
            raise TypeError(f"parameter {name} was not made by a networks.initializers initializer")
        value = box.value
        if box.kind == "constant":
            return np.full(value.shape, box.scale, value.dtype)
        rng = np.random.default_rng([*words, zlib.crc32(name.encode())])
        return orthogonal_matrix(rng, value.shape, box.scale).astype(value.dtype)

    return jax.tree_util.tree_map_with_path(draw, _described(module, inputs), is_leaf=_is_box)
