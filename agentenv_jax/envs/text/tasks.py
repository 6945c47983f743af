"""Text tasks: the protocol a dialogue task follows, and the built-in arithmetic and guessing tasks.

A task holds one episode's state in plain Python; `TextVectorEnv` turns it into token ids,
counts the turns and enforces `max_turns`. Tasks have no dependencies beyond numpy.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np

from agentenv_jax.envs.spaces import EnvError

# An integer as an agent may write it, surrounding whitespace stripped. ASCII digits only:
# `int()` would also take "٣" or "1_000", which a byte-level agent should not be paid for.
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}


@dataclasses.dataclass(frozen=True)
class TaskReply:
    """A task's answer to one agent message."""

    text: str | None  # the env's answer to the agent's message (None when the episode ended)
    reward: float
    done: bool  # the episode is over (solved, or a single-turn task answered)
    success: bool  # the episode's goal was met; read where done or truncated
    role: str = "user"  # the chat role the answer is rendered as: user, or tool (a tool's result)
    # Each reward function's value (NaN: none, or it failed) and whether it failed, for tasks
    # whose reward is a weighted sum of named functions (`TextTask.reward_names`).
    terms: tuple[float, ...] = ()
    failed: tuple[bool, ...] = ()
    # The message is left out of training (its step is padding, as a step an env did not act
    # on): a reward that could not be computed, under `reward_on_error: drop`.
    dropped: bool = False


# A prompt: its text (rendered as one user turn), or chat messages ({"role", "content"} each,
# e.g. a system turn and a user turn) as a dataset's conversational rows hold them.
Prompt = str | list[dict[str, str]]


class TextTask(Protocol):
    """One dialogue episode at a time: a prompt, then a reply to each agent message.

    This is the interface a user's own task implements (`env.id: package.module:MyTask`,
    docs/own_tasks.md). Optionally, a task class may also define

    * `reward_names: tuple[str, ...]`: the names of the reward functions its rewards sum, whose
      values its replies carry in `TaskReply.terms` (logged per update as `reward/<name>`);
    * `reply_batch(tasks, messages, message_ids) -> list[TaskReply]`, a static method that
      answers the messages of several envs' copies of the task at once (`reply_all`), so a
      reward function scores a batch in one call.
    """

    max_turns: int  # agent messages per episode; at the limit the env truncates the episode

    def reset(self, rng: np.random.Generator) -> Prompt:
        """Start a new episode drawn from `rng`; its prompt."""
        ...

    def reply(self, message: str) -> TaskReply:
        """The task's reply to the agent's message (decoded text)."""
        ...


def reply_all(
    tasks: Sequence[TextTask], messages: Sequence[str], message_ids: Sequence[np.ndarray]
) -> list[TaskReply]:
    """Each task's reply to its message: one `reply_batch` call where the tasks' class has one
    (the envs of a vector env are copies of one task), else `reply` task by task."""
    reply_batch = getattr(type(tasks[0]), "reply_batch", None) if tasks else None
    if reply_batch is not None:
        return list(reply_batch(tasks, messages, message_ids))
    return [task.reply(message) for task, message in zip(tasks, messages, strict=True)]


def prompt_text(prompt: Prompt) -> str:
    """A prompt as plain text: its text, or its messages' contents one after another."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(str(message.get("content", "")) for message in prompt)


def prompt_messages(prompt: Prompt) -> list[dict[str, str]]:
    """A prompt as chat messages: its messages, or its text as one user turn."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


TASK_SPLITS = ("train", "test")


