"""JAX-native environments (gymnax) as batched pure functions, for `env.backend: jax`.

`make_jax_env(env_config)` makes the gymnax env named by `env.id` and returns a `JaxEnv`: the
env's `EnvSpaces` and `reset`/`step` over a batch of `E` envs, vmapped, with auto-reset and the
running return and length of each env's episode carried along. Nothing here is jitted or
sharded; the learner calls these inside its own jit (`learner.anakin`).

Termination and truncation stay apart as on the Gymnasium path: gymnax reports a time limit as
`truncated`, and `step` returns the observation the episode ended on (`final_obs`) so that the
update can bootstrap from its value.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from agentenv_jax.config.errors import ConfigError, import_failure
from agentenv_jax.config.schema import EnvConfig
from agentenv_jax.envs.spaces import EnvError, EnvSpaces, describe_spaces

INSTALL_HINT = "pip install 'agentenv_jax[jax-envs]'"


@flax.struct.dataclass
class EnvCarry:
    """The state of `E` envs between steps: what a rollout carries from one step to the next."""

    env_state: Any  # gymnax's state pytree, every leaf `[E, ...]`
    obs: jax.Array  # `[E, *obs_shape]` float32, the observation to act on
    episode_return: jax.Array  # `[E]` float32, reward summed since the episode began
    episode_length: jax.Array  # `[E]` int32, steps since the episode began


@flax.struct.dataclass
class StepResult:
    """What one batched step returns besides the next `EnvCarry`; every field is `[E, ...]`."""

    reward: jax.Array  # float32
    terminated: jax.Array  # bool: a terminal state (its value is 0)
    truncated: jax.Array  # bool: cut by the time limit (bootstrap from `final_obs`)
    final_obs: jax.Array  # float32 `[E, *obs_shape]`: the observation the step reached
    episode_return: jax.Array  # float32: the finished episode's return, 0 where none ended
    episode_length: jax.Array  # int32: the finished episode's length, 0 where none ended


@dataclasses.dataclass(frozen=True)
class JaxEnv:
    """A gymnax env as batched pure functions (see the module docstring)."""

    spaces: EnvSpaces
    max_episode_steps: int
    # reset(keys [E]) -> EnvCarry: E fresh episodes.
    reset: Callable[[jax.Array], EnvCarry]
    # step(keys [E], carry, action [E, ...]) -> (carry, StepResult), auto-resetting ended envs.
    step: Callable[[jax.Array, EnvCarry, jax.Array], tuple[EnvCarry, StepResult]]


def _import_gymnax() -> Any:
    try:
        import gymnax
    except Exception as err:  # an installed gymnax can fail with anything its imports raise
        raise ConfigError(
            f"env.backend = 'jax' needs gymnax, {import_failure('gymnax', err)}: {INSTALL_HINT}"
        ) from None
    return gymnax


def _make_gymnax(config: EnvConfig) -> tuple[Any, Any]:
    """gymnax's `(env, env_params)` for `config.id`, `config.kwargs` and the time limit."""
    gymnax = _import_gymnax()
    if config.id not in gymnax.registered_envs:
        close = difflib.get_close_matches(config.id, gymnax.registered_envs, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EnvError(
            f"env.id = {config.id!r} is not a registered gymnax environment{hint}; with "
            "env.backend = 'jax' it must be one of gymnax.registered_envs, e.g. 'CartPole-v1'"
        )
    try:
        env, params = gymnax.make(config.id, **config.kwargs)
    except Exception as err:  # a constructor rejects kwargs in its own way
        raise EnvError(
            f"env.id = {config.id!r} with env.kwargs = {dict(config.kwargs)!r}: gymnax.make "
            f"failed: {type(err).__name__}: {err}"
        ) from None
    if config.max_episode_steps is not None:
        if not hasattr(params, "max_steps_in_episode"):
            raise EnvError(
                f"env.max_episode_steps = {config.max_episode_steps} is not allowed: gymnax env "
                f"{config.id!r} has no max_steps_in_episode parameter; set it to null"
            )
        params = params.replace(max_steps_in_episode=config.max_episode_steps)
    return env, params


def _describe(env_id: str, env: Any, params: Any) -> EnvSpaces:
    from gymnax.environments.spaces import Box, gymnax_space_to_gym_space

    obs_space = env.observation_space(params)
    if not isinstance(obs_space, Box):
        # Flattening Dict/Discrete observations inside the jit is not implemented yet.
        raise EnvError(
            f"env.id = {env_id!r} observes {obs_space}: env.backend = 'jax' supports Box "
            "observations only"
        )
    action_space = gymnax_space_to_gym_space(env.action_space(params))
    spaces = describe_spaces(env_id, gymnax_space_to_gym_space(obs_space), action_space)
    # Observations are handed to the network as float32 (gymnax's Boxes are float or int
    # grids, never uint8 pixels), so no image path and no normalizer statistics apply.
    return dataclasses.replace(spaces, obs_dtype="float32")


def make_jax_env(config: EnvConfig) -> JaxEnv:
    """The gymnax env of `config` as a `JaxEnv`; `ConfigError` without gymnax, `EnvError` for an
    unknown id, kwargs the env rejects, or spaces it cannot serve."""
    env, params = _make_gymnax(config)
    spaces = _describe(config.id, env, params)
    reset_one = jax.vmap(env.reset, in_axes=(0, None))
    step_one = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    if spaces.action_kind == "continuous":
        low = jnp.asarray(spaces.action_low, jnp.float32)
        high = jnp.asarray(spaces.action_high, jnp.float32)
    else:
        low = high = None

    def reset(keys: jax.Array) -> EnvCarry:
        obs, env_state = reset_one(keys, params)
        zeros = jnp.zeros(keys.shape[:1], jnp.float32)
        return EnvCarry(env_state, obs.astype(jnp.float32), zeros, zeros.astype(jnp.int32))

    def step(keys: jax.Array, carry: EnvCarry, action: jax.Array) -> tuple[EnvCarry, StepResult]:
        if low is not None:  # sampled Gaussian actions are clipped only when stepping the env
            action = jnp.clip(action, low, high)
        obs, env_state, reward, terminated, truncated, info = step_one(
            keys, carry.env_state, action, params
        )
        reward = reward.astype(jnp.float32)
        ended = terminated | truncated
        episode_return = carry.episode_return + reward
        episode_length = carry.episode_length + 1
        result = StepResult(
            reward=reward,
            terminated=terminated,
            truncated=truncated & ~terminated,  # a terminal state on the last step is terminal
            final_obs=info["final_observation"].astype(jnp.float32),
            episode_return=jnp.where(ended, episode_return, 0.0),
            episode_length=jnp.where(ended, episode_length, 0),
        )
        carry = EnvCarry(
            env_state,
            obs.astype(jnp.float32),
            jnp.where(ended, 0.0, episode_return),
            jnp.where(ended, 0, episode_length),
        )
        return carry, result

    return JaxEnv(spaces, int(params.max_steps_in_episode), reset, step)


def check_jax_backend_settings(config: EnvConfig) -> None:
    """`ConfigError` for env settings that do not apply when the envs run inside the jit."""
    if config.vectorization != "sync":
        raise ConfigError(
            f"env.vectorization = {config.vectorization!r} is not allowed with env.backend = "
            "'jax': the envs are vmapped inside the learner's jit (leave it at 'sync')"
        )
    for name in ("normalize_obs", "normalize_reward"):
        if getattr(config, name):
            raise ConfigError(
                f"env.{name} = true is not allowed with env.backend = 'jax' (running "
                "normalization statistics are not kept inside the jit): set it to false"
            )
    if config.frame_stack != 1:
        raise ConfigError(
            f"env.frame_stack = {config.frame_stack} is not allowed with env.backend = 'jax': "
            "expected 1"
        )
