"""The learner's device mesh and the shardings of its state and batches.

By default one mesh axis, `data`: rollouts are split along their env axis and minibatches along
their row axis, parameters and optimizer state are replicated. The update is a plain `jax.jit`
over these shardings (XLA's SPMD partitioner inserts the gradient all-reduce), which is why the
same code runs on one device or many and gives the same result to float tolerance.

For policies too large for one device, a second axis, `model` (`topology.mesh`), shards the
parameters and optimizer state (see `parallel.partitioning`); batches stay split along `data`.

With several learner processes the mesh is global: each process contributes its first devices,
process-major, and builds the global batch from its own block of rows
(`jax.make_array_from_process_local_data`); the update is the same jit, and XLA inserts the
cross-process all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from agentenv_jax.config.errors import MeshError

BATCH_AXIS = "data"  # batches are split along it
MODEL_AXIS = "model"  # parameters are sharded along it (2-D meshes only)


def choose_num_devices(
    requested: int, available: int, batch_sizes: Sequence[int], processes: int = 1
) -> int:
    """How many of its local devices each learner process puts in the mesh.

    `requested` 0 means: the most devices (up to `available`) whose total over `processes`
    divides every batch size, so the default never fails. An explicit request must be available
    and divide them, else `MeshError`.
    """
    if requested == 0:
        return max(
            n for n in range(1, available + 1) if all(b % (n * processes) == 0 for b in batch_sizes)
        )
    if requested > available:
        raise MeshError(
            f"topology.learner_devices = {requested} is not allowed: only "
            f"{available} local devices are visible"
        )
    bad = [b for b in batch_sizes if b % (requested * processes)]
    if bad:
        total = "" if processes == 1 else f" times {processes} learner processes"
        raise MeshError(
            f"topology.learner_devices = {requested} is not allowed: it{total} must divide "
            f"the batch sizes {list(batch_sizes)} (global_num_envs and the "
            "minibatch size)"
        )
    return requested


def choose_mesh_devices(
    data: int, model: int, available: int, batch_sizes: Sequence[int], processes: int = 1
) -> int:
    """How many of its local devices each learner process puts in a `data x model` mesh
    (`topology.mesh`; `data` 0: the most that fit). `MeshError` for a mesh that does not fit
    the devices or whose data axis does not divide the batch."""
    described = (
        f"topology.mesh = {{data: {data}, model: {model}}}"
        if data
        else (f"topology.mesh.model = {model}")
    )
    if data == 0:
        fitting = [
            n
            for n in range(1, available + 1)
            if (n * processes) % model == 0
            and all(b % (n * processes // model) == 0 for b in batch_sizes)
        ]
        if not fitting:
            raise MeshError(
                f"{described} is not allowed: {available} device(s) per learner process x "
                f"{processes} process(es) hold no whole multiple of {model}"
            )
        return max(fitting)
    total = data * model
    if total % processes or total // processes > available:
        raise MeshError(
            f"{described} is not allowed: it needs {total} devices, and {processes} learner "
            f"process(es) have {available} each ({available * processes} in all); it must be a "
            "multiple of the learner processes that fits their devices"
        )
    bad = [b for b in batch_sizes if b % data]
    if bad:
        raise MeshError(
            f"{described} is not allowed: the data axis ({data}) must divide the batch sizes "
            f"{list(batch_sizes)} (global_num_envs and the minibatch size)"
        )
    return total // processes


def mesh_devices(num_devices: int) -> list[jax.Device]:
    """The first `num_devices` devices of every process, process-major (with one process: its
    first local devices)."""
    by_process: dict[int, list[jax.Device]] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    return [
        device
        for process in sorted(by_process)
        for device in sorted(by_process[process], key=lambda d: d.id)[:num_devices]
    ]


def make_mesh(
    num_devices: int, devices: Sequence[jax.Device] | None = None, model: int = 1
) -> Mesh:
    """A mesh over `devices[:num_devices]`, or over `num_devices` devices of every learner
    process (`mesh_devices`): 1-D (`data`) when `model` is 1, else `data x model` with
    consecutive devices (a process's own, when `model` divides its count) along `model`."""
    devices = list(devices)[:num_devices] if devices is not None else mesh_devices(num_devices)
    if model == 1:
        return Mesh(devices, (BATCH_AXIS,), axis_types=(AxisType.Auto,))
    grid = np.array(devices, dtype=object).reshape(-1, model)
    return Mesh(grid, (BATCH_AXIS, MODEL_AXIS), axis_types=(AxisType.Auto, AxisType.Auto))


def spans_processes(mesh: Mesh) -> bool:
    """Whether the mesh holds devices of other processes (a multi-learner mesh)."""
    return any(d.process_index != jax.process_index() for d in mesh.devices.flat)


def to_global(sharding: NamedSharding, local: np.ndarray) -> jax.Array:
    """This process's block of a global batch, as the global array: the block is the rows of
    this process's devices along the sharded axis."""
    return jax.make_array_from_process_local_data(sharding, local)


def local_rows(array: jax.Array) -> np.ndarray:
    """This process's rows of an array sharded by rows over the mesh (`to_global`'s inverse:
    its block, in order), as numpy; the whole array where every shard is this process's."""
    if array.is_fully_addressable:
        return np.asarray(array)
    shards = sorted(array.addressable_shards, key=lambda shard: shard.index[0].start or 0)
    return np.concatenate([np.asarray(shard.data) for shard in shards])


def place_on_mesh(mesh: Mesh, tree: Any, shardings: Any = None) -> Any:
    """A pytree (the same on every process) put on the mesh with `shardings` (a pytree of
    them, or one for all leaves; replicated by default)."""
    if spans_processes(mesh):
        tree = jax.device_get(tree)  # a global sharding takes host values, not local arrays
    return jax.device_put(tree, replicated(mesh) if shardings is None else shardings)


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