def question_split(question: str, test_fraction: float) -> str:
    """The split (`"train"` or `"test"`) that `question` belongs to: `"test"` where a hash of
    its text (whitespace runs made one space, ends stripped) falls below `test_fraction` of
    the hash range. A pure function of the text, so every copy of a question, whichever seed
    or index generated it, lands on the same side."""
    normalized = " ".join(question.split()).encode()
    digest = hashlib.blake2b(normalized, digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") < test_fraction * 2**64 else "train"


def require_split(split: object, test_fraction: object) -> float:
    """`test_fraction` as a float if `split` is one of `TASK_SPLITS` and `test_fraction` a
    number strictly between 0 and 1 (the share of questions held out by `question_split`);
    otherwise an `EnvError` naming the setting, its value and what is allowed."""
    if split not in TASK_SPLITS:
        raise EnvError(
            f"env.kwargs.split = {split!r} is not allowed: expected one of {', '.join(TASK_SPLITS)}"
        )
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, int | float)
        or not 0.0 < test_fraction < 1.0
    ):
        raise EnvError(
            f"env.kwargs.test_fraction = {test_fraction!r} is not allowed: expected a "
            "number strictly between 0 and 1 (the share of questions held out for test)"
        )
    return float(test_fraction)


def require_seconds(field: str, value: object, maximum: float) -> float:
    """`value` as a float if it is a number of seconds in (0, `maximum`] (bools are not);
    otherwise an `EnvError` naming `field`, the value and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= maximum:
        raise EnvError(f"{field} = {value!r}: expected seconds in (0, {maximum:g}]")
    return float(value)


def require_known_kwargs(kwargs: Iterable[str], allowed: Sequence[str], env_id: str) -> None:
    """An `EnvError` naming the first of `kwargs` (env.kwargs names) not in `allowed`, with the
    closest allowed name and all of them."""
    for name in kwargs:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnvError(
                f"env.kwargs.{name} is not a kwarg of env.id = {env_id!r}{hint}; allowed: "
                f"{', '.join(allowed)}"
            )


def require_int(field: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """`value` if it is an int in `minimum..maximum` (bools are not ints here); otherwise an
    `EnvError` naming `field`, the value and the allowed range."""
    allowed = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise EnvError(f"{field} = {value!r}: expected an int {allowed}")
    if value < minimum or (maximum is not None and value > maximum):
        raise EnvError(f"{field} = {value!r}: expected an int {allowed}")
    return int(value)


# A number as a chat model writes one inside a sentence: an optional sign, digits with optional
# thousands commas, an optional decimal part.
_NUMBER = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?", re.ASCII)
ANSWER_FORMATS = ("exact", "last_number", "boxed")


def _last_boxed(message: str) -> str | None:
    """The content of the last `\\boxed{...}` of `message` (nested braces kept), else None."""
    start = message.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(message)):
        depth += {"{": 1, "}": -1}.get(message[i], 0)
        if depth < 0:
            return message[begin:i]
    return None


def answer_text(message: str, answer_format: str) -> str | None:
    """The part of `message` that is its answer, as `answer_format` says: "exact" (the whole
    message, stripped), "last_number" (the last number in it, as in GSM8K's scoring: "17 + 25
    = 42." answers "42") or "boxed" (the content of its last `\\boxed{}`, stripped); None
    without one."""
    if answer_format == "exact":
        return message.strip()
    if answer_format == "boxed":
        boxed = _last_boxed(message)
        return None if boxed is None else boxed.strip()
    numbers = _NUMBER.findall(message)
    return numbers[-1] if numbers else None


def parse_number(text: str) -> float | None:
    """The number `text` is (thousands commas allowed), else None."""
    return float(text.replace(",", "")) if _NUMBER.fullmatch(text.strip()) else None


def extract_answer(message: str, answer_format: str) -> float | None:
    """The number `message` answers, read as `answer_format` says (`answer_text`; "exact":
    the whole message is the integer); None without one."""
    if answer_format == "exact":
        value = parse_integer(message)
        return None if value is None else float(value)
    text = answer_text(message, answer_format)
    return None if text is None else parse_number(text)


def parse_integer(message: str) -> int | None:
    """The integer `message` states (whitespace stripped, ASCII digits, optional sign), else
    None."""
    text = message.strip()
    return int(text) if _INTEGER.fullmatch(text) else None


class ArithmeticTask:
    """Single-turn arithmetic: the prompt is e.g. `"3+4="`, the agent answers the integer.
    `question` words the prompt around `{expression}` (a chat model is asked "What is 3+4?").

    Operands are drawn uniformly from `0..max_operand` (the difficulty), the operation uniformly
    from `operations` (any of `+-*`). The answer is read as `answer_format` says (`exact`: the
    whole message, `last_number`, or `boxed`: see `extract_answer`). Reward 1.0 for the right
    value (`" 7"` and `"+7"` count), `format_reward` for another number, 0.0 for anything else.
    """

    max_turns = 1

    def __init__(
        self,
        max_operand: int = 9,
        operations: str = "+",
        format_reward: float = 0.1,
        question: str = "{expression}=",
        answer_format: str = "exact",
    ):
        self._max_operand = require_int("env.kwargs.max_operand", max_operand, 1)
        if answer_format not in ANSWER_FORMATS:
            raise EnvError(
                f"env.kwargs.answer_format = {answer_format!r}: expected one of "
                f"{', '.join(ANSWER_FORMATS)}"
            )
        self._answer_format = answer_format
        if not isinstance(question, str) or "{expression}" not in question:
            raise EnvError(
                f"env.kwargs.question = {question!r}: expected a string holding {{expression}} "
                "(where the sum goes, e.g. 'What is {expression}?')"
            )
        self._question = question
        if (
            not isinstance(operations, str)
            or not operations
            or not set(operations) <= set(_OPERATIONS)
        ):
            raise EnvError(
                f"env.kwargs.operations = {operations!r}: expected a non-empty string of the "
                f"characters {''.join(_OPERATIONS)!r}"
            )
        self._operations = "".join(sorted(set(operations), key=list(_OPERATIONS).index))
        if (
            isinstance(format_reward, bool)
            or not isinstance(format_reward, int | float)
            or not 0.0 <= format_reward < 1.0
        ):
            raise EnvError(
                f"env.kwargs.format_reward = {format_reward!r}: expected a number in [0, 1) "
                "(below the 1.0 of a right answer)"
            )
        self._format_reward = float(format_reward)
        self._answer: int | None = None

    def reset(self, rng: np.random.Generator) -> str:
        left, right = (int(x) for x in rng.integers(0, self._max_operand + 1, size=2))
        symbol = self._operations[int(rng.integers(len(self._operations)))]
        self._answer = _OPERATIONS[symbol](left, right)
        return self._question.replace("{expression}", f"{left}{symbol}{right}")

    def reply(self, message: str) -> TaskReply:
        if self._answer is None:
            raise RuntimeError("ArithmeticTask.reply before reset")
        guess = extract_answer(message, self._answer_format)
        right = guess == self._answer
        reward = 1.0 if right else (self._format_reward if guess is not None else 0.0)
        return TaskReply(text=None, reward=reward, done=True, success=right)


class GuessNumberTask:
    """Multi-turn guessing: find a number drawn uniformly from `1..max_number`.

    Each message is read as an integer guess; the reply is `"higher"` or `"lower"`, or
    `"a number from 1 to N"` for anything else. The right guess ends the episode with reward
    1.0; every other message earns 0.0. After `max_turns` messages the env truncates it.
    Bisection finds any number within `ceil(log2(max_number + 1))` guesses (4 for the default
    8), so a `max_turns` below that leaves some episodes unwinnable.
    """

    def __init__(self, max_number: int = 8, max_turns: int = 4):
        self._max_number = require_int("env.kwargs.max_number", max_number, 1)
        self.max_turns = require_int("env.kwargs.max_turns", max_turns, 1)
        self._target: int | None = None

    def reset(self, rng: np.random.Generator) -> str:
        self._target = int(rng.integers(1, self._max_number + 1))
        return f"Guess my number (1-{self._max_number}):"

    def reply(self, message: str) -> TaskReply:
        if self._target is None:
            raise RuntimeError("GuessNumberTask.reply before reset")
        guess = parse_integer(message)
        if guess is None or not 1 <= guess <= self._max_number:
            text = f"a number from 1 to {self._max_number}"
        elif guess == self._target:
            return TaskReply(text=None, reward=1.0, done=True, success=True)
        else:
            text = "higher" if guess < self._target else "lower"
        return TaskReply(text=text, reward=0.0, done=False, success=False)
