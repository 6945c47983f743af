"""The OpenAI chat API as the policy's endpoint speaks it: requests checked into what the model
can do, completions turned into OpenAI responses (tool calls in OpenAI's `tool_calls` form),
and errors with the status codes and bodies the OpenAI API gives, so that the `openai` client
and the agent frameworks on it raise what they expect.

Pure functions of JSON-ready values; the HTTP server and the model live elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# A tool call as Hermes / Qwen templates teach models to write it.
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclasses.dataclass(eq=False)  # not frozen: raising sets __traceback__
class OpenAIError(Exception):
    """An error response: its HTTP status and OpenAI's error body."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclasses.dataclass(frozen=True)
class SamplingBounds:
    """What the endpoint allows a request to ask for."""

    max_tokens: int  # the most tokens one completion may have (the env's response length)
    context_length: int  # the most prompt tokens
    max_stop: int = 4  # stop strings per request, as OpenAI allows


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked `/v1/chat/completions` request."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise OpenAIError(400, f"'{name}' must be a number, got {value!r}", param=name)
    if not low <= value <= high:
        raise OpenAIError(
            400,
            f"{value} is not a valid value for '{name}': it must be between {low:g} and {high:g}",
            param=name,
            code="invalid_value",
        )
    return float(value)


def _message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise OpenAIError(400, f"'{where}' must be an object", param=where)
    role = message.get("role")
    if role not in _ROLES:
        raise OpenAIError(
            400,
            f"Invalid value for '{where}.role': {role!r}; supported values are "
            + ", ".join(f"'{r}'" for r in _ROLES),
            param=f"{where}.role",
            code="invalid_value",
        )
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text ones, joined
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        if len(parts) != len(content) or any(
            p.get("type") != "text" for p in content if isinstance(p, Mapping)
        ):
            raise OpenAIError(400, f"'{where}.content': only text parts are supported", param=where)
        content = "".join(parts)
    if content is not None and not isinstance(content, str):
        raise OpenAIError(400, f"'{where}.content' must be a string", param=f"{where}.content")
    checked: dict[str, Any] = {"role": role, "content": content or ""}
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not all(
            isinstance(call, Mapping)
            and isinstance(call.get("function"), Mapping)
            and isinstance(call["function"].get("name"), str)
            for call in calls
        ):
            raise OpenAIError(
                400,
                f"'{where}.tool_calls' must be an array of function calls, each with "
                "'function': {'name', 'arguments'}",
                param=f"{where}.tool_calls",
            )
        checked["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    # Templates render arguments as an object; OpenAI sends a JSON string.
                    "arguments": _arguments(call["function"].get("arguments", "{}"), where),
                },
            }
            for call in calls
        ]
    if role == "tool" and message.get("tool_call_id") is not None:
        checked["tool_call_id"] = message["tool_call_id"]
    return checked


def _arguments(arguments: Any, where: str) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        raise OpenAIError(
            400, f"'{where}.tool_calls': arguments are not JSON", param=where
        ) from None


def parse_chat_request(body: Any, served_model: str, bounds: SamplingBounds) -> ChatRequest:
    """A `/v1/chat/completions` body checked against what this endpoint serves; an
    `OpenAIError` (the status and body OpenAI gives) for anything else."""
    if not isinstance(body, Mapping):
        raise OpenAIError(400, "The request body must be a JSON object")
    model = body.get("model")
    if model != served_model:
        raise OpenAIError(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(
            400, "'messages' must be a non-empty array", param="messages", code="invalid_value"
        )
    if body.get("n", 1) not in (1, None):
        raise OpenAIError(400, "n > 1 is not supported: send one request per completion", param="n")
    if body.get("stream"):
        raise OpenAIError(400, "stream is not supported", param="stream")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = bounds.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise OpenAIError(
            400, f"'max_tokens' must be a positive integer, got {max_tokens!r}", param="max_tokens"
        )
    if max_tokens > bounds.max_tokens:
        raise OpenAIError(
            400,
            f"max_tokens is too large: {max_tokens}. This model supports at most "
            f"{bounds.max_tokens} completion tokens.",
            param="max_tokens",
            code="invalid_value",
        )
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stop) > bounds.max_stop or not all(isinstance(s, str) and s for s in stop):
        raise OpenAIError(
            400, f"'stop' takes up to {bounds.max_stop} non-empty strings", param="stop"
        )
    tools = body.get("tools") or ()
    if not isinstance(tools, list | tuple) or not all(
        isinstance(t, Mapping) and t.get("type") == "function" and "function" in t for t in tools
    ):
        raise OpenAIError(400, "'tools' must be an array of function tools", param="tools")
    return ChatRequest(
        messages=tuple(_message(i, m) for i, m in enumerate(messages)),
        tools=tuple(dict(t) for t in tools),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        max_tokens=max_tokens,
        stop=stop,
    )


