"""Text tasks solved with tools: the policy may call a tool inside its turn, gets the result as
a tool turn, and goes on until it answers without a call (or runs out of turns).

`ToolTask` wraps a single-turn task: its prompt gains the tools' descriptions and the call
format (`tools.parse_tool_call`'s tag, which needs no support from the chat template); a
message that calls a tool is answered as a `tool` turn, with `tool_error_reward` when the call
fails (an unknown tool, bad arguments, an exception, a run past the time limit, a result too
long); the first message without a call is the answer, and the inner task's reward ends the
episode. The env counts every message, calls included, against `max_turns`.

The built-in tools (`calculator`, `python`, and `code`, a code interpreter) run in the env
rank's sandbox pool (`envs/sandbox`), where their time, memory and output limits hold; a
user's tool runs there when its entry says `sandbox: true`, else in this process. A vector
step's tool calls run at once, up to `sandbox.workers` of them, so the step costs about its
slowest call, not their sum.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import importlib.util
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentenv_jax.envs.sandbox import (
    SandboxContents,
    SandboxPool,
    SandboxResult,
    SandboxSettings,
    shared_pool,
)
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import tools as tools_module
from agentenv_jax.envs.text.tasks import (
    ArithmeticTask,
    TaskReply,
    TextTask,
    reply_all,
    require_int,
    require_seconds,
)
from agentenv_jax.envs.text.tools import (
    BUILT_IN_TOOLS,
    CODE_TOOL,
    CODE_TOOL_DESCRIPTION,
    MAX_RESULT,
    TIME_LIMIT_S,
    ToolError,
    code_turn,
    parse_tool_call,
    run_tool,
)

# The name the sandbox loads the built-in tools' module under (it imports only the stdlib).
_BUILT_IN_MODULE = "agentenv_tools"
# A tool's memory in the sandbox unless env.kwargs.sandbox.memory_mb says otherwise: enough
# for the interpreter and real work, and an expression asking for a gigabyte fails at once.
_TOOL_MEMORY_MB = 256


@dataclasses.dataclass(frozen=True)
class Tool:
    """A tool the policy may call: how the prompt shows it, and where it runs."""

    name: str
    parameters: tuple[str, ...]  # its arguments, as the prompt shows them
    description: str
    function: Callable[..., Any] | None = None  # runs in this process (None: in the sandbox)
    sandbox_function: str | None = None  # "module:function" the sandbox calls
    module_paths: tuple[str, ...] = ()  # what the sandbox must read to import it
    sys_path: tuple[str, ...] = ()  # the folder its top-level module is found in

    @property
    def runs_code(self) -> bool:
        return self.name == CODE_TOOL

    @property
    def sandboxed(self) -> bool:
        return self.function is None


def _first_line(function: Any) -> str:
    return ((function.__doc__ or "").strip().splitlines() or [""])[0]


def _built_in(name: str) -> Tool:
    if name == CODE_TOOL:
        return Tool(CODE_TOOL, ("code",), CODE_TOOL_DESCRIPTION)
    function = BUILT_IN_TOOLS[name]
    return Tool(
        name, ("expression",), _first_line(function), sandbox_function=f"{_BUILT_IN_MODULE}:{name}"
    )


BUILT_IN_TOOL_NAMES = (*BUILT_IN_TOOLS, CODE_TOOL)


def _import_tool(entry: str, sandbox: bool, field: str) -> Tool:
    module_name, _, function_name = entry.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError):
        function = None
    if not function_name or not callable(function):
        raise EnvError(
            f"{field}: {entry!r} is neither a built-in tool ({', '.join(BUILT_IN_TOOL_NAMES)}) "
            "nor an importable module:function"
        )
    parameters = tuple(inspect.signature(function).parameters)
    if not sandbox:
        return Tool(function_name, parameters, _first_line(function), function)
    # What the sandbox reads to import it: the top-level module's package folder (or file),
    # and the folder it is found in goes first on the sandbox's sys.path.
    spec = importlib.util.find_spec(module_name.partition(".")[0])
    if spec.submodule_search_locations:
        paths = tuple(spec.submodule_search_locations)
        home = str(Path(paths[0]).parent)
    else:
        paths = (spec.origin,)
        home = str(Path(spec.origin).parent)
    return Tool(
        function_name,
        parameters,
        _first_line(function),
        sandbox_function=entry,
        module_paths=paths,
        sys_path=(home,),
    )


def resolve_tools(names: Any, field: str = "env.kwargs.tools") -> dict[str, Tool]:
    """The tools `names` lists: built-in ones by name (`calculator`, `python`, `code`), a
    user's function as `module:function` (called in this process with the call's arguments as
    keywords, its result the tool turn's text), or `{name: module:function, sandbox: true}`
    for a user's function called in the sandbox; `EnvError` naming what cannot be found."""
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise EnvError(
            f"{field} = {names!r}: expected a non-empty list of tools "
            f"({', '.join(BUILT_IN_TOOL_NAMES)}, module:function or "
            "{name: module:function, sandbox: true})"
        )
    tools: dict[str, Tool] = {}
    for index, entry in enumerate(names):
        sandbox = False
        if isinstance(entry, Mapping):
            if set(entry) - {"name", "sandbox"} or not isinstance(entry.get("name"), str):
                raise EnvError(
                    f"{field}[{index}] = {dict(entry)!r}: expected "
                    "{name: module:function, sandbox: true or false}"
                )
            sandbox = entry.get("sandbox", False)
            if not isinstance(sandbox, bool):
                raise EnvError(f"{field}[{index}].sandbox = {sandbox!r}: expected true or false")
            entry = entry["name"]
        if entry in BUILT_IN_TOOL_NAMES:
            tool = _built_in(entry)
        else:
            tool = _import_tool(str(entry), sandbox, field)
        tools[tool.name] = tool
    return tools


