"""Parallel multi-agent envs as arrays with an agent axis: the API, built-in envs, PettingZoo."""

from agentenv_jax.envs.multi_agent.api import MultiAgentStep, MultiAgentVectorEnv
from agentenv_jax.envs.multi_agent.navigation import NavigationVectorEnv
from agentenv_jax.envs.multi_agent.pettingzoo_env import ParallelView, PettingZooVectorEnv
from agentenv_jax.envs.multi_agent.predator_prey import PredatorPreyVectorEnv

__all__ = [
    "MultiAgentStep",
    "MultiAgentVectorEnv",
    "NavigationVectorEnv",
    "ParallelView",
    "PettingZooVectorEnv",
    "PredatorPreyVectorEnv",
]
