"""JAX's distributed runtime over the learner processes, started from an address they agreed on.

The learners pass the coordinator's `host:port` among themselves (over their own communicator,
never `COMM_WORLD`: env ranks must not join JAX's runtime), so JAX's own cluster detection is
not used. On CPU the cross-process collectives go through gloo, so a CPU job runs the same path
as a GPU cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax


class DistributedStartError(RuntimeError):
    """JAX's distributed runtime did not start; the message names the coordinator."""


def start_distributed(
    coordinator: str,
    num_processes: int,
    process_id: int,
    local_device_ids: Sequence[int] | None,
    timeout_s: float,
) -> None:
    """Join the runtime as `process_id` of `num_processes` (process 0 runs the coordinator at
    `coordinator`, `host:port`). Must run before anything touches a JAX backend."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=list(local_device_ids) if local_device_ids is not None else None,
            initialization_timeout=max(1, int(timeout_s)),
        )
    except Exception as err:  # the runtime raises XlaRuntimeError, RuntimeError, ...
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise DistributedStartError(
            f"JAX's distributed runtime did not start: learner {process_id} of {num_processes} "
            f"could not join the coordinator at {coordinator} within {timeout_s:.0f} s "
            f"(run.transport_timeout_s): {type(err).__name__}: {first_line[:300]}"
        ) from err


def is_collective_failure(err: BaseException) -> bool:
    """Whether `err` is a cross-process collective that failed: on CPU a gloo error (`Gloo
    all-reduce failed ... Connection reset by peer` when a peer learner's process ended). It
    comes from XLA's runtime as a `JaxRuntimeError` (`XlaRuntimeError` before), or, from the
    all-gather that orbax's multi-process save synchronises with, as a `ValueError` carrying
    the same status text; either may be the cause of what reached the caller."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err).lower()
        if type(err).__name__ in _XLA_ERROR_TYPES and "gloo" in text and "failed" in text:
            return True
        err = err.__cause__ or err.__context__
    return False


_XLA_ERROR_TYPES = ("JaxRuntimeError", "XlaRuntimeError", "ValueError")
