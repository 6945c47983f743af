"""Text env ids, their default context and response lengths, and the vector env each one makes.

* `agentenv_jax/Arithmetic-v0`: `tasks.ArithmeticTask` (single turn);
* `agentenv_jax/GuessNumber-v0`: `tasks.GuessNumberTask` (multi-turn);
* `agentenv_jax/ToolArithmetic-v0`: `tool_tasks.ToolArithmeticTask` (multi-turn, with tools);
* `agentenv_jax/Code-v0`: `code_tasks.CodeTask` (write a function; hidden tests in the sandbox);
* `reasoning_gym/<dataset>`: `reasoning_gym_tasks.ReasoningGymTask` over any reasoning-gym
  dataset (`pip install 'agentenv_jax[text]'`), e.g. `reasoning_gym/basic_arithmetic`;
* `agentenv_jax/Dataset-v0`: `dataset_tasks.DatasetTask`, the rows of a user's dataset file
  scored by reward functions;
* `agentenv_jax/OpenEnv-v0`: `openenv_tasks.OpenEnvTask`, an OpenEnv env in process
  (`target`) or served by OpenEnv's own server (`base_url`);
* `textarena/<game>`: `textarena_tasks.textarena_task`, a TextArena game: single-player (e.g.
  `textarena/GuessTheNumber-v0`), or two-player in self-play (`textarena/TicTacToe-v0`);
* `skyrl_gym/<env>`: `skyrl_gym_tasks.SkyRLGymTask`, a skyrl-gym env (e.g. `skyrl_gym/gsm8k`)
  over rows of SkyRL's dataset layout;
* `agent`: `envs.agent.vector_env.AgentVectorEnv`, a user's agent program (an async function
  given an `openai.AsyncOpenAI` client) whose model calls an endpoint of the policy serves;
* `package.module:TaskClass`: a user's own task, any class that follows the `TextTask`
  protocol (`reset(rng)` and `reply(message)`), made with `env.kwargs` as its kwargs.

`env.kwargs` holds `context_length`, `response_length` and `group_size`, which go to
`TextVectorEnv`, and the task's own kwargs (the rest).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agentenv_jax.envs.agent.vector_env import (
    AGENT_ENV_ID,
    AgentVectorEnv,
    make_agent_vector_env,
)
from agentenv_jax.envs.import_path import import_object
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.code_tasks import CodeTask
from agentenv_jax.envs.text.dataset_tasks import DatasetTask
from agentenv_jax.envs.text.openenv_tasks import OpenEnvTask
from agentenv_jax.envs.text.reasoning_gym_tasks import ReasoningGymTask, reasoning_gym_kwargs
from agentenv_jax.envs.text.skyrl_gym_tasks import SKYRL_GYM_PREFIX, SkyRLGymTask
from agentenv_jax.envs.text.tasks import (
    ArithmeticTask,
    GuessNumberTask,
    TextTask,
    require_known_kwargs,
)
from agentenv_jax.envs.text.textarena_tasks import TEXTARENA_PREFIX, textarena_task
from agentenv_jax.envs.text.tokenizer import BYTE_TOKENIZER, Tokenizer
from agentenv_jax.envs.text.tool_tasks import ToolArithmeticTask
from agentenv_jax.envs.text.vector_env import TextVectorEnv

REASONING_GYM_PREFIX = "reasoning_gym/"
ENV_KWARGS = ("context_length", "response_length", "group_size")  # taken by TextVectorEnv


@dataclasses.dataclass(frozen=True)
class TextEnvEntry:
    """What a text env id makes, and the lengths it defaults to."""

    task: Callable[..., TextTask]  # called with the task's kwargs
    context_length: int  # L: observation tokens
    response_length: int  # M: tokens per agent message


# Every id, the reasoning-gym ones as one pattern (`<dataset>` is the dataset's name).
TEXT_ENV_IDS: dict[str, TextEnvEntry] = {
    "agentenv_jax/Arithmetic-v0": TextEnvEntry(ArithmeticTask, 16, 4),
    "agentenv_jax/GuessNumber-v0": TextEnvEntry(GuessNumberTask, 64, 4),
    "agentenv_jax/ToolArithmetic-v0": TextEnvEntry(ToolArithmeticTask, 512, 96),
    "agentenv_jax/Code-v0": TextEnvEntry(CodeTask, 256, 128),
    "agentenv_jax/Dataset-v0": TextEnvEntry(DatasetTask, 512, 128),
    "agentenv_jax/OpenEnv-v0": TextEnvEntry(OpenEnvTask, 1024, 256),
    f"{REASONING_GYM_PREFIX}<dataset>": TextEnvEntry(ReasoningGymTask, 512, 16),
    f"{SKYRL_GYM_PREFIX}<env>": TextEnvEntry(SkyRLGymTask, 1024, 256),
    f"{TEXTARENA_PREFIX}<game>": TextEnvEntry(textarena_task, 1024, 64),
}
# Ids that name a family by a prefix: `prefix<name>`.
_PREFIXES = (REASONING_GYM_PREFIX, SKYRL_GYM_PREFIX, TEXTARENA_PREFIX)
# The task class of each prefix that takes the name as its first argument.
_PREFIX_TASKS = {SKYRL_GYM_PREFIX: SkyRLGymTask, TEXTARENA_PREFIX: textarena_task}
_BUILT_IN = [env_id for env_id in TEXT_ENV_IDS if not env_id.startswith(_PREFIXES)]


# A user's task (`package.module:TaskClass`) gets these lengths unless env.kwargs sets them.
USER_TASK_LENGTHS = (512, 128)


def user_task_class(env_id: str) -> type | None:
    """The class `env_id` names when it is `package.module:Class` with `reset` and `reply`
    methods (a `TextTask`), else None (a Gymnasium env factory, or not an import path). The
    module is imported: an import that fails is an `EnvError`."""
    if ":" not in env_id or env_id.startswith(_PREFIXES):
        return None
    target = import_object(env_id, "env.id", "a task class or env factory", missing_ok=True)
    if not isinstance(target, type) or issubclass(target, gym.Env):
        return None
    if callable(getattr(target, "reply", None)) and callable(getattr(target, "reset", None)):
        return target
    return None


def is_text_env(env_id: str) -> bool:
    """Whether `env_id` names a text env: a built-in one, `reasoning_gym/<dataset>`, or a
    user's task class (`package.module:Class`, imported to tell)."""
    return (
        env_id in _BUILT_IN
        or env_id == AGENT_ENV_ID
        or env_id.startswith(_PREFIXES)
        or user_task_class(env_id) is not None
    )


