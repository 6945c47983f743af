"""Evaluation episodes of a saved policy in a JAX env (`env.backend: jax`), for `evaluate`.

All episodes play at once, one env each, in one jitted `lax.while_loop`; each env's return and
length stop counting when its first episode ends. Episode `i` starts from
`PRNGKey(seed_i)`, with `seed_i` chosen by `evaluation.evaluate` away from training's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.envs.jax_envs import make_jax_env
from agentenv_jax.networks import action_distribution, actor_critic_for


def play_jax_episodes(
    config: ExperimentConfig, params: Any, seeds: Sequence[int], deterministic: bool
) -> tuple[list[float], list[int]]:
    """The returns and lengths of one episode per seed in `seeds`, acting with the mode of the
    policy (`deterministic`) or sampling from it."""
    jax_env = make_jax_env(config.env)
    spaces = jax_env.spaces
    _, apply_fn = actor_critic_for(config.network, spaces)
    distribution = action_distribution(spaces.action_kind, spaces.action_nvec)
    draw_noise = jax.random.gumbel if distribution.noise == "gumbel" else jax.random.normal

    @jax.jit
    def play(params: Any, seeds: jax.Array) -> tuple[jax.Array, jax.Array]:
        keys = jax.vmap(jax.random.PRNGKey)(seeds)  # `[N]`, one per episode
        reset_keys, episode_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        count = seeds.shape[0]

        def running(carry) -> jax.Array:
            t, _, alive, _, _ = carry
            return jnp.any(alive) & (t < jax_env.max_episode_steps)

        def advance(carry):
            t, envs, alive, total, length = carry
            keys = jax.vmap(jax.random.fold_in, (0, None))(episode_keys, t)
            noise_keys, env_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
            head, _ = apply_fn(params, envs.obs)
            if deterministic:
                action = distribution.mode(head)
            else:
                noise = jax.vmap(lambda k: draw_noise(k, (spaces.action_size,)))(noise_keys)
                action = distribution.sample(head, noise)
            envs, result = jax_env.step(env_keys, envs, action)
            total = total + jnp.where(alive, result.reward, 0.0)
            length = length + alive.astype(jnp.int32)
            alive = alive & ~(result.terminated | result.truncated)
            return t + 1, envs, alive, total, length

        start = (
            jnp.int32(0),
            jax_env.reset(reset_keys),
            jnp.ones(count, bool),
            jnp.zeros(count, jnp.float32),
            jnp.zeros(count, jnp.int32),
        )
        _, _, _, total, length = jax.lax.while_loop(running, advance, start)
        return total, length

    total, length = jax.device_get(play(params, jnp.asarray(seeds, jnp.uint32)))
    return [float(r) for r in total], [int(n) for n in length]
