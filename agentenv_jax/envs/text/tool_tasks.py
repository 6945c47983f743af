"""Text tasks solved with tools: the policy may call a tool inside its turn, gets the result as
a tool turn, and goes on until it answers without a call (or runs out of turns).

`ToolTask` wraps a single-turn task: its prompt gains the tools' descriptions and the call
format (`tools.parse_tool_call`'s tag, which needs no support from the chat template); a
message that calls a tool is answered by `tools.run_tool` as a `tool` turn, with
`tool_error_reward` when the call fails (an unknown tool, bad arguments, an exception, a run
past the time limit, a result too long); the first message without a call is the answer, and
the inner task's reward ends the episode. The env counts every message, calls included, against
`max_turns`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import ArithmeticTask, TaskReply, TextTask, require_int
from agentenv_jax.envs.text.tools import (
    BUILT_IN_TOOLS,
    TIME_LIMIT_S,
    ToolError,
    parse_tool_call,
    run_tool,
)


def resolve_tools(names: Any, field: str = "env.kwargs.tools") -> dict[str, Callable[..., Any]]:
    """The tools `names` lists: built-in ones by name (`calculator`, `python`) or a user's
    function as `module:function` (called with the call's arguments as keywords, its result
    the tool turn's text); `EnvError` naming what cannot be found."""
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise EnvError(
            f"{field} = {names!r}: expected a non-empty list of tools ({', '.join(BUILT_IN_TOOLS)}"
            " or module:function)"
        )
    tools: dict[str, Callable[..., Any]] = {}
    for name in names:
        if name in BUILT_IN_TOOLS:
            tools[name] = BUILT_IN_TOOLS[name]
            continue
        module_name, _, function_name = str(name).partition(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError, ValueError):
            function = None
        if not function_name or not callable(function):
            raise EnvError(
                f"{field}: {name!r} is neither a built-in tool ({', '.join(BUILT_IN_TOOLS)}) nor "
                "an importable module:function"
            )
        tools[function_name] = function
    return tools


def tool_instructions(tools: dict[str, Callable[..., Any]]) -> str:
    """What the prompt says about the tools: each one's name and first docstring line, and
    how to call one."""
    lines = [
        f"- {name}(expression): {(tool.__doc__ or '').strip().splitlines()[0]}"
        if (tool.__doc__ or "").strip()
        else f"- {name}"
        for name, tool in tools.items()
    ]
    example = json.dumps({"name": next(iter(tools)), "arguments": {"expression": "..."}})
    return (
        "Tools:\n" + "\n".join(lines) + f"\nTo use one, write <tool_call>{example}</tool_call>; "
        "its result comes back. Then give your answer without a tool call."
    )


class ToolTask:
    """A single-turn task answered with the help of tools (see the module)."""

    def __init__(
        self,
        task: TextTask,
        tools: dict[str, Callable[..., Any]],
        max_turns: int = 4,
        tool_error_reward: float = 0.0,
        time_limit_s: float = TIME_LIMIT_S,
    ):
        self._task = task
        self._tools = tools
        self.max_turns = require_int("env.kwargs.max_turns", max_turns, 1)
        self._error_reward = float(tool_error_reward)
        self._time_limit_s = float(time_limit_s)
        self._instructions = tool_instructions(tools)

    def reset(self, rng: np.random.Generator) -> str:
        return f"{self._task.reset(rng)}\n{self._instructions}"

    def reply(self, message: str) -> TaskReply:
        try:
            call = parse_tool_call(message)
        except ToolError as err:
            return TaskReply(f"error: {err}", self._error_reward, False, False, role="tool")
        if call is None:
            return self._task.reply(message)
        text, ok = run_tool(self._tools, *call, time_limit_s=self._time_limit_s)
        return TaskReply(text, 0.0 if ok else self._error_reward, False, False, role="tool")


class ToolArithmeticTask(ToolTask):
    """Arithmetic on operands up to `max_operand` (999: products a small model cannot do in
    its head) with `tools` (the calculator by default) over up to `max_turns` messages; the
    answer's reward is `ArithmeticTask`'s (1.0 right, `format_reward` for another integer)."""

    def __init__(
        self,
        max_operand: int = 999,
        operations: str = "+-*",
        question: str = "What is {expression}? Answer with the number only.",
        format_reward: float = 0.0,
        tools: Sequence[str] = ("calculator",),
        max_turns: int = 3,
        tool_error_reward: float = 0.0,
        time_limit_s: float = TIME_LIMIT_S,
        answer_format: str = "exact",
    ):
        if (
            isinstance(time_limit_s, bool)
            or not isinstance(time_limit_s, int | float)
            or not 0 < time_limit_s <= 60
        ):
            raise EnvError(
                f"env.kwargs.time_limit_s = {time_limit_s!r}: expected seconds in (0, 60]"
            )
        super().__init__(
            ArithmeticTask(max_operand, operations, format_reward, question, answer_format),
            resolve_tools(tools),
            max_turns,
            tool_error_reward,
            time_limit_s,
        )
