"""Multi-agent env ids: the built-in envs, and PettingZoo parallel envs by module.

* `agentenv_jax/Navigation-v0`: cooperative navigation (`navigation.NavigationVectorEnv`);
* `agentenv_jax/PredatorPrey-v0`: predators and prey (`predator_prey.PredatorPreyVectorEnv`);
* `pettingzoo/<module>`: `<module>.parallel_env(**env.kwargs)` of any PettingZoo parallel env,
  e.g. `pettingzoo/mpe2.simple_spread_v3` (`pip install 'agentenv_jax[multi-agent]'`).

`env.kwargs` go to the env's constructor; `env.max_episode_steps` overrides its horizon.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from agentenv_jax.envs.multi_agent.api import MultiAgentVectorEnv
from agentenv_jax.envs.spaces import EnvError

PETTINGZOO_PREFIX = "pettingzoo/"
# id -> (module, class) of the built-in envs, imported when made.
BUILT_IN = {
    "agentenv_jax/Navigation-v0": (
        "agentenv_jax.envs.multi_agent.navigation",
        "NavigationVectorEnv",
    ),
    "agentenv_jax/PredatorPrey-v0": (
        "agentenv_jax.envs.multi_agent.predator_prey",
        "PredatorPreyVectorEnv",
    ),
}


def is_multi_agent(env_id: str) -> bool:
    return env_id in BUILT_IN or env_id.startswith(PETTINGZOO_PREFIX)


def close_built_in_id(env_id: str) -> str | None:
    """The built-in multi-agent id `env_id` was probably meant to be, if any."""
    close = difflib.get_close_matches(env_id, list(BUILT_IN), n=1, cutoff=0.75)
    return close[0] if close else None


def make_multi_agent_env(
    env_id: str, num_envs: int, kwargs: dict[str, Any], max_episode_steps: int | None
) -> MultiAgentVectorEnv:
    """`num_envs` copies of the multi-agent env `env_id`; `EnvError` naming what is wrong."""
    kwargs = dict(kwargs)
    if env_id in BUILT_IN:
        module_name, class_name = BUILT_IN[env_id]
        env_class = getattr(importlib.import_module(module_name), class_name)
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        try:
            return env_class(num_envs, **kwargs)
        except TypeError as err:
            raise EnvError(
                f"env.id = {env_id!r}: env.kwargs = {kwargs!r} do not fit: {err}"
            ) from None
    module_name = env_id.removeprefix(PETTINGZOO_PREFIX)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvError(
            f"env.id = {env_id!r}: cannot import {module_name!r} ({err}); PettingZoo envs "
            "need their package, e.g. pip install 'agentenv_jax[multi-agent]' for mpe2"
        ) from None
    if not callable(getattr(module, "parallel_env", None)):
        raise EnvError(f"env.id = {env_id!r}: {module_name!r} has no parallel_env()")
    from agentenv_jax.envs.multi_agent.pettingzoo_env import PettingZooVectorEnv

    try:
        return PettingZooVectorEnv(
            lambda: module.parallel_env(**kwargs), num_envs, max_episode_steps
        )
    except (TypeError, ValueError) as err:
        raise EnvError(f"env.id = {env_id!r} with env.kwargs = {kwargs!r}: {err}") from err
