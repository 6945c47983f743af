"""The non-finite guard: stop at the first update whose losses, gradients or parameters are not
finite, before that state can be checkpointed or broadcast."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: the CLI catches `NonFiniteError` on env ranks too
    import jax


class NonFiniteError(FloatingPointError):
    """An update produced NaN or Inf; the message names the update and the term."""


def check_finite(
    update: int, metrics: Mapping[str, float], flat_params: np.ndarray | jax.Array | None = None
) -> None:
    """Raise `NonFiniteError` naming the first non-finite loss/gradient term, or the parameters.

    Loss terms are named before derived quantities, so the message points at the cause. Device
    parameters (`jax.Array`) are counted where they are: one scalar comes to the host."""
    ordered = sorted(metrics, key=lambda k: (not k.startswith("loss/"), k))
    bad = [k for k in ordered if not math.isfinite(float(metrics[k]))]
    if bad:
        raise NonFiniteError(
            f"update {update}: {bad[0]} = {float(metrics[bad[0]])} is not finite"
            + (f" (also: {', '.join(bad[1:4])})" if len(bad) > 1 else "")
            + "; stopped before saving or broadcasting this state — the last good checkpoint "
            "is kept"
        )
    if flat_params is None:
        return
    import jax
    import jax.numpy as jnp

    xp = jnp if isinstance(flat_params, jax.Array) else np
    count = int(xp.sum(~xp.isfinite(flat_params)))
    if count:
        raise NonFiniteError(
            f"update {update}: {count} parameters are not finite; stopped before saving or "
            "broadcasting this state — the last good checkpoint is kept"
        )
