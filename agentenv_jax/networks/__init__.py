"""Policy and value networks and the action distributions they parameterize."""

from agentenv_jax.networks.actor_critic import (
    ActorCritic,
    init_params,
    make_actor_critic,
)
from agentenv_jax.networks.distributions import ActionDistribution, action_distribution
from agentenv_jax.networks.for_spaces import actor_critic_for

__all__ = [
    "ActionDistribution",
    "ActorCritic",
    "action_distribution",
    "actor_critic_for",
    "init_params",
    "make_actor_critic",
]