def tool_instructions(tools: Mapping[str, Tool]) -> str:
    """What the prompt says about the tools: each one's name, arguments and first docstring
    line, and how to call one."""
    lines = [
        f"- {tool.name}({', '.join(tool.parameters)})"
        + (f": {tool.description}" if tool.description else "")
        for tool in tools.values()
    ]
    first = next(iter(tools.values()))
    example = json.dumps(
        {"name": first.name, "arguments": {p: "..." for p in first.parameters[:1]}}
    )
    return (
        "Tools:\n" + "\n".join(lines) + f"\nTo use one, write <tool_call>{example}</tool_call>; "
        "its result comes back. Then give your answer without a tool call."
    )


class ToolTask:
    """A single-turn task answered with the help of tools (see the module)."""

    def __init__(
        self,
        task: TextTask,
        tools: dict[str, Tool],
        max_turns: int = 4,
        tool_error_reward: float = 0.0,
        time_limit_s: float = TIME_LIMIT_S,
        sandbox: Mapping[str, Any] | str | None = None,
        code_session: bool = False,
    ):
        self._task = task
        self._tools = tools
        self.max_turns = require_int("env.kwargs.max_turns", max_turns, 1)
        self._error_reward = float(tool_error_reward)
        self._time_limit_s = float(time_limit_s)
        self._instructions = tool_instructions(tools)
        if not isinstance(code_session, bool):
            raise EnvError(f"env.kwargs.code_session = {code_session!r}: expected true or false")
        # The code tool's earlier programs this episode, re-run (output discarded) before each
        # new one when `code_session` keeps a session per episode.
        self._code_session = code_session
        self._cells: list[str] = []
        # The tools' time limit is each call's wall-clock and CPU limit unless the sandbox
        # mapping sets its own.
        self._settings = SandboxSettings.from_config(
            sandbox,
            defaults={
                "wall_s": self._time_limit_s,
                "cpu_s": self._time_limit_s,
                "memory_mb": _TOOL_MEMORY_MB,
            },
        )
        self._pool: SandboxPool | None = None
        sandboxed = [tool for tool in tools.values() if tool.sandboxed]
        if sandboxed:
            contents = SandboxContents(
                read_only=tuple(p for tool in sandboxed for p in tool.module_paths),
                sys_path=tuple(p for tool in sandboxed for p in tool.sys_path),
                preload=tuple(
                    tool.sandbox_function.partition(":")[0]
                    for tool in sandboxed
                    if tool.module_paths
                ),
                preload_files=((_BUILT_IN_MODULE, tools_module.__file__),),
            )
            self._pool = shared_pool(self._settings, contents)

    def reset(self, rng: np.random.Generator) -> str:
        self._cells = []
        return f"{self._task.reset(rng)}\n{self._instructions}"

    def reply(self, message: str) -> TaskReply:
        return ToolTask.reply_batch([self], [message], [np.zeros(0, np.int32)])[0]

    @staticmethod
    def reply_batch(
        tasks: Sequence[ToolTask], messages: Sequence[str], message_ids: Sequence[np.ndarray]
    ) -> list[TaskReply]:
        """Every task's reply; the tool calls among the messages run at once (see the module)."""
        replies: list[TaskReply | None] = [None] * len(tasks)
        answers: list[int] = []
        calls: list[tuple[int, str, dict[str, Any]]] = []
        for i, (task, message) in enumerate(zip(tasks, messages, strict=True)):
            try:
                call = parse_tool_call(message)
            except ToolError as err:
                replies[i] = task._tool_turn(f"error: {err}", False)
                continue
            if call is None:
                answers.append(i)
            else:
                calls.append((i, *call))
        if answers:
            inner = reply_all(
                [tasks[i]._task for i in answers],
                [messages[i] for i in answers],
                [message_ids[i] for i in answers],
            )
            for i, reply in zip(answers, inner, strict=True):
                replies[i] = reply
        if calls:
            workers = tasks[0]._settings.workers
            with concurrent.futures.ThreadPoolExecutor(min(len(calls), workers)) as running:
                outcomes = list(running.map(lambda call: tasks[call[0]]._call(*call[1:]), calls))
            for (i, _, _), (text, ok) in zip(calls, outcomes, strict=True):
                replies[i] = tasks[i]._tool_turn(text, ok)
        return replies

    def _tool_turn(self, text: str, ok: bool) -> TaskReply:
        return TaskReply(text, 0.0 if ok else self._error_reward, False, False, role="tool")

    def _call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """One call's tool turn text and whether it succeeded."""
        tool = self._tools.get(name)
        if tool is None:
            return f"error: no tool {name!r}; tools: {', '.join(self._tools)}", False
        if not tool.sandboxed:
            return run_tool({name: tool.function}, name, arguments, time_limit_s=self._time_limit_s)
        if tool.runs_code:
            return self._run_code(arguments)
        if set(arguments) - set(tool.parameters):
            unknown = sorted(set(arguments) - set(tool.parameters))
            return f"error: {name} takes {', '.join(tool.parameters)}, not {unknown[0]}", False
        result = self._pool.run(
            {"kind": "call", "function": tool.sandbox_function, "kwargs": arguments}
        )
        return _call_turn(name, result, self._settings)

    def _run_code(self, arguments: dict[str, Any]) -> tuple[str, bool]:
        source = arguments.get("code")
        if not isinstance(source, str) or set(arguments) != {"code"}:
            return 'error: code takes one argument, "code": the program as a string', False
        history = self._cells if self._code_session else []
        result = self._pool.run_source(source, history=history)
        if result.ok and self._code_session:
            self._cells.append(source)
        stopped = result.exit_code is None or result.timed_out or result.output_exceeded
        status = result.failure(self._settings) if stopped else str(result.exit_code)
        return code_turn(status, result.stdout, result.stderr), result.ok