def context_exceeded(prompt_tokens: int, bounds: SamplingBounds) -> OpenAIError:
    """The error OpenAI gives for a prompt past the model's context."""
    return OpenAIError(
        400,
        f"This model's maximum context length is {bounds.context_length} tokens. However, your "
        f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages.",
        param="messages",
        code="context_length_exceeded",
    )


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """A completion's text without its `<tool_call>` blocks (None if nothing else is left)
    and those calls in OpenAI's `tool_calls` form. A block that is not a JSON object with a
    string `name` stays in the text."""
    calls = []
    kept = []
    position = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("arguments", {})),
                },
            }
        )
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    tools_offered: bool,
) -> dict[str, Any]:
    """The `/v1/chat/completions` response for one completion; tool calls are split out only
    when the request offered tools. `finish_reason`: `stop` or `length`."""
    content, calls = split_tool_calls(text) if tools_offered else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        finish_reason = "tool_calls"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def models_list(model: str, created: int) -> dict[str, Any]:
    """The `/v1/models` response: the one model served."""
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "agentenv_jax"}],
    }


def render_messages(
    messages: Sequence[Mapping[str, Any]], generated: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Messages as a chat template takes them: `developer` turns are system turns, and an
    assistant turn whose tool calls this endpoint issued (`generated`: call id -> the text the
    model wrote, `<tool_call>` blocks and all) is that text again, as the model wrote it.
    Re-rendering the calls from their JSON would change the text (key order, spacing) and so
    the tokens the next prompt shows the model."""
    rendered = []
    for message in messages:
        message = dict(message, role="system") if message["role"] == "developer" else dict(message)
        calls = message.get("tool_calls") or ()
        written = {generated[c["id"]] for c in calls if generated and c.get("id") in generated}
        if len(written) == 1:
            message["content"] = written.pop()
            del message["tool_calls"]
        rendered.append(message)
    return rendered


def with_tools_described(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`messages` with the request's tools described in the system turn (a new first turn if
    there is none): each function's JSON schema, and how to call one, in the `<tool_call>`
    form that `split_tool_calls` reads. For chat templates that do not render `tools`."""
    schemas = "\n".join(json.dumps(tool["function"]) for tool in tools)
    described = (
        "You can call these functions:\n<tools>\n"
        f"{schemas}\n</tools>\n"
        "To call one, write a JSON object with its name and arguments between tags:\n"
        '<tool_call>\n{"name": "function name", "arguments": {"argument": "value"}}\n'
        "</tool_call>\nThe result comes back in a tool turn."
    )
    messages = [dict(m) for m in messages]
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{described}".strip()
    else:
        messages.insert(0, {"role": "system", "content": described})
    return messages


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A checked `/v1/completions` request: a prompt as text or as token ids."""

    prompt: str | tuple[int, ...]
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]


def parse_completion_request(
    body: Any, served_model: str, bounds: SamplingBounds
) -> CompletionRequest:
    """A `/v1/completions` body checked as `parse_chat_request` checks a chat one; its prompt
    is one string or one list of token ids."""
    if not isinstance(body, Mapping):
        raise OpenAIError(400, "The request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise OpenAIError(
            400,
            "'prompt' must be a non-empty string or a non-empty array of token ids (one prompt "
            "per request)",
            param="prompt",
            code="invalid_value",
        )
    chat = parse_chat_request(
        {**body, "messages": [{"role": "user", "content": ""}]}, served_model, bounds
    )
    return CompletionRequest(prompt, chat.temperature, chat.top_p, chat.max_tokens, chat.stop)


@dataclasses.dataclass(frozen=True)
class CutCompletion:
    """A sampled completion as a request asked for it."""

    ids: tuple[int, ...]  # the ids handed back, and trained
    text: str  # the response's text: a stop string and what follows it left out
    finish_reason: str  # `stop` (EOS or a stop string) or `length`
    ids_text: str  # the text of every id handed back, a stop string included


def cut_completion(
    ids: Sequence[int],
    decode: Callable[[Sequence[int]], str],
    eos_id: int,
    max_tokens: int,
    stop: Sequence[str],
) -> CutCompletion:
    """The sampled `ids` (up to and including EOS, or as many as were generated) cut as OpenAI
    cuts a completion: at most `max_tokens` ids, and ended where one of the `stop` strings
    first appears, which the text leaves out. The ids keep the token that completed the stop
    string: the model sampled it, and it ended the completion."""
    ids = list(ids)[:max_tokens]
    whole = decode(ids)
    if any(s in whole for s in stop):
        for k in range(1, len(ids) + 1):  # the shortest prefix whose text holds a stop string
            text = decode(ids[:k])
            found = [at for at in (text.find(s) for s in stop) if at >= 0]
            if found:
                return CutCompletion(tuple(ids[:k]), text[: min(found)], "stop", text)
    ended = bool(ids) and ids[-1] == eos_id
    return CutCompletion(tuple(ids), whole, "stop" if ended else "length", whole)


def text_completion(
    model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The `/v1/completions` response for one completion."""
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }
