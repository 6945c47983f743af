"""Shipped agent programs for `env.id: agent`, written as their users write agents: one with the
plain `openai` client, one with the OpenAI Agents SDK (`pip install openai-agents`). Both solve
the same verifiable task, arithmetic with a calculator tool, and neither knows it is trained:
the env hands each an `openai.AsyncOpenAI` client pointed at the policy's endpoint.

The rows (`arithmetic_rows`) are sums and products of small numbers, a question each; 20 % of the
distinct questions are held out by a hash of their text (`tasks.question_split`), so the
`test` split asks only questions training never drew. The reward is 1 when the agent's final
answer's last number is the right one, else 0.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

import numpy as np

from agentenv_jax.envs.text.tasks import extract_answer, question_split

MODEL = "policy"  # the endpoint's model name (env.kwargs.model_name)
TEST_FRACTION = 0.2
MAX_MODEL_CALLS = 2  # the calculator, then an answer
INSTRUCTIONS = (
    "Answer the question with a number. Use the calculator tool for the arithmetic, then give "
    "the result."
)
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression of numbers, + - * / and brackets.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 37 * 4"}},
            "required": ["expression"],
        },
    },
}
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def arithmetic_rows(rng: np.random.Generator, split: str = "train") -> dict[str, Any]:
    """A question of `split`: `{"question": ..., "answer": ...}`, a sum of two numbers of
    2..29 or a product of one of 2..19 and a digit."""
    while True:
        if rng.random() < 0.5:
            a, b = (int(x) for x in rng.integers(2, 30, size=2))
            question, answer = f"What is {a} + {b}?", a + b
        else:
            a, b = int(rng.integers(2, 20)), int(rng.integers(2, 10))
            question, answer = f"What is {a} * {b}?", a * b
        if question_split(question, TEST_FRACTION) == split:
            return {"question": question, "answer": answer}


def split_sizes() -> dict[str, int]:
    """How many distinct questions `arithmetic_rows` asks on each side of the split."""
    questions = [f"What is {a} + {b}?" for a in range(2, 30) for b in range(2, 30)]
    questions += [f"What is {a} * {b}?" for a in range(2, 20) for b in range(2, 10)]
    sides = [question_split(question, TEST_FRACTION) for question in questions]
    return {"train": sides.count("train"), "test": sides.count("test")}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, or an error text (the agent's own tool: it runs
    in the agent's process, as a user's tools do). Narrower than `tools.calculator` on
    purpose: no `**`, `//` or `%`, and at most 200 characters, so no expression the model
    writes runs long on the event loop every agent of the env shares (the built-in tool runs
    in the sandbox, under a time limit, for that reason)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only numbers, + - * / and brackets")

    try:
        result = value(ast.parse(str(expression)[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as err:
        return f"error: {err}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def score(answer: str | None, row: dict[str, Any]) -> float:
    """1.0 when the last number of `answer` is the row's answer."""
    value = extract_answer(answer or "", "last_number")
    return 1.0 if value is not None and value == row["answer"] else 0.0


async def calculator_agent(client: Any, row: dict[str, Any]) -> float:
    """A tool loop on the plain client: call the model; run each tool call it makes and send
    the results back; its first reply without a call is the answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": row["question"]},
    ]
    for _ in range(MAX_MODEL_CALLS):
        response = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[CALCULATOR_TOOL]
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return score(message.content, row)
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculate(expression)}
            )
    return 0.0  # no answer within its calls


async def sdk_calculator_agent(client: Any, row: dict[str, Any]) -> float:
    """The same agent on the OpenAI Agents SDK: an `Agent` with a function tool, run by
    `Runner.run` through the chat completions API of `client`."""
    import agents

    agents.set_tracing_disabled(True)  # no trace export: nothing leaves the machine

    @agents.function_tool
    def calculator(expression: str) -> str:
        """Evaluates an arithmetic expression of numbers, + - * / and brackets.

        Args:
            expression: e.g. 37 * 4
        """
        return calculate(expression)

    agent = agents.Agent(
        name="calculator",
        instructions=INSTRUCTIONS,
        tools=[calculator],
        model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
    )
    try:
        result = await agents.Runner.run(agent, row["question"], max_turns=MAX_MODEL_CALLS)
    except agents.MaxTurnsExceeded:
        return 0.0
    return score(str(result.final_output), row)