def _call_turn(name: str, result: SandboxResult, settings: SandboxSettings) -> tuple[str, bool]:
    """A sandboxed function call's tool turn text and whether it succeeded."""
    outcome = result.value
    if outcome is None:
        if result.output_exceeded:
            return f"error: {name} returned more than {settings.output_bytes:,} bytes", False
        return f"error: {name} {result.failure(settings) or 'gave no result'}", False
    if not outcome["ok"]:
        if outcome["error"] == ToolError.__name__:
            return f"error: {outcome['message']}", False
        if outcome["error"] == "MemoryError":
            return f"error: {name} ran out of memory (limit {settings.memory_mb} MB)", False
        return f"error: {name} raised {outcome['error']}: {outcome['message'][:200]}", False
    text = outcome["value"]
    if len(text) > MAX_RESULT:
        return f"error: {name} returned {len(text):,} characters (at most {MAX_RESULT:,})", False
    return text, True


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
        tools: Sequence[str | Mapping[str, Any]] = ("calculator",),
        max_turns: int = 3,
        tool_error_reward: float = 0.0,
        time_limit_s: float = TIME_LIMIT_S,
        answer_format: str = "exact",
        sandbox: Mapping[str, Any] | str | None = None,
        code_session: bool = False,
    ):
        require_seconds("env.kwargs.time_limit_s", time_limit_s, 60)
        super().__init__(
            ArithmeticTask(max_operand, operations, format_reward, question, answer_format),
            resolve_tools(tools),
            max_turns,
            tool_error_reward,
            time_limit_s,
            sandbox,
            code_session,
        )
