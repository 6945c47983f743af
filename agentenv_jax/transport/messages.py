"""Message tags and the parameter-broadcast layout shared by every transport."""

from __future__ import annotations

import numpy as np

from agentenv_jax.transport.spec import FieldSpec, MessageSpec

# MPI tags: one per message kind, so each kind keeps MPI's per-tag ordering guarantee.
TAG_PARAMS = 11
TAG_SEGMENT = 12
TAG_CREDIT = 13
TAG_CONTROL = 14  # pickled: stop requests
TAG_FINAL = 15  # pickled: end-of-run reports


def param_message_spec(num_params: int, obs_dim: int) -> MessageSpec:
    """Versioned parameters plus the global normalizer statistics env ranks must apply."""
    return MessageSpec(
        [
            FieldSpec("version", (1,), np.int64),
            FieldSpec("params", (num_params,), np.float32),
            FieldSpec("obs_stats", (1 + 2 * obs_dim,), np.float64),
            FieldSpec("return_stats", (3,), np.float64),
        ]
    )
