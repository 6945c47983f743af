"""Reward functions of dataset tasks: the built-in ones, and a user's by import path, called
with TRL's or verl's signature as those libraries call them, so a reward file written for either
works unchanged.

* TRL (`GRPOTrainer(reward_funcs=...)`): `fn(prompts, completions, completion_ids, **columns)`
  over a batch, returning one float (or None: "does not apply") per completion. `prompts` are
  the rows' prompt values as stored, `completions` the texts (or, for chat prompts,
  `[{"role": "assistant", "content": text}]` each), every other column of the rows a keyword
  of per-row lists. An `async def` function is awaited.
* verl (`custom_reward_function`): `compute_score(data_source, solution_str, ground_truth,
  extra_info)` per row, returning a float or a dict with a `score`.
* Built in: `accuracy` (the answer cut out of the message, its last number or its last
  `\\boxed{}`, checked against the row's answer with math-verify), `format` (1 where a regex
  matches the message, else 0) and `length` (DAPO's soft overlong penalty).

The functions of one batch run concurrently, each on a thread of its own, under a time limit.
A function that raises, runs past the limit, returns the wrong number of values or a value that
is not a finite number fails for those rows: the failure is counted per function, and the row's
reward is the configured `reward_on_error` instead of its weighted sum. A thread that runs past
the limit cannot be stopped from outside: it is left behind as a daemon (the sandbox of
sandboxed code tools is the way to bound code that must be killed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import inspect
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from agentenv_jax.envs.import_path import import_object
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import ANSWER_FORMATS, answer_text, parse_number
from agentenv_jax.envs.text.verification import numbers_match

REWARD_STYLES = ("trl", "verl", "builtin")
_ENTRY_KEYS = ("function", "weight", "name", "kwargs")


@dataclasses.dataclass(frozen=True)
class Completion:
    """One row's completion, as the reward functions see it."""

    prompt: Any  # the row's prompt value as stored (a string, or chat messages)
    text: str  # the message, decoded (special tokens skipped)
    ids: Sequence[int]  # the message's token ids as generated, EOS included
    row: Mapping[str, Any]  # the row's columns
    answer: Any  # the row's answer (its answer column; None without one)


@dataclasses.dataclass(frozen=True)
class RewardFunction:
    """A reward function as configured: what it is called and how, and its weight."""

    name: str
    function: Callable[..., Any]
    weight: float
    style: str  # one of REWARD_STYLES
    kwargs: Mapping[str, Any]  # bound into every call


@dataclasses.dataclass(frozen=True)
class RewardBatch:
    """The rewards of N completions under K reward functions."""

    total: np.ndarray  # float64 [N]: the weighted sum, or `reward_on_error` where one failed
    values: np.ndarray  # float64 [N, K]: each function's value (NaN: None, or failed)
    failed: np.ndarray  # bool [N, K]: the function failed for the row
    errors: dict[str, str]  # a failing function's name -> its first failure, for the log

    @property
    def error_rows(self) -> np.ndarray:
        """bool `[N]`: rows where a function failed, or none gave a value."""
        return self.failed.any(axis=1) | ~np.isfinite(self.values).any(axis=1)


def _accuracy(
    completions: Sequence[Completion], answer_format: str = "last_number"
) -> list[float | None]:
    """1.0 where the answer cut out of the message (`tasks.answer_text`) is the row's answer
    (numbers compared by value with math-verify, other answers as stripped text), else 0.0;
    None for a row without an answer."""
    scores: list[float | None] = []
    for completion in completions:
        if completion.answer is None:
            scores.append(None)
            continue
        gold = str(completion.answer).strip()
        given = answer_text(completion.text, answer_format)
        if given is None:
            scores.append(0.0)
        elif parse_number(gold) is not None:
            scores.append(1.0 if numbers_match(gold, given) else 0.0)
        else:
            scores.append(1.0 if given.strip() == gold else 0.0)
    return scores


