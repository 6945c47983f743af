"""Tools a text env's policy may call inside its turn, and how a call is written and answered.

A call is the documented tag `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
Hermes / Qwen format) anywhere in the policy's message; the env runs the tool and appends its
result as a `tool` turn. The built-in tools evaluate expressions by walking their syntax tree
(`ast`), never `eval`: only the nodes they allow, numbers of bounded size, and work bounded
before it is done (an exponent or a product that would be too large is refused, not
computed). The built-in tools run in the sandbox (`envs/sandbox`), which makes their time and
memory limits hold: this module imports only the standard library, so the sandbox loads it as
it is. A user's tool runs there when it opts in, else in this process under `run_tool`. Either
way, what it raises, a run past its time limit, or a result longer than the limit is one error
text, never a crashed env rank.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

MAX_EXPRESSION = 256  # characters of an expression a tool takes
MAX_INTEGER_BITS = 4096  # the largest integer a tool computes with (~1,233 digits)
MAX_SEQUENCE = 10_000  # elements of a list or tuple the python tool builds
MAX_RESULT = 1_000  # characters of a tool's result
TIME_LIMIT_S = 1.0  # how long a tool call may run

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolError(ValueError):
    """A call a tool refuses or cannot answer; its text is the tool turn's."""


def parse_tool_call(message: str) -> tuple[str, dict[str, Any]] | None:
    """The first `<tool_call>` of `message` as `(name, arguments)`, None without one;
    `ToolError` for a tag whose content is not `{"name": str, "arguments": {...}}`."""
    match = _CALL.search(message)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError as err:
        raise ToolError(f"the tool call is not JSON: {err.msg}") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ToolError('a tool call is {"name": "<tool>", "arguments": {...}}')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ToolError("a tool call's arguments are a JSON object")
    return call["name"], arguments


