"""`agentenv_jax/Dataset-v0`: a single-turn task over the rows of a user's dataset file, scored
by reward functions (`rewards`), TRL's and verl's called unchanged.

A row's prompt is a column (`prompt_column`, default `prompt`): plain text, or chat messages as
in TRL's conversational format and verl's parquet rows; `system_prompt`, when set, comes first
as a system turn. The answer the built-in `accuracy` reward checks is `answer_column` (a dotted
path into nested columns), by default the first of `answer`, verl's `reward_model.ground_truth`
and TRL's `solution` that the rows have.

Held out: `test_path` names a file of test rows; without one, `test_fraction` of the distinct
prompts (by a hash of their text, `tasks.question_split`) are the test side, so a prompt is never
on both sides however often it repeats. An episode draws rows from the env's rng (seeded, so
runs repeat) until one of its split comes up.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.datasets import RowSource, column_value, has_column, open_rows
from agentenv_jax.envs.text.rewards import (
    BUILT_IN_REWARDS,
    Completion,
    load_reward_functions,
    score_completions,
)
from agentenv_jax.envs.text.tasks import (
    TASK_SPLITS,
    Prompt,
    TaskReply,
    question_split,
)

# Answer columns tried, in order, when `answer_column` is not set: a plain dataset's, verl's
# and TRL's math datasets'.
DEFAULT_ANSWER_COLUMNS = ("answer", "reward_model.ground_truth", "solution")
# Draws of the other side's rows before a split is taken to be empty (as reasoning-gym tasks).
_MAX_DRAWS = 1000
# Reward functions whose first failure this process has printed.
_REPORTED: set[str] = set()


def _number(field: str, value: Any, low: float, high: float, *, open_low: bool = False) -> float:
    """`value` as a float in `low..high` (`low` excluded with `open_low`), else `EnvError`."""
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    if bad or value > high or value < low or (open_low and value == low):
        bound = f"{'>' if open_low else '>='} {low:g} and <= {high:g}"
        raise EnvError(f"{field} = {value!r}: expected a number {bound}")
    return float(value)


def _path(value: Any, field: str) -> Path:
    """`value` as a path; `EnvError` naming `field` for anything else."""
    if not isinstance(value, str | Path) or not str(value):
        raise EnvError(f"{field} = {value!r}: expected the path of a dataset file or folder")
    return Path(value)


def _prompt_key(prompt: Prompt) -> str:
    """The text a prompt is split by: its text, or its messages as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


