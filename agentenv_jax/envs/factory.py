"""Make the Gymnasium vector env of one env rank (the supported spaces are in `envs.spaces`).

An env is named by a registered Gymnasium id (`CartPole-v1`) or by an entry point
`package.module:factory` whose factory returns a `gymnasium.Env`. Each env rank builds its
`local_num_envs` copies as one vector env: `sync` (in-process loop), `async` (subprocesses) or
`native` (the env's own vectorized implementation, e.g. CartPole's); Atari games
(`env.preset: atari`) run on a C++ vector env, `envpool` or `ale` (`envs.atari`). Every other
env is wrapped by `envs.observation_wrappers.wrap_observations` (flattening, `env.frame_stack`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from agentenv_jax.config.schema import CriticInput, EnvConfig
from agentenv_jax.envs.faults import RecreateOnFault
from agentenv_jax.envs.import_path import import_object
from agentenv_jax.envs.multi_agent.columns import AgentColumns
from agentenv_jax.envs.multi_agent.registry import (
    close_built_in_id,
    is_multi_agent,
    make_multi_agent_env,
)
from agentenv_jax.envs.observation_wrappers import needs_wrapping, wrap_observations
from agentenv_jax.envs.spaces import EnvError, EnvSpaces, describe_spaces

# Evaluation episodes are seeded from here (EVAL_SEED_BASE + seed * episodes + i), far from the
# seeds training gives its envs (seed * 1_000_003 + env index), so no evaluation replays a
# training episode.
EVAL_SEED_BASE = 2**30

__all__ = [
    "EVAL_SEED_BASE",
    "EnvError",
    "EnvSpaces",
    "autoreset_mode",
    "check_first_reset",
    "describe_spaces",
    "env_settings",
    "make_vector_env",
    "vector_env_spaces",
    "resolve_env_factory",
]


def _registered_ids() -> list[str]:
    return sorted(gym.registry.keys())


def resolve_env_factory(config: EnvConfig) -> Callable[[], gym.Env]:
    """A zero-argument callable that makes one env as configured, its observations wrapped as
    they travel (`wrap_observations`); `EnvError` if it cannot."""
    if config.preset == "atari":
        raise EnvError(
            f"env.id = {config.id!r} with env.preset = 'atari' runs only as a C++ vector env "
            "(env.vectorization: envpool or ale); agentenv eval does not make it one by one"
        )
    make_env = _resolve_unwrapped(config)
    return lambda: wrap_observations(make_env(), config.id, config.frame_stack)


def _resolve_unwrapped(config: EnvConfig) -> Callable[[], gym.Env]:
    env_id, kwargs = config.id, dict(config.kwargs)
    if config.max_episode_steps is not None:
        kwargs["max_episode_steps"] = config.max_episode_steps
    if ":" in env_id and env_id not in gym.registry:
        factory = import_object(env_id, "env.id", "an env factory")
        if not callable(factory):
            raise EnvError(f"env.id = {env_id!r}: {factory!r} is not callable")
        max_steps = kwargs.pop("max_episode_steps", None)

        def make_from_entry_point() -> gym.Env:
            env = factory(**kwargs)
            if not isinstance(env, gym.Env):
                missing = [m for m in ("reset", "reply") if not callable(getattr(env, m, None))]
                raise EnvError(
                    f"env.id = {env_id!r}: the factory returned {type(env).__name__}, "
                    "expected a gymnasium.Env, or a text task class with reset(rng) and "
                    f"reply(message) (docs/own_tasks.md; missing: {', '.join(missing) or 'none'})"
                )
            if max_steps is not None:
                env = gym.wrappers.TimeLimit(env, max_steps)
            return env

        return make_from_entry_point
    if env_id not in gym.registry:
        from agentenv_jax.envs.text.registry import close_text_env_id

        close = [c for c in (close_built_in_id(env_id), close_text_env_id(env_id)) if c]
        close = close or difflib.get_close_matches(env_id, _registered_ids(), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EnvError(
            f"env.id = {env_id!r} is not a registered Gymnasium environment{hint}; "
            "use a registered id or 'package.module:factory'"
        )
    return lambda: gym.make(env_id, **kwargs)


def make_vector_env(
    config: EnvConfig,
    local_num_envs: int,
    critic: CriticInput = "centralised",
    group_size: int = 1,
    tokenizer: Any = None,
    episode_groups: bool = False,
) -> gym.vector.VectorEnv:
    """The vector env of one env rank. Its autoreset mode is SAME_STEP, or NEXT_STEP (native).
    A multi-agent env (`envs.multi_agent.registry`) comes as its agent columns, with the
    critic's part of the observation that `critic` asks for. A text env (`envs.text`) is a
    `TextVectorEnv` whose envs answer each prompt `group_size` times (`algorithm.group_size`),
    in the tokens of `tokenizer` (default: bytes), its episodes in rounds where
    `episode_groups` (a group baseline over a multi-turn task's episodes)."""
    # NOTE: a registered Gymnasium id is never a text env (their ids are kept apart: see
    # tests/test_env_registry.py), and importing the text registry brings every text task
    # (datasets, rewards, the sandbox): ~5 MB of each CartPole or Atari env rank for nothing.
    if config.id not in gym.registry:
        from agentenv_jax.envs.text.registry import is_text_env, make_text_vector_env

        if is_text_env(config.id):
            kwargs = dict(config.kwargs)
            if group_size > 1:
                kwargs["group_size"] = group_size
            return make_text_vector_env(
                config.id, local_num_envs, kwargs, tokenizer, episode_groups
            )
    if is_multi_agent(config.id):
        env = make_multi_agent_env(
            config.id, local_num_envs, config.kwargs, config.max_episode_steps
        )
        return AgentColumns(env, critic)
    if config.preset == "atari":
        from agentenv_jax.envs.atari import make_atari_vector_env

        return make_atari_vector_env(
            config.id,
            config.vectorization,
            local_num_envs,
            dict(config.kwargs),
            config.max_episode_steps,
            config.frame_stack,
            config.num_threads,
            config.num_splits,
        )
    if config.vectorization == "native":
        if ":" in config.id and config.id not in gym.registry:
            raise EnvError(
                f"env.vectorization = 'native' needs a registered Gymnasium id with a "
                f"vector entry point; env.id = {config.id!r} is an entry point"
            )
        resolve_env_factory(config)  # the unknown-id error with its did-you-mean
        spec = gym.registry[config.id]
        if spec.vector_entry_point is None:
            raise EnvError(
                f"env.vectorization = 'native' is not available for env.id = "
                f"{config.id!r} (it has no vector entry point); use 'sync' or 'async'"
            )
        kwargs: dict[str, Any] = dict(config.kwargs)
        if config.max_episode_steps is not None:
            kwargs["max_episode_steps"] = config.max_episode_steps
        try:
            vector_env = gym.make_vec(
                config.id,
                num_envs=local_num_envs,
                vectorization_mode="vector_entry_point",
                **kwargs,
            )
        except Exception as err:
            raise EnvError(
                f"env.id = {config.id!r}: making the native vector env failed: "
                f"{type(err).__name__}: {err}"
            ) from err
        if needs_wrapping(vector_env.single_observation_space, config.frame_stack):
            vector_env.close()
            raise EnvError(
                f"env.vectorization = 'native' needs Box observations and env.frame_stack = 1 "
                f"(env.id = {config.id!r} observes {vector_env.single_observation_space}, "
                f"env.frame_stack = {config.frame_stack}); use 'sync' or 'async'"
            )
        return vector_env
    make_env = resolve_env_factory(config)
    if config.on_fault == "recreate":
        make_env = functools.partial(RecreateOnFault.around, make_env)
    fns = [make_env] * local_num_envs
    try:
        if config.vectorization == "sync":
            return gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        # NOTE: worker processes are spawned, not forked: forking a process whose JAX runtime
        # already runs threads can deadlock the child.
        return gym.vector.AsyncVectorEnv(
            fns, autoreset_mode=AutoresetMode.SAME_STEP, context="spawn"
        )
    except EnvError:
        raise
    except Exception as err:
        raise EnvError(
            f"env.id = {config.id!r}: making the env failed: {type(err).__name__}: {err}"
        ) from err


def vector_env_spaces(env_id: str, vector_env: gym.vector.VectorEnv) -> EnvSpaces:
    """The spaces of one env of `vector_env` as they travel (`describe_spaces`), with a
    multi-agent env's agents, agent groups and the policy's part of the observation."""
    text = getattr(vector_env, "text_spec", None)
    if text is not None:
        # Token ids travel as they are (int32), not flattened into one-hot vectors.
        return EnvSpaces(
            obs_shape=(text.context_length,),
            action_kind="discrete",
            action_size=text.vocab_size,
            action_shape=(text.response_length,),
            action_low=None,
            action_high=None,
            obs_dtype="int32",
            action_nvec=(text.vocab_size,) * text.response_length,
            text=text,
        )
    spaces = describe_spaces(
        env_id, vector_env.single_observation_space, vector_env.single_action_space
    )
    stacked_frames = getattr(vector_env, "stacked_frames", 0)
    if stacked_frames > 1 and spaces.is_image and len(spaces.obs_shape) == 3:
        spaces = dataclasses.replace(spaces, stacked_frames=stacked_frames)
    if not isinstance(vector_env, AgentColumns):
        return spaces
    return dataclasses.replace(
        spaces,
        agents=vector_env.agents_per_env,
        actor_obs_dim=vector_env.actor_obs_dim if vector_env.critic_dim else None,
        agent_groups=vector_env.agent_groups,
        group_names=vector_env.group_names,
        agent_action_counts=vector_env.action_counts or (),
    )


def env_settings(config: EnvConfig) -> str:
    """The settings that made an env, for messages: its id, and its kwargs if any."""
    text = f"env.id = {config.id!r}"
    if config.kwargs:
        text += f" with env.kwargs = {dict(config.kwargs)!r}"
    return text


def check_first_reset(vector_env: gym.vector.VectorEnv, config: EnvConfig) -> None:
    """Reset the vector env once, so that settings which fail only when an env first runs (a
    render mode whose dependency is missing, say) are a start-up error naming them, agreed on
    by every rank, instead of a crash in the loop. The actor resets again with its own seeds.
    An `EnvError` of the env itself names its own setting and is passed on with the env's id;
    any other error gets every `env.kwargs` setting, not knowing which one it is about."""
    try:
        vector_env.reset(seed=0)
    except EnvError as err:  # the env's own refusal names its setting: not all of env.kwargs
        raise EnvError(f"env.id = {config.id!r}: {err}") from err
    except Exception as err:
        raise EnvError(
            f"{env_settings(config)}: the env failed on its first reset: "
            f"{type(err).__name__}: {err}"
        ) from err


def autoreset_mode(env: gym.vector.VectorEnv) -> AutoresetMode:
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
        raise EnvError(
            f"vector env autoreset mode {mode} is not supported: expected SAME_STEP or NEXT_STEP"
        )
    return mode
