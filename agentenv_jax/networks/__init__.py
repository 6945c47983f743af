"""Policy and value networks and the action distributions they parameterize.

The names below are imported when first used: an env rank that acts with the numpy policy
reads `networks.numpy_policy` alone and so never imports JAX or flax.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ActionDistribution": "agentenv_jax.networks.distributions",
    "ActorCritic": "agentenv_jax.networks.actor_critic",
    "action_distribution": "agentenv_jax.networks.distributions",
    "actor_critic_for": "agentenv_jax.networks.for_spaces",
    "init_params": "agentenv_jax.networks.actor_critic",
    "make_actor_critic": "agentenv_jax.networks.actor_critic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
