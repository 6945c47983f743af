"""A verifiable code task (`agentenv_jax/Code-v0`): the policy writes a function, and its
reward is the fraction of hidden unit tests that function passes in the sandbox.

A question asks for one function (`code_problems`: 326 problems of 9 families); the policy's
message is read for its last ```python block (the whole message without one), and that code
runs in the env rank's sandbox pool (`envs/sandbox`) under a fixed harness: the code is
executed, the function is called on each test's inputs, and each output is printed as one
JSON line. The expected outputs never enter the sandbox: the host compares what came back, so
a program can only earn a test by computing its output. Code that does not compile, lacks the
function, raises, loops past `time_limit_s` or prints past the output cap scores the tests it
finished before that. An episode is one message.

Questions are split by a hash of their text (`question_split`): `test_fraction` of them (0.2:
72 of the 326) are never drawn for training and are what `agentenv eval --split test` scores.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agentenv_jax.envs.sandbox import SandboxPool, SandboxSettings, shared_pool
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.code_problems import PROBLEMS, Problem
from agentenv_jax.envs.text.tasks import (
    TASK_SPLITS,
    TaskReply,
    question_split,
    require_int,
    require_seconds,
    require_split,
)

INSTRUCTION = "Answer with the function only, in a ```python code block."
# The program the sandbox runs: the answer's code and the tests' inputs come on stdin, so the
# harness's text never changes and nothing of the answer is pasted into it.
HARNESS = """\
import json, sys
request = json.loads(sys.stdin.read())
namespace = {"__name__": "answer"}
exec(compile(request["source"], "<answer>", "exec"), namespace)
function = namespace.get(request["function"])
if not callable(function):
    raise SystemExit(f"the answer defines no function {request['function']}")
for index, arguments in enumerate(request["inputs"]):
    try:
        line = json.dumps({"test": index, "output": function(*arguments)})
    except Exception as err:
        line = json.dumps({"test": index, "error": type(err).__name__})
    sys.__stdout__.write(line + "\\n")
    sys.__stdout__.flush()
"""
_BLOCK = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
# A function's memory in the sandbox unless env.kwargs.sandbox.memory_mb says otherwise.
_CODE_MEMORY_MB = 256


def answer_code(message: str) -> str:
    """The code in a message: its last ``` block (``` python or plain; an unclosed last block
    runs to the message's end, as a cut-off answer does), else the whole message."""
    blocks = _BLOCK.findall(message)
    return blocks[-1] if blocks else message


def passed_tests(stdout: str, expected: Sequence[Any]) -> int:
    """How many tests the harness's `stdout` shows passed: a test passes when its JSON line's
    output equals the expected output (as JSON: tuples are lists). Lines that are not the
    harness's (the answer's own prints) are ignored; each test counts once."""
    wanted = [json.loads(json.dumps(value)) for value in expected]
    passed = set()
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or "output" not in record:
            continue
        index = record.get("test")
        if isinstance(index, int) and 0 <= index < len(wanted):
            if record["output"] == wanted[index]:
                passed.add(index)
    return len(passed)


def split_sizes(test_fraction: float) -> dict[str, int]:
    """How many of the problems each split holds at `test_fraction`."""
    sides = [question_split(p.question, test_fraction) for p in PROBLEMS]
    return {split: sides.count(split) for split in TASK_SPLITS}


class CodeTask:
    """Write the function a question asks for; the reward is the fraction of its hidden tests
    that pass (see the module)."""

    max_turns = 1

    def __init__(
        self,
        split: str = "train",
        test_fraction: float = 0.2,
        tests: int = 8,
        time_limit_s: float = 2.0,
        instruction: str = INSTRUCTION,
        sandbox: Mapping[str, Any] | str | None = None,
    ):
        self.test_fraction = require_split(split, test_fraction)
        self.tests = require_int("env.kwargs.tests", tests, 1, 100)
        require_seconds("env.kwargs.time_limit_s", time_limit_s, 60)
        if not isinstance(instruction, str):
            raise EnvError(f"env.kwargs.instruction = {instruction!r}: expected a string")
        self.split = split
        self._instruction = instruction
        self._problems = [
            p for p in PROBLEMS if question_split(p.question, self.test_fraction) == split
        ]
        self._settings = SandboxSettings.from_config(
            sandbox,
            defaults={"wall_s": time_limit_s, "cpu_s": time_limit_s, "memory_mb": _CODE_MEMORY_MB},
        )
        self._pool: SandboxPool = shared_pool(self._settings)
        self.problem: Problem | None = None
        self._cases: list[tuple[tuple[Any, ...], Any]] = []

    def distinct_questions(self, entries: int = 0) -> dict[str, int]:
        """How many distinct questions each split holds (all of them; `entries` is unused)."""
        return split_sizes(self.test_fraction)

    def reset(self, rng: np.random.Generator) -> str:
        self.problem = self._problems[int(rng.integers(len(self._problems)))]
        self._cases = self.problem.tests(rng, self.tests)
        return (
            f"{self.problem.question}\n{self._instruction}"
            if self._instruction
            else (self.problem.question)
        )

    def reply(self, message: str) -> TaskReply:
        return CodeTask.reply_batch([self], [message], [np.zeros(0, np.int32)])[0]

    @staticmethod
    def reply_batch(
        tasks: Sequence[CodeTask], messages: Sequence[str], message_ids: Sequence[np.ndarray]
    ) -> list[TaskReply]:
        """Every answer scored, the batch's programs run at once in the sandbox pool."""
        for task in tasks:
            if task.problem is None:
                raise RuntimeError("CodeTask.reply before reset")
        requests = [
            {
                "kind": "source",
                "source": HARNESS,
                "stdin": json.dumps(
                    {
                        "source": answer_code(message),
                        "function": task.problem.function,
                        "inputs": [list(arguments) for arguments, _ in task._cases],
                    }
                ),
            }
            for task, message in zip(tasks, messages, strict=True)
        ]
        results = tasks[0]._pool.map(requests)
        replies = []
        for task, result in zip(tasks, results, strict=True):
            expected = [output for _, output in task._cases]
            score = passed_tests(result.stdout, expected) / len(expected)
            replies.append(TaskReply(text=None, reward=score, done=True, success=score == 1.0))
        return replies