class DatasetRows:
    """A dataset's rows as episodes draw them: the file of the split, the prompt of each row
    (the system prompt first), and the held-out split by distinct prompt. Shared by the tasks
    that start an episode from a row (`DatasetTask`, the skyrl-gym adapter)."""

    def __init__(
        self,
        path: str,
        test_path: str | None = None,
        split: str = "train",
        test_fraction: float = 0.1,
        prompt_column: str = "prompt",
        system_prompt: str = "",
    ):
        if split not in TASK_SPLITS:
            raise EnvError(
                f"env.kwargs.split = {split!r} is not allowed: expected one of "
                f"{', '.join(TASK_SPLITS)}"
            )
        for name, value in (("prompt_column", prompt_column), ("system_prompt", system_prompt)):
            if not isinstance(value, str):
                raise EnvError(f"env.kwargs.{name} = {value!r}: expected a string")
        if not prompt_column:
            raise EnvError("env.kwargs.prompt_column = '': expected a column name")
        self.split = split
        self.test_fraction = 0.0 if test_path is not None else float(test_fraction)
        if test_path is None:
            _number("env.kwargs.test_fraction", test_fraction, 0.0, 1.0)
            if test_fraction >= 1.0:
                raise EnvError(
                    f"env.kwargs.test_fraction = {test_fraction!r}: expected a number >= 0 and "
                    "< 1 (the share of distinct prompts held out for test)"
                )
            if split == "test" and test_fraction == 0:
                raise EnvError(
                    "env.kwargs.split = 'test' with env.kwargs.test_fraction = 0 holds nothing "
                    "out: set test_fraction, or test_path to a file of test rows"
                )
        if split == "test" and test_path is not None:
            self.rows: RowSource = open_rows(
                _path(test_path, "env.kwargs.test_path"), "env.kwargs.test_path"
            )
        else:
            self.rows = open_rows(_path(path, "env.kwargs.path"), "env.kwargs.path")
        self.prompt_column = prompt_column
        self.system_prompt = system_prompt
        self.first = self.rows[0]
        if not has_column(self.first, prompt_column):
            raise EnvError(
                f"env.kwargs.prompt_column = {prompt_column!r}: {self.rows.path} has no such "
                f"column; its columns: {', '.join(map(str, self.first))}"
            )

    def row_prompt(self, row: dict[str, Any], index: int) -> Prompt:
        """Row `index`'s prompt (`row` is the row): its text or messages, the system prompt
        first; `EnvError` naming the row for a missing or malformed prompt."""
        try:
            value = column_value(row, self.prompt_column)
        except KeyError:
            raise EnvError(
                f"{self.rows.path}: row {index} has no column {self.prompt_column!r} "
                f"(env.kwargs.prompt_column); its columns: {', '.join(map(str, row))}"
            ) from None
        if isinstance(value, str):
            if not self.system_prompt:
                return value
            messages = [{"role": "user", "content": value}]
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in value)
        ):
            messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
        else:
            raise EnvError(
                f"{self.rows.path}: row {index}'s {self.prompt_column!r} is {value!r}; expected "
                "a string or chat messages (a list of {'role', 'content'} objects)"
            )
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def split_of(self, prompt: Prompt) -> str:
        """The side of `prompt`: by a hash of its text, or `self.split` where the sides are
        files."""
        if self.test_fraction == 0:
            return self.split
        return question_split(_prompt_key(prompt), self.test_fraction)

    def distinct_prompts(self) -> dict[str, int]:
        """How many distinct prompts each side holds (reads every row: for docs and checks, not
        for training)."""
        seen: dict[str, str] = {}
        for index in range(len(self.rows)):
            prompt = self.row_prompt(self.rows[index], index)
            key = _prompt_key(prompt)
            seen.setdefault(key, self.split_of(prompt))
        sides = list(seen.values())
        return {split: sides.count(split) for split in TASK_SPLITS}

    def draw(self, rng: np.random.Generator) -> tuple[int, dict[str, Any], Prompt]:
        """A row of this split drawn from `rng`: its index, the row and its prompt."""
        for _ in range(_MAX_DRAWS):
            index = int(rng.integers(len(self.rows)))
            row = self.rows[index]
            prompt = self.row_prompt(row, index)
            if self.split_of(prompt) == self.split:
                break
        else:
            raise EnvError(
                f"env.kwargs.split = {self.split!r}: {_MAX_DRAWS} draws from {self.rows.path} "
                f"({len(self.rows)} rows) found no prompt of this split (test_fraction "
                f"{self.test_fraction}); too few distinct prompts to split"
            )
        return index, row, prompt


