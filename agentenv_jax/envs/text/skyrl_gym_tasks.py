"""`skyrl_gym/<env>`: skyrl-gym's text envs (`BaseTextEnv` classes, SkyRL's environment library)
as text tasks, unchanged.

Each episode starts from a dataset row in SkyRL's layout: `prompt` (chat messages), optionally
`env_class`, and the env's own fields (`reward_spec` with its `ground_truth`, `extra_info`,
...). As SkyRL's generator does, the env is made per episode by `skyrl_gym.make(env_class,
env_config=..., extras=row)` (the row's `env_class`, else the id's), its `init(prompt)` gives
the first context, and each message goes to its `step`, whose observations are the env's next
turn (a `tool` observation rendered as a tool turn), whose reward is the message's reward and
whose `done` ends the episode. `max_turns` is the env's own (read from the env at each reset).
skyrl-gym is the optional extra `pip install 'agentenv_jax[skyrl-gym]'`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.dataset_tasks import DatasetRows
from agentenv_jax.envs.text.tasks import Prompt, TaskReply, prompt_messages

SKYRL_GYM_PREFIX = "skyrl_gym/"
_ROW_KEYS_NOT_EXTRAS = ("env_class",)  # the rest of a row goes to the env as `extras`


def import_skyrl_gym() -> Any:
    """The `skyrl_gym` module; `EnvError` naming the extra when it is missing."""
    try:
        import skyrl_gym
    except ImportError as err:
        raise EnvError(
            f"skyrl_gym/<env> envs need skyrl-gym ({err}): pip install 'agentenv_jax[skyrl-gym]'"
        ) from None
    return skyrl_gym


def _check_env_name(skyrl_gym: Any, name: str, where: str) -> None:
    registered = sorted(skyrl_gym.envs.registration.registry)
    if name not in registered:
        close = difflib.get_close_matches(name, registered, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EnvError(
            f"{where} = {name!r}: no skyrl-gym env of that name{hint}; registered: "
            f"{', '.join(registered)}"
        )


class SkyRLGymTask:
    """A skyrl-gym env an episode, made from a dataset row (see the module docstring).

    `env_config` is the env's config (SkyRL's `environment.skyrl_gym.<env>` section), given to
    the env as an OmegaConf object as SkyRL does; the row options (`path`, `test_path`, `split`,
    `test_fraction`, `prompt_column`, `system_prompt`) are `DatasetTask`'s. An episode is a
    success when its last reward reaches `success_reward`.
    """

    def __init__(
        self,
        env_name: str,
        path: str,
        test_path: str | None = None,
        split: str = "train",
        test_fraction: float = 0.1,
        prompt_column: str = "prompt",
        system_prompt: str = "",
        env_config: Mapping[str, Any] | None = None,
        success_reward: float = 1.0,
    ):
        skyrl_gym = import_skyrl_gym()
        _check_env_name(skyrl_gym, env_name, "env.id")
        if env_config is not None and not isinstance(env_config, Mapping):
            raise EnvError(f"env.kwargs.env_config = {env_config!r}: expected a mapping")
        self.env_name = env_name
        self.data = DatasetRows(path, test_path, split, test_fraction, prompt_column, system_prompt)
        self._env_config = dict(env_config or {})
        self.success_reward = float(success_reward)
        self.env: Any = None  # the current episode's env
        # The first row's env says how many turns an episode may take before any reset.
        probe = self._make_env(self.data.first, 0)
        self.max_turns = self._turns_of(probe)
        probe.close()

    def _make_env(self, row: Mapping[str, Any], index: int) -> Any:
        import skyrl_gym
        from omegaconf import OmegaConf

        env_class = row.get("env_class") or self.env_name
        if env_class != self.env_name:  # the id's own env was checked once, at start-up
            _check_env_name(
                skyrl_gym, str(env_class), f"{self.data.rows.path}: row {index}'s env_class"
            )
        extras = {k: v for k, v in row.items() if k not in _ROW_KEYS_NOT_EXTRAS}
        try:
            return skyrl_gym.make(
                env_class, env_config=OmegaConf.create(self._env_config), extras=extras
            )
        except Exception as err:
            raise EnvError(
                f"{self.data.rows.path}: row {index} does not make skyrl-gym env {env_class!r}: "
                f"{type(err).__name__}: {err}"
            ) from err

    def _turns_of(self, env: Any) -> int:
        turns = getattr(env, "max_turns", 1)
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise EnvError(f"skyrl-gym env {self.env_name!r}: max_turns = {turns!r} is not >= 1")
        return turns

    def reset(self, rng: np.random.Generator) -> Prompt:
        if self.env is not None:
            self.env.close()
        index, row, prompt = self.data.draw(rng)
        self.env = self._make_env(row, index)
        self.max_turns = self._turns_of(self.env)
        first, _ = self.env.init(prompt_messages(prompt))
        return list(first) if not isinstance(first, str) else first

    def reply(self, message: str) -> TaskReply:
        if self.env is None:
            raise RuntimeError("SkyRLGymTask.reply before reset")
        out = self.env.step(message)
        reward = float(out.get("reward") or 0.0)
        done = bool(out.get("done"))
        if done:
            self.env.close()
            self.env = None
            return TaskReply(
                text=None, reward=reward, done=True, success=reward >= self.success_reward
            )
        observations = list(out.get("observations") or [])
        role = "tool" if observations and observations[0].get("role") == "tool" else "user"
        text = "\n".join(str(o.get("content", "")) for o in observations)
        return TaskReply(text=text, reward=reward, done=False, success=False, role=role)