def has_splits(env_id: str) -> bool:
    """Whether the text env `env_id` draws its problems from a train or a test side (its
    task takes `split`: reasoning-gym's, dataset files', skyrl-gym's, or a user's task)."""
    if env_id.startswith(REASONING_GYM_PREFIX) or env_id == AGENT_ENV_ID:
        return True
    task = next((task for prefix, task in _PREFIX_TASKS.items() if env_id.startswith(prefix)), None)
    if task is None and env_id in _BUILT_IN:
        task = TEXT_ENV_IDS[env_id].task
    if task is None and ":" in env_id:
        task = user_task_class(env_id)
    return task is not None and "split" in inspect.signature(task).parameters


def text_env_seats(env_id: str) -> int:
    """Envs a game of `env_id` takes (`TextTask.seats`: 2 for a two-player TextArena game in
    self-play), 1 for every other task; vector envs of it hold whole games."""
    if env_id.startswith(TEXTARENA_PREFIX):
        return int(getattr(textarena_task(env_id.removeprefix(TEXTARENA_PREFIX)), "seats", 1))
    if ":" in env_id and not env_id.startswith(_PREFIXES):
        return int(getattr(user_task_class(env_id), "seats", 1))
    return 1


def close_text_env_id(env_id: str) -> str | None:
    """The built-in text env id `env_id` was probably meant to be, if any."""
    close = difflib.get_close_matches(env_id, [*_BUILT_IN, AGENT_ENV_ID], n=1, cutoff=0.75)
    return close[0] if close else None


def make_text_vector_env(
    env_id: str,
    num_envs: int,
    kwargs: dict[str, Any],
    tokenizer: Tokenizer | None = None,
    episode_groups: bool = False,
) -> TextVectorEnv | AgentVectorEnv:
    """`num_envs` envs of the text env `env_id` with `env.kwargs` = `kwargs`, in the tokens of
    `tokenizer` (default: bytes); `EnvError` naming an unknown id or kwarg (with the allowed
    ones) or a bad value. With `episode_groups` (a group baseline) a multi-turn task's envs run
    their episodes in rounds of its `max_turns` messages (`TextVectorEnv(round_turns=...)`).
    `agent` makes an `AgentVectorEnv` instead (its `max_calls` are the rounds' length)."""
    if env_id == AGENT_ENV_ID:
        return make_agent_vector_env(num_envs, kwargs, tokenizer or BYTE_TOKENIZER, episode_groups)
    if env_id.startswith(REASONING_GYM_PREFIX):
        dataset_name = env_id.removeprefix(REASONING_GYM_PREFIX)
        entry = TEXT_ENV_IDS[f"{REASONING_GYM_PREFIX}<dataset>"]
        make_task = functools.partial(ReasoningGymTask, dataset_name)
        task_kwargs = reasoning_gym_kwargs(dataset_name)
    elif env_id.startswith(tuple(_PREFIX_TASKS)):
        prefix = next(p for p in _PREFIX_TASKS if env_id.startswith(p))
        entry = next(e for name, e in TEXT_ENV_IDS.items() if name.startswith(prefix))
        make_task = functools.partial(_PREFIX_TASKS[prefix], env_id.removeprefix(prefix))
        task_kwargs = list(inspect.signature(_PREFIX_TASKS[prefix]).parameters)[1:]
    elif env_id in _BUILT_IN:
        entry = TEXT_ENV_IDS[env_id]
        make_task = entry.task
        task_kwargs = list(inspect.signature(entry.task).parameters)
    elif (task_class := user_task_class(env_id)) is not None:
        entry = TextEnvEntry(task_class, *USER_TASK_LENGTHS)
        make_task = task_class
        parameters = inspect.signature(task_class).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            task_kwargs = [name for name in kwargs if name not in ENV_KWARGS]
        else:
            task_kwargs = [p.name for p in parameters]
    else:
        close = close_text_env_id(env_id)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise EnvError(
            f"env.id = {env_id!r} is not a text env{hint}; text envs: "
            f"{', '.join([*TEXT_ENV_IDS, AGENT_ENV_ID])}"
        )
    require_known_kwargs(kwargs, [*ENV_KWARGS, *task_kwargs], env_id)
    try:
        task = make_task(**{k: v for k, v in kwargs.items() if k not in ENV_KWARGS})
    except EnvError:
        raise
    except Exception as err:
        if env_id in TEXT_ENV_IDS or env_id.startswith(_PREFIXES):
            raise
        raise EnvError(
            f"env.id = {env_id!r}: making the task with env.kwargs failed: "
            f"{type(err).__name__}: {err}"
        ) from err
    if not isinstance(getattr(task, "max_turns", None), int) or task.max_turns < 1:
        raise EnvError(
            f"env.id = {env_id!r}: the task's max_turns is {getattr(task, 'max_turns', None)!r}; "
            "a text task sets max_turns, an int >= 1 (agent messages per episode)"
        )
    return TextVectorEnv(
        # Copies of one task validated once: a reasoning-gym dataset is built (and its data
        # files read) once and shared read-only; each copy keeps its own episode.
        lambda: copy.copy(task),
        num_envs,
        context_length=kwargs.get("context_length", entry.context_length),
        response_length=kwargs.get("response_length", entry.response_length),
        group_size=kwargs.get("group_size", 1),
        tokenizer=tokenizer or BYTE_TOKENIZER,
        round_turns=task.max_turns if episode_groups and task.max_turns > 1 else 0,
    )