def _check_number(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
        raise ToolError(f"a number larger than 2**{MAX_INTEGER_BITS}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("a result that is not a finite number")
    return value


def _power(base: Any, exponent: Any) -> Any:
    # Bounded before it is computed: |base|**exponent has about exponent * log2|base| bits.
    if isinstance(exponent, int) and isinstance(base, int) and abs(base) > 1:
        if exponent * abs(base).bit_length() > MAX_INTEGER_BITS:
            raise ToolError(f"a power larger than 2**{MAX_INTEGER_BITS}")
    try:
        return operator.pow(base, exponent)
    except OverflowError:
        raise ToolError("a power too large for a float") from None


def _multiply(left: Any, right: Any) -> Any:
    if isinstance(left, list | tuple | str) or isinstance(right, list | tuple | str):
        count = right if isinstance(left, list | tuple | str) else left
        items = left if isinstance(left, list | tuple | str) else right
        if not isinstance(count, int) or len(items) * max(count, 0) > MAX_SEQUENCE:
            raise ToolError(f"a sequence longer than {MAX_SEQUENCE}")
    elif isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INTEGER_BITS + 1:
            raise ToolError(f"a product larger than 2**{MAX_INTEGER_BITS}")
    return left * right


_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _multiply,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_COMPARISONS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _bounded(function: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, list | tuple) and len(arg) > MAX_SEQUENCE:
                raise ToolError(f"a sequence longer than {MAX_SEQUENCE}")
        return function(*args)

    return call


def _sized_range(*args: Any) -> list[int]:
    values = range(*args)
    if len(values) > MAX_SEQUENCE:
        raise ToolError(f"a range longer than {MAX_SEQUENCE}")
    return list(values)


# The python tool's functions: pure, and bounded by their arguments' sizes.
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    name: _bounded(function)
    for name, function in {
        "abs": abs,
        "min": min,
        "max": max,
        "round": round,
        "sum": sum,
        "len": len,
        "int": int,
        "float": float,
        "sorted": sorted,
        "divmod": divmod,
    }.items()
} | {"range": _sized_range}


class _Evaluator:
    """Evaluates one expression's syntax tree: `python` allows comparisons, conditionals,
    sequences, subscripts and `_FUNCTIONS`; the calculator numbers and arithmetic alone."""

    def __init__(self, python: bool):
        self.python = python

    def __call__(self, node: ast.AST) -> Any:
        match node:
            case ast.Expression(body=body):
                return self(body)
            case ast.Constant(value=value) if isinstance(value, int | float) or (
                self.python and isinstance(value, str | bool)
            ):
                return _check_number(value)
            case ast.BinOp(left=left, op=op, right=right) if type(op) in _ARITHMETIC:
                try:
                    return _check_number(_ARITHMETIC[type(op)](self(left), self(right)))
                except ZeroDivisionError:
                    raise ToolError("division by zero") from None
                except TypeError as err:
                    raise ToolError(str(err)) from None
            case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNARY and (
                self.python or not isinstance(op, ast.Not)
            ):
                return _check_number(_UNARY[type(op)](self(operand)))
        if self.python:
            return self._python(node)
        raise ToolError(f"the calculator takes numbers and + - * / // % **, not {_what(node)}")

    def _python(self, node: ast.AST) -> Any:
        match node:
            case ast.Compare(left=left, ops=ops, comparators=comparators) if all(
                type(op) in _COMPARISONS for op in ops
            ):
                values = [self(left), *map(self, comparators)]
                return all(
                    _COMPARISONS[type(op)](a, b)
                    for op, a, b in zip(ops, values, values[1:], strict=False)
                )
            case ast.BoolOp(op=ast.And(), values=values):
                return all(self(v) for v in values)
            case ast.BoolOp(op=ast.Or(), values=values):
                return any(self(v) for v in values)
            case ast.IfExp(test=test, body=body, orelse=orelse):
                return self(body) if self(test) else self(orelse)
            case ast.List(elts=elements) | ast.Tuple(elts=elements):
                if len(elements) > MAX_SEQUENCE:
                    raise ToolError(f"a sequence longer than {MAX_SEQUENCE}")
                items = [self(e) for e in elements]
                return items if isinstance(node, ast.List) else tuple(items)
            case ast.Subscript(value=value, slice=index):
                try:
                    return self(value)[self(index)]
                except (IndexError, KeyError, TypeError) as err:
                    raise ToolError(str(err)) from None
            case ast.Slice(lower=lower, upper=upper, step=step):
                return slice(*(None if p is None else self(p) for p in (lower, upper, step)))
            case ast.Call(func=ast.Name(id=name), args=args, keywords=[]) if name in _FUNCTIONS:
                try:
                    return _FUNCTIONS[name](*map(self, args))
                except (TypeError, ValueError, OverflowError) as err:
                    raise ToolError(str(err)) from None
        raise ToolError(f"the python tool does not take {_what(node)}")


def _what(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return f"a call of {node.func.id!r}"
    return f"{type(node).__name__} expressions"


def _evaluate(expression: Any, python: bool) -> str:
    if not isinstance(expression, str):
        raise ToolError('the argument "expression" is a string')
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"an expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"not an expression: {err.msg}") from None
    value = _Evaluator(python)(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return repr(value) if python else str(value)


def calculator(expression: str) -> str:
    """Arithmetic on numbers: + - * / // % ** and parentheses, e.g. "(17 + 25) * 3"."""
    return _evaluate(expression, python=False)


def python(expression: str) -> str:
    """One Python expression over numbers, strings, lists and tuples: arithmetic, comparisons,
    `and`/`or`/`not`, `x if c else y`, subscripts and abs, min, max, round, sum, len, int,
    float, sorted, divmod, range. No names, attributes, loops or imports."""
    return _evaluate(expression, python=True)


BUILT_IN_TOOLS: dict[str, Callable[..., str]] = {"calculator": calculator, "python": python}
# The code interpreter runs a whole program in the sandbox; it has no function here.
CODE_TOOL = "code"
CODE_TOOL_DESCRIPTION = (
    "Runs a Python program and returns its exit status, stdout and stderr, e.g. "
    '"print(sum(range(10)))".'
)


def code_turn(exit_status: str, stdout: str, stderr: str) -> str:
    """The code tool's turn: the exit status (or what stopped the program), then its output,
    cut to `MAX_RESULT` characters with the cut said."""
    text = f"exit status: {exit_status}\nstdout:\n{stdout}"
    if stderr:
        text += f"\nstderr:\n{stderr}"
    if len(text) > MAX_RESULT:
        cut = len(text) - MAX_RESULT
        text = f"{text[:MAX_RESULT]}\n... ({cut:,} more characters)"
    return text


def run_tool(
    tools: Mapping[str, Callable[..., Any]],
    name: str,
    arguments: dict[str, Any],
    time_limit_s: float = TIME_LIMIT_S,
) -> tuple[str, bool]:
    """`(text, ok)`: the result of calling tool `name` with `arguments`, as text of at most
    `MAX_RESULT` characters, or the error a tool turn reports (`ok` False) when the tool is
    unknown, its arguments do not fit, it raises, it runs past `time_limit_s`, or its result is
    longer than `MAX_RESULT`."""
    if name not in tools:
        return f"error: no tool {name!r}; tools: {', '.join(tools)}", False
    outcome: list[tuple[str, Any]] = []

    def call() -> None:
        try:
            outcome.append(("result", tools[name](**arguments)))
        except BaseException as err:  # a user's tool: whatever it raises is the turn's error
            outcome.append(("error", err))

    # NOTE: a daemon thread per call, so that a call past its time limit can be given up on:
    # a Python thread cannot be stopped, and a looping tool keeps its thread, but a daemon
    # thread never holds up the env rank's exit.
    worker = threading.Thread(target=call, name=f"tool-{name}", daemon=True)
    worker.start()
    worker.join(time_limit_s)
    if not outcome:
        return f"error: {name} ran past its time limit of {time_limit_s:g} s", False
    kind, value = outcome[0]
    if kind == "error":
        if isinstance(value, ToolError):
            return f"error: {value}", False
        return f"error: {name} raised {type(value).__name__}: {str(value)[:200]}", False
    text = str(value)
    if len(text) > MAX_RESULT:
        return f"error: {name} returned {len(text):,} characters (at most {MAX_RESULT:,})", False
    return text, True
