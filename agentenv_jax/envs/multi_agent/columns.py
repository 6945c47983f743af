"""A batch of multi-agent envs seen by env ranks as a Gymnasium vector env of agent columns.

The env ranks, segments, transport and learner move `[T, B]` rows; a multi-agent env enters
them with an agent axis folded into `B`: env `e`'s agent `i` is column `e * N + i`, with one
shared policy (the agent's one-hot id is part of what it observes). Each column's observation
is one float32 vector:

    [ own observation (D) | one-hot agent id (N) | critic part (C) ]

The policy sees the first `D + N` entries (`actor_obs_dim`). The critic sees the whole vector:
with `critic="centralised"` (MAPPO) the critic part is the env's global state (S entries), or
all agents' observations joined (N * D) when the env has no state; with `critic="independent"`
(IPPO) there is no critic part and the critic sees what the policy sees. So a centralised and
an independent critic share everything below the network: the same segments, the same PPO.

Agents that do not act in a step (finished early, or absent from the episode) are padding:
`info[ACTED]` marks the columns that acted, and the actor stores the others as invalid rows,
which carry no loss, advantage statistics or entropy ("death masking"). Auto-reset is SAME_STEP:
`info["final_obs"]` holds the observation an ended episode finished in.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from agentenv_jax.config.schema import CriticInput
from agentenv_jax.envs.multi_agent.api import MultiAgentStep, MultiAgentVectorEnv

# The info key of the columns that acted in a step (`[B]` bool); rows of the others are padding.
ACTED = "agent_acted"


def agent_groups(agents: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The groups of agents named `<group>_<index>` (PettingZoo's convention; any other name is
    a group of its own), in order of first appearance, and each agent's group index."""
    names = [a.rsplit("_", 1)[0] if a.rsplit("_", 1)[-1].isdigit() else a for a in agents]
    groups = tuple(dict.fromkeys(names))
    return groups, tuple(groups.index(name) for name in names)


class AgentColumns(gym.vector.VectorEnv):
    """`env`'s `E` envs of `N` agents as a vector env of `E * N` columns (module docstring)."""

    def __init__(self, env: MultiAgentVectorEnv, critic: CriticInput):
        self.env = env
        self.agents_per_env = len(env.agents)
        self.critic = critic
        n, d = self.agents_per_env, env.obs_size
        self.actor_obs_dim = d + n
        if critic == "independent":
            self.critic_dim = 0
        else:
            self.critic_dim = env.state_size if env.state_size > 0 else n * d
        self.num_envs = env.num_envs * n
        self.single_observation_space = gym.spaces.Box(
            -np.inf, np.inf, (self.actor_obs_dim + self.critic_dim,), np.float32
        )
        self.single_action_space = env.action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self._agent_ids = np.tile(np.eye(n, dtype=np.float32), (env.num_envs, 1))  # [B, N]
        self.group_names, self.agent_groups = agent_groups(env.agents)
        # Each agent's action count when their Discrete spaces differ (else None).
        self.action_counts: tuple[int, ...] | None = getattr(env, "action_counts", None)

    def _columns(self, obs: np.ndarray, state: np.ndarray) -> np.ndarray:
        """`obs [E, N, D]` and `state [E, S]` -> the columns' observations `[E * N, D + N + C]`."""
        e, n, d = obs.shape
        parts = [obs.reshape(e * n, d), self._agent_ids]
        if self.critic_dim:
            shared = state if self.env.state_size > 0 else obs.reshape(e, n * d)
            parts.append(np.repeat(shared, n, axis=0))
        return np.concatenate(parts, axis=1, dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        first = self.env.reset(seed=seed)
        return self._columns(first.obs, first.state), {}

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        actions = np.asarray(actions)
        out: MultiAgentStep = self.env.step(
            actions.reshape(self.env.num_envs, self.agents_per_env, *actions.shape[1:])
        )
        info: dict[str, Any] = {ACTED: out.acted.reshape(-1)}
        if out.episode_ended.any():
            ended = np.repeat(out.episode_ended, self.agents_per_env)
            info["final_obs"] = self._columns(out.final_obs, out.final_state)
            info["_final_obs"] = ended
        return (
            self._columns(out.obs, out.state),
            out.reward.reshape(-1).astype(np.float32),
            out.terminated.reshape(-1),
            out.truncated.reshape(-1),
            info,
        )

    def close(self, **kwargs: Any) -> None:
        self.env.close()