def _format(
    completions: Sequence[Completion], pattern: str = "", match: str = "search"
) -> list[float]:
    """1.0 where `pattern` matches the message (`re.search`, or `re.fullmatch` of the stripped
    message with `match: full`; `.` matches newlines), else 0.0."""
    regex = re.compile(pattern, re.DOTALL)
    if match == "full":
        return [1.0 if regex.fullmatch(c.text.strip()) else 0.0 for c in completions]
    return [1.0 if regex.search(c.text) else 0.0 for c in completions]


def _length(
    completions: Sequence[Completion], max_tokens: int = 0, buffer_tokens: int = 0
) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to `max_tokens - buffer_tokens` generated tokens,
    then falling linearly to -1 at `max_tokens`, and -1 past it."""
    free = max_tokens - buffer_tokens
    scores = []
    for completion in completions:
        n = len(completion.ids)
        if n <= free:
            scores.append(0.0)
        elif n <= max_tokens:
            scores.append((free - n) / buffer_tokens)
        else:
            scores.append(-1.0)
    return scores


def _check_builtin_kwargs(name: str, kwargs: Mapping[str, Any], field: str) -> None:
    """`EnvError` for a built-in function's kwargs it cannot use (named with `field`)."""
    if name == "accuracy" and kwargs.get("answer_format", "last_number") not in ANSWER_FORMATS:
        raise EnvError(
            f"{field}.kwargs.answer_format = {kwargs['answer_format']!r}: expected one of "
            f"{', '.join(ANSWER_FORMATS)}"
        )
    if name == "format":
        pattern = kwargs.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise EnvError(f"{field}.kwargs.pattern = {pattern!r}: expected a regular expression")
        try:
            re.compile(pattern)
        except re.error as err:
            raise EnvError(f"{field}.kwargs.pattern = {pattern!r}: not a regex: {err}") from None
        if kwargs.get("match", "search") not in ("search", "full"):
            raise EnvError(
                f"{field}.kwargs.match = {kwargs['match']!r}: expected 'search' or 'full'"
            )
    if name == "length":
        max_tokens, buffer_tokens = kwargs.get("max_tokens"), kwargs.get("buffer_tokens")
        for key, value in (("max_tokens", max_tokens), ("buffer_tokens", buffer_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EnvError(f"{field}.kwargs.{key} = {value!r}: expected an int >= 1")
        if buffer_tokens > max_tokens:
            raise EnvError(
                f"{field}.kwargs.buffer_tokens = {buffer_tokens} must not exceed max_tokens = "
                f"{max_tokens}"
            )


BUILT_IN_REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "accuracy": _accuracy,
    "format": _format,
    "length": _length,
}


def import_callable(path: str, field: str) -> Callable[..., Any]:
    """The callable `path` names: `package.module:name`, `package.module.name`, or a Python
    file and a name, `path/to/file.py:name` (as verl's `custom_reward_function.path`)."""
    if ":" not in path:
        module_name, _, attr = path.rpartition(".")
        path = f"{module_name}:{attr}"
    function = import_object(path, field, "a function")
    if not callable(function):
        raise EnvError(f"{field} = {path!r}: {function!r} is not callable")
    return function


def reward_style(function: Callable[..., Any], field: str) -> str:
    """`trl` or `verl`, read from `function`'s parameters; `EnvError` for any other signature."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "solution_str" in parameters:
        return "verl"
    if "completions" in parameters:
        return "trl"
    names = ", ".join(parameters) or "none readable"
    raise EnvError(
        f"{field}: {getattr(function, '__name__', function)!r} takes ({names}); a reward "
        "function takes TRL's (prompts, completions, **kwargs) or verl's (data_source, "
        "solution_str, ground_truth, extra_info)"
    )


def load_reward_functions(entries: Any, field: str = "env.kwargs.rewards") -> list[RewardFunction]:
    """The reward functions `entries` configure: a list whose items are a name or path
    (`accuracy`, `my_rewards:exact_match`) or a mapping with `function`, and optional `weight`
    (default 1), `name` (default: the function's) and `kwargs` (bound into every call)."""
    if isinstance(entries, str | Mapping):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise EnvError(
            f"{field} = {entries!r}: expected a list of reward functions (a name such as "
            "'accuracy', a 'package.module:function' path, or a mapping with 'function')"
        )
    functions: list[RewardFunction] = []
    for index, entry in enumerate(entries):
        where = f"{field}[{index}]"
        if isinstance(entry, str):
            entry = {"function": entry}
        if not isinstance(entry, Mapping) or not isinstance(entry.get("function"), str):
            raise EnvError(
                f"{where} = {entry!r}: expected a function name or path, or a mapping with "
                "'function'"
            )
        for key in entry:
            if key not in _ENTRY_KEYS:
                close = difflib.get_close_matches(str(key), _ENTRY_KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise EnvError(
                    f"{where}.{key} is not a key of a reward function{hint}; allowed: "
                    f"{', '.join(_ENTRY_KEYS)}"
                )
        weight = entry.get("weight", 1.0)
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
        ):
            raise EnvError(f"{where}.weight = {weight!r}: expected a finite number")
        kwargs = entry.get("kwargs", {})
        if not isinstance(kwargs, Mapping):
            raise EnvError(f"{where}.kwargs = {kwargs!r}: expected a mapping")
        path = entry["function"]
        if path in BUILT_IN_REWARDS:
            _check_builtin_kwargs(path, kwargs, where)
            function, style = BUILT_IN_REWARDS[path], "builtin"
        elif ":" in path or "." in path:
            function = import_callable(path, f"{where}.function")
            style = reward_style(function, f"{where}.function = {path!r}")
        else:
            close = difflib.get_close_matches(path, list(BUILT_IN_REWARDS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnvError(
                f"{where}.function = {path!r} is not a built-in reward{hint} "
                f"({', '.join(BUILT_IN_REWARDS)}) nor an import path 'package.module:function'"
            )
        name = entry.get("name", path if style == "builtin" else function.__name__)
        taken = {f.name for f in functions}
        if name in taken:
            raise EnvError(
                f"{where}.name = {name!r}: another reward function has this name; give each "
                "a distinct `name` (it keys the per-function metrics)"
            )
        functions.append(RewardFunction(str(name), function, float(weight), style, dict(kwargs)))
    return functions


def _trl_kwargs(completions: Sequence[Completion]) -> dict[str, Any]:
    """The keyword arguments TRL's GRPOTrainer adds to every reward call
    (`_calculate_rewards`): each column of the rows but `prompt`, `completion` and
    `completion_ids` as a per-row list, and `trainer_state`, `log_extra` and `log_metric`. The
    trainer's state has no counterpart on an env rank (None); the two logging hooks accept
    their arguments and drop them."""
    excluded = ("prompt", "completion", "completion_ids")
    names = [name for name in completions[0].row if name not in excluded]
    columns = {name: [c.row.get(name) for c in completions] for name in names}
    return columns | {"trainer_state": None, "log_extra": _ignore, "log_metric": _ignore}


def _ignore(*args: Any, **kwargs: Any) -> None:
    """A logging hook whose records are not kept."""


def _verl_extra_info(completion: Completion) -> dict[str, Any]:
    """The row's `extra_info` with the two keys verl's NaiveRewardManager adds to it before
    every call: `num_turns` (1: a single-turn task) and `rollout_reward_scores` (empty)."""
    extra_info = completion.row.get("extra_info")
    extra_info = dict(extra_info) if isinstance(extra_info, Mapping) else {}
    return extra_info | {"num_turns": 1, "rollout_reward_scores": {}}


def _trl_completions(completions: Sequence[Completion]) -> list[Any]:
    """The completions as TRL gives them: texts, or for chat prompts one assistant message
    each."""
    return [
        [{"role": "assistant", "content": c.text}] if isinstance(c.prompt, list) else c.text
        for c in completions
    ]


async def _gather(calls: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*calls))


def _verl_score(value: Any) -> Any:
    """A verl `compute_score` result: a number, or a dict whose `score` is the reward."""
    return value["score"] if isinstance(value, Mapping) and "score" in value else value


def call_reward_function(reward: RewardFunction, completions: Sequence[Completion]) -> list[Any]:
    """`reward`'s raw values for `completions`, called as its library calls it (coroutines
    awaited)."""

    def resolved(value: Any) -> Any:
        return asyncio.run(value) if inspect.isawaitable(value) else value

    if reward.style == "builtin":
        return list(reward.function(completions, **reward.kwargs))
    if reward.style == "verl":
        calls = [
            reward.function(
                data_source=c.row.get("data_source"),
                solution_str=c.text,
                ground_truth=c.answer,
                extra_info=_verl_extra_info(c),
                **reward.kwargs,
            )
            for c in completions
        ]
        if calls and all(inspect.isawaitable(call) for call in calls):
            # An async compute_score scores the rows concurrently, as verl's reward loop does.
            calls = asyncio.run(_gather(calls))
        return [_verl_score(resolved(call)) for call in calls]
    values = reward.function(
        prompts=[c.prompt for c in completions],
        completions=_trl_completions(completions),
        completion_ids=[list(c.ids) for c in completions],
        **_trl_kwargs(completions),
        **reward.kwargs,
    )
    return list(resolved(values))


def _checked_values(values: Any, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """`values` as float64 `[n]` (NaN for None), which rows failed, and the first error."""
    out = np.full(n, np.nan)
    failed = np.zeros(n, bool)
    if len(values) != n:
        failed[:] = True
        return out, failed, f"returned {len(values)} values for {n} completions"
    error = ""
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if math.isfinite(number):
            out[i] = number
        else:
            failed[i] = True
            error = error or f"returned {value!r} (not a finite number)"
    return out, failed, error


def score_completions(
    functions: Sequence[RewardFunction],
    completions: Sequence[Completion],
    timeout_s: float = 30.0,
    reward_on_error: float = 0.0,
) -> RewardBatch:
    """Every function's values for `completions`, run concurrently under `timeout_s`, and
    their weighted sum per row (None values skipped, as TRL's nansum does; a row where every
    function returned None, or one failed, gets `reward_on_error`)."""
    n, k = len(completions), len(functions)
    results: list[Any] = [None] * k
    errors: list[BaseException | None] = [None] * k

    def run(j: int) -> None:
        try:
            results[j] = call_reward_function(functions[j], completions)
        except BaseException as err:  # noqa: BLE001 - a user's function: any failure is counted
            errors[j] = err

    threads = [threading.Thread(target=run, args=(j,), daemon=True) for j in range(k)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    values = np.full((n, k), np.nan)
    failed = np.zeros((n, k), bool)
    messages: dict[str, str] = {}
    for j, (reward, thread) in enumerate(zip(functions, threads, strict=True)):
        if thread.is_alive():
            failed[:, j] = True
            messages[reward.name] = f"ran past its time limit of {timeout_s:g} s"
        elif errors[j] is not None:
            failed[:, j] = True
            messages[reward.name] = f"raised {type(errors[j]).__name__}: {errors[j]}"
        else:
            try:
                values[:, j], failed[:, j], message = _checked_values(results[j], n)
            except TypeError:
                failed[:, j] = True
                message = f"returned {type(results[j]).__name__}, not a list"
            if message:
                messages[reward.name] = message
    weights = np.array([f.weight for f in functions])
    applied = np.isfinite(values)
    total = np.where(applied, values * weights, 0.0).sum(axis=1)
    batch = RewardBatch(total, values, failed, messages)
    return dataclasses.replace(batch, total=np.where(batch.error_rows, reward_on_error, total))
