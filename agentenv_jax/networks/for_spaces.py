"""The actor-critic an experiment's network config and its env's spaces call for: the plain
`ActorCritic`, one per agent group (`networks.grouped`), and masks of unavailable actions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from agentenv_jax.networks.actor_critic import ActorCritic, apply_fn_of, make_actor_critic
from agentenv_jax.networks.grouped import GroupedActorCritic, mask_unavailable_actions
from agentenv_jax.networks.torso_choice import resolve_torso


def actor_critic_for(
    network: Any, spaces: Any
) -> tuple[ActorCritic, Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]]:
    """The actor-critic of an experiment: `network` is its `NetworkConfig`, `spaces` its
    `EnvSpaces`. Learner and env ranks both build it here, so their parameters line up. With
    `network.policies: per_group` and several agent groups, one per group (`networks.grouped`);
    with agents of different action counts, each row's unavailable actions masked."""
    module, apply_fn = make_actor_critic(
        spaces.action_kind,
        spaces.action_size,
        len(spaces.obs_shape),
        network.actor_hidden,
        network.critic_hidden,
        network.activation,
        network.log_std_init,
        torso=resolve_torso(network.torso, spaces.is_image),
        image_obs=spaces.is_image,
        actor_obs_dim=spaces.actor_obs_dim,
    )
    if network.policies == "per_group" and len(spaces.group_names) > 1:
        settings = tuple((f.name, getattr(module, f.name)) for f in dataclasses.fields(module))
        module = GroupedActorCritic(
            tuple(s for s in settings if s[0] not in ("parent", "name")),
            spaces.agent_groups,
            spaces.agent_id_at,
        )
        apply_fn = apply_fn_of(module)
    if spaces.agent_action_counts:
        obs_ndim, id_at = len(spaces.obs_shape), spaces.agent_id_at
        counts, unmasked = spaces.agent_action_counts, apply_fn

        def apply_fn(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
            head, value = unmasked(params, obs)
            return mask_unavailable_actions(head, obs, obs_ndim, id_at, counts), value

    return module, apply_fn
