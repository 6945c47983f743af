"""How a learner's train state is laid out on a `data x model` mesh: FSDP by one rule.

Every leaf with two or more dimensions (the kernels of dense and convolution layers) is sharded
along its largest dimension over the `model` axis; vectors and scalars (biases, log-std, the step
count, the PRNG key) are small and stay replicated. The rule reads shapes only, so it applies to
the whole train state: the optimizer's moments, shaped like their parameters, are sharded like
them. XLA's SPMD partitioner gathers a layer's weights where the forward pass needs them and
reduce-scatters their gradients, so the update code is the same as on a 1-D mesh.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agentenv_jax.config.errors import MeshError
from agentenv_jax.parallel.mesh import MODEL_AXIS, replicated


def model_axis_size(mesh: Mesh) -> int:
    return dict(mesh.shape).get(MODEL_AXIS, 1)


def _sharded_axis(shape: tuple[int, ...]) -> int:
    """The dimension a weight is split along: its largest (the first of equals)."""
    return int(np.argmax(shape))


def _name(path: tuple[Any, ...]) -> str:
    """`Dense_0/kernel` for a pytree path."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def check_model_axis_divides(params: Any, model: int) -> None:
    """`MeshError` naming the first weight whose largest dimension `model` does not divide."""
    if model == 1:
        return
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        shape = tuple(leaf.shape)
        if len(shape) >= 2 and shape[_sharded_axis(shape)] % model:
            raise MeshError(
                f"topology.mesh.model = {model} is not allowed: it must divide the largest "
                f"dimension of every weight, and {_name(path)} has shape "
                f"{list(shape)} (choose a model size that divides the layer widths)"
            )


def state_shardings(mesh: Mesh, state: Any) -> Any:
    """Each leaf's sharding (a pytree like `state`, whose leaves may be abstract); on a mesh
    without a model axis one replicated sharding, a prefix of the whole tree."""
    model = model_axis_size(mesh)
    everywhere = replicated(mesh)
    if model == 1:
        return everywhere

    def rule(leaf: Any) -> NamedSharding:
        shape = tuple(leaf.shape)
        if len(shape) < 2 or shape[_sharded_axis(shape)] % model:
            return everywhere
        spec: list[str | None] = [None] * len(shape)
        spec[_sharded_axis(shape)] = MODEL_AXIS
        return NamedSharding(mesh, PartitionSpec(*spec))

    return jax.tree.map(rule, state)
