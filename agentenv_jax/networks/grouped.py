"""One actor-critic per agent group, for multi-agent envs with `network.policies: per_group`.

Each row of a multi-agent rollout is one agent's step and carries the agent's one-hot id at
observation entries `[id_at, id_at + N)` (`envs.multi_agent.columns`). The row's group is
`agent_groups[agent]`; every group has its own `ActorCritic` (its own policy and critic
parameters), and a row's outputs are those of its group's network. The other groups' outputs
are computed and discarded (`jnp.where`), so no gradient of a row's loss reaches another
group's parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from agentenv_jax.networks.actor_critic import ActorCritic


def row_agents(obs: jax.Array, obs_ndim: int, id_at: int, agents: int) -> jax.Array:
    """`obs [..., *obs_shape]` -> the agent index `[...]` of each row, from its one-hot id."""
    batch_shape = obs.shape[: obs.ndim - obs_ndim]
    flat = obs.reshape(batch_shape + (-1,))
    return jnp.argmax(flat[..., id_at : id_at + agents], axis=-1)


def row_groups(obs: jax.Array, obs_ndim: int, id_at: int, agent_groups: Sequence[int]) -> jax.Array:
    """`obs [..., *obs_shape]` -> the group index `[...]` int32 of each row's agent."""
    agent = row_agents(obs, obs_ndim, id_at, len(agent_groups))
    return jnp.asarray(agent_groups, jnp.int32)[agent]


def mask_unavailable_actions(
    head: jax.Array, obs: jax.Array, obs_ndim: int, id_at: int, action_counts: Sequence[int]
) -> jax.Array:
    """Logits `head [..., A]` with the actions at or beyond each row's agent's count (agent from
    the one-hot id in `obs`) set to -1e9: never sampled, chosen or given probability."""
    agent = row_agents(obs, obs_ndim, id_at, len(action_counts))
    count = jnp.asarray(action_counts, jnp.int32)[agent]
    available = jnp.arange(head.shape[-1]) < count[..., None]
    return jnp.where(available, head, jnp.float32(-1e9))


class GroupedActorCritic(nn.Module):
    """`ActorCritic`s named `group_0`, `group_1`, ..., each built from `settings` (the
    `ActorCritic` fields as `(name, value)` pairs); maps observations `[..., *obs_shape]` to
    `(head, value)` as `ActorCritic` does, each row from its agent group's network (module
    docstring)."""

    settings: tuple[tuple[str, Any], ...]
    agent_groups: tuple[int, ...]  # group index of each agent, in agent order
    id_at: int  # where the one-hot agent id starts in a (flat) observation

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        settings = dict(self.settings)
        groups = row_groups(obs, settings["obs_ndim"], self.id_at, self.agent_groups)
        head, value = ActorCritic(**settings, name="group_0")(obs)
        for group in range(1, max(self.agent_groups) + 1):
            group_head, group_value = ActorCritic(**settings, name=f"group_{group}")(obs)
            mine = groups == group
            head_mine = mine.reshape(mine.shape + (1,) * (head.ndim - mine.ndim))
            head = jnp.where(head_mine, group_head, head)
            value = jnp.where(mine, group_value, value)
        return head, value
