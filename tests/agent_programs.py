"""Agent programs the agent env tests run (`env.kwargs.agent: agent_programs:<name>`), written
as users write them, on the `openai` client the env hands over. What they see is kept in
`SEEN` for the tests to read."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import openai

from agentenv_jax.envs.agent.example_agents import CALCULATOR_TOOL, calculate

SEEN: list = []  # what the agents got back, in the order they got it
_kinds = itertools.count()
SYSTEM = {"role": "system", "content": "Answer with a number."}


def rows(rng) -> dict:
    a, b = (int(x) for x in rng.integers(1, 10, size=2))
    return {"question": f"What is {a} + {b}?", "answer": a + b}


def kinds(rng) -> dict:
    """Rows that tell `by_kind` how to behave, in turn: answer, raise, hang, answer."""
    return {"kind": ("answer", "raise", "hang", "answer")[next(_kinds) % 4]}


async def one_call(client, row, **sampling) -> float:
    messages = [SYSTEM, {"role": "user", "content": row["question"]}]
    response = await client.chat.completions.create(model="policy", messages=messages, **sampling)
    SEEN.append(response)
    return 1.0


async def tool_loop(client, row) -> float:
    """The calculator, then an answer: two calls, the second resending the whole history."""
    messages = [SYSTEM, {"role": "user", "content": row["question"]}]
    for _ in range(3):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR_TOOL]
        )
        SEEN.append(response)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 1.0 if str(row["answer"]) in (message.content or "") else 0.0
        for call in message.tool_calls:
            expression = json.loads(call.function.arguments)["expression"]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculate(expression)}
            )
    return 0.0


async def bad_requests(client, row) -> float:
    """Each request OpenAI refuses, as the client raises it; then a good call."""
    user = [{"role": "user", "content": row["question"]}]
    requests = {
        "unknown model": dict(model="gpt-5", messages=user),
        "n > 1": dict(model="policy", messages=user, n=2),
        "past the context": dict(
            model="policy", messages=[{"role": "user", "content": "x " * 600}]
        ),
        "no messages": dict(model="policy", messages=[]),
        "bad temperature": dict(model="policy", messages=user, temperature=3),
    }
    for name, request in requests.items():
        try:
            await client.chat.completions.create(**request)
        except openai.APIStatusError as err:
            SEEN.append((name, err.status_code, err.body))
    stranger = client.with_options(api_key="not-a-run")
    try:
        await stranger.chat.completions.create(model="policy", messages=user)
    except openai.APIStatusError as err:
        SEEN.append(("unknown key", err.status_code, err.body))
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            f"{client.base_url}chat/completions",
            content=b'{"model": "policy", "messages": [',
            headers={"Authorization": f"Bearer {client.api_key}"},
        )
        SEEN.append(("malformed body", answer.status_code, answer.json()["error"]))
    models = await client.models.list()
    SEEN.append(("models", [model.id for model in models.data]))
    # A temperature outside the env's range (1 to 1 by default): sampled at 1, and counted.
    return await one_call(client, row, temperature=0.7)


async def cut_calls(client, row) -> float:
    """Three calls: at most 2 tokens; until a stop string; greedy and a nucleus of 0.5."""
    await one_call(client, row, max_tokens=2)
    await one_call(client, row, stop=["nothing like it", " is"])
    return await one_call(client, row, temperature=0, top_p=0.5)


async def by_kind(client, row) -> float:
    messages = [SYSTEM, {"role": "user", "content": "Say something."}]
    await client.chat.completions.create(model="policy", messages=messages)
    if row["kind"] == "raise":
        raise RuntimeError("the agent's own bug")
    if row["kind"] == "hang":
        await asyncio.sleep(3600)
    return 1.0


async def never_calls(client, row) -> float:
    return 1.0


def not_async(client, row) -> float:
    return 1.0


async def greedy_call(client, row) -> float:
    """One call at temperature 0; what came back is kept with the row's question."""
    messages = [SYSTEM, {"role": "user", "content": row["question"]}]
    response = await client.chat.completions.create(
        model="policy", messages=messages, temperature=0
    )
    SEEN.append((row["question"], response.choices[0].message.content))
    return 1.0
