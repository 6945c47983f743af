"""The learner's device mesh and the shardings of its state and batches.

One mesh axis, `batch`: rollouts are split along their env axis and minibatches along their row
axis, parameters and optimizer state are replicated. The update is a plain `jax.jit` over these
shardings (XLA's SPMD partitioner inserts the gradient all-reduce), which is why the same code
runs on one device or many and gives the same result to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

BATCH_AXIS = "batch"


class MeshError(ValueError):
    """A device count that does not fit the batch; the message says what would."""


def choose_num_devices(requested: int, available: int, batch_sizes: Sequence[int]) -> int:
    """How many devices the learner mesh uses.

    `requested` 0 means: the most devices (up to `available`) that divide every batch size, so the
    default never fails. An explicit request must be available and divide them, else `MeshError`.
    """
    if requested == 0:
        return max(n for n in range(1, available + 1) if all(b % n == 0 for b in batch_sizes))
    if requested > available:
        raise MeshError(
            f"topology.learner_devices = {requested} is not allowed: only "
            f"{available} local devices are visible"
        )
    bad = [b for b in batch_sizes if b % requested]
    if bad:
        raise MeshError(
            f"topology.learner_devices = {requested} is not allowed: it must divide "
            f"the batch sizes {list(batch_sizes)} (global_num_envs and the "
            "minibatch size)"
        )
    return requested


def make_mesh(num_devices: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over the first `num_devices` local devices."""
    devices = list(devices if devices is not None else jax.local_devices())[:num_devices]
    return Mesh(devices, (BATCH_AXIS,), axis_types=(AxisType.Auto,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def env_axis_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """For time-major rollout arrays `[T, B, ...]` (ndim >= 2), or `[B]` when ndim is 1."""
    if ndim == 1:
        return NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    return NamedSharding(mesh, PartitionSpec(None, BATCH_AXIS))


def row_constraint(mesh: Mesh) -> Callable[[jax.Array], jax.Array]:
    """Inside jit: keep an array's leading (row) axis split over the batch axis."""
    sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    return lambda x: jax.lax.with_sharding_constraint(x, sharding)