class DatasetTask:
    """One dataset row an episode: its prompt, then one message scored by the reward functions.

    Rewards are the weighted sum of `rewards` (default: the built-in `accuracy`); `success` is
    a reward of at least `success_reward`. See the module docstring for columns and splits, and
    `rewards` for what each function is given and how failures are counted.
    """

    max_turns = 1

    def __init__(
        self,
        path: str,
        test_path: str | None = None,
        split: str = "train",
        test_fraction: float = 0.1,
        prompt_column: str = "prompt",
        answer_column: str | None = None,
        system_prompt: str = "",
        rewards: Any = ("accuracy",),
        reward_timeout_s: float = 30.0,
        reward_on_error: float | str = 0.0,
        success_reward: float = 1.0,
    ):
        self.reward_timeout_s = _number(
            "env.kwargs.reward_timeout_s", reward_timeout_s, 0.0, 86400.0, open_low=True
        )
        # "drop": a row whose reward failed is left out of training, dropped from its group.
        self.drop_on_error = reward_on_error == "drop"
        if isinstance(reward_on_error, str) and not self.drop_on_error:
            raise EnvError(
                f"env.kwargs.reward_on_error = {reward_on_error!r}: expected a number (the "
                "reward of a row whose reward failed) or 'drop' (leave the row out)"
            )
        self.reward_on_error = (
            0.0
            if self.drop_on_error
            else _number("env.kwargs.reward_on_error", reward_on_error, -1e9, 1e9)
        )
        self.success_reward = _number("env.kwargs.success_reward", success_reward, -1e9, 1e9)
        self.rewards = load_reward_functions(
            list(rewards) if isinstance(rewards, tuple) else rewards
        )
        self.reward_names = tuple(reward.name for reward in self.rewards)
        self.data = DatasetRows(path, test_path, split, test_fraction, prompt_column, system_prompt)
        first = self.data.first
        self.answer_column = self._answer_column(first, answer_column)
        if self.answer_column is None and any(
            r.style == "builtin" and r.function is BUILT_IN_REWARDS["accuracy"]
            for r in self.rewards
        ):
            raise EnvError(
                f"env.kwargs.rewards: 'accuracy' needs the rows' answers, and "
                f"{self.data.rows.path} has none of the columns "
                f"{', '.join(DEFAULT_ANSWER_COLUMNS)}; set env.kwargs.answer_column (its "
                f"columns: {', '.join(map(str, first))})"
            )
        self.row: dict[str, Any] | None = None  # the current episode's row
        self.row_index = -1
        self.prompt: Prompt = ""

    def _answer_column(self, first: dict[str, Any], answer_column: str | None) -> str | None:
        if answer_column is not None:
            if not isinstance(answer_column, str) or not has_column(first, answer_column):
                raise EnvError(
                    f"env.kwargs.answer_column = {answer_column!r}: {self.data.rows.path} has no "
                    f"such column; its columns: {', '.join(map(str, first))}"
                )
            return answer_column
        return next((c for c in DEFAULT_ANSWER_COLUMNS if has_column(first, c)), None)

    def reset(self, rng: np.random.Generator) -> Prompt:
        self.row_index, self.row, self.prompt = self.data.draw(rng)
        return self.prompt

    def completion(self, message: str, message_ids: Sequence[int]) -> Completion:
        """What the reward functions are given for `message` answering the current row."""
        if self.row is None:
            raise RuntimeError("DatasetTask.reply before reset")
        answer = None
        if self.answer_column is not None:
            try:
                answer = column_value(self.row, self.answer_column)
            except KeyError:
                answer = None
        raw_prompt = column_value(self.row, self.data.prompt_column)
        return Completion(raw_prompt, message, message_ids, self.row, answer)

    def reply(self, message: str) -> TaskReply:
        return self.reply_batch([self], [message], [np.zeros(0, np.int32)])[0]

    @staticmethod
    def reply_batch(
        tasks: Sequence[DatasetTask], messages: Sequence[str], message_ids: Sequence[np.ndarray]
    ) -> list[TaskReply]:
        """Every task's reply, its reward functions called once for the batch."""
        first = tasks[0]
        completions = [
            task.completion(message, [int(t) for t in ids])
            for task, message, ids in zip(tasks, messages, message_ids, strict=True)
        ]
        batch = score_completions(
            first.rewards, completions, first.reward_timeout_s, first.reward_on_error
        )
        for name, message in batch.errors.items():
            if name not in _REPORTED:
                # Once per function and process: the counts go to the metrics.
                _REPORTED.add(name)
                outcome = (
                    "is dropped from its group (env.kwargs.reward_on_error = 'drop')"
                    if first.drop_on_error
                    else f"gets env.kwargs.reward_on_error = {first.reward_on_error:g}"
                )
                print(
                    f"agentenv: reward function {name!r} {message}; the row {outcome}, and "
                    f"every failure is counted per update as reward/{name}/failures (shown once)",
                    file=sys.stderr,
                    flush=True,
                )
        return [
            TaskReply(
                text=None,
                reward=float(batch.total[i]),
                done=True,
                success=bool(batch.total[i] >= first.success_reward),
                terms=tuple(float(v) for v in batch.values[i]),
                failed=tuple(bool(f) for f in batch.failed[i]),
                dropped=first.drop_on_error and bool(batch.error_rows[i]),
            )
            for i in range(len(tasks))
        ]
