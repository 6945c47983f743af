"""The endpoint's OpenAI protocol, checked against the `openai` package's own types: responses
it builds parse as the client parses them, Hermes tool calls come back as OpenAI `tool_calls`,
and bad requests get OpenAI's status codes and error bodies."""

from __future__ import annotations

import json

import pytest

from agentenv_jax.envs.agent.openai_protocol import (
    OpenAIError,
    SamplingBounds,
    chat_completion,
    context_exceeded,
    models_list,
    parse_chat_request,
    render_messages,
    split_tool_calls,
)

from conftest import require_reference

openai = require_reference("openai")
BOUNDS = SamplingBounds(max_tokens=128, context_length=512)
MODEL = "smollm2"


def body(**fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_a_request_is_read_with_its_sampling_settings():
    request = parse_chat_request(
        body(
            messages=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "4"},
            ],
            temperature=0.7,
            top_p=0.9,
            max_tokens=64,
            stop="\n\n",
        ),
        MODEL,
        BOUNDS,
    )
    assert (request.temperature, request.top_p, request.max_tokens) == (0.7, 0.9, 64)
    assert request.stop == ("\n\n",)
    assert request.messages[1] == {"role": "user", "content": "2+2?"}
    # Templates take tool-call arguments as objects.
    assert request.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 2}
    assert render_messages(request.messages)[0]["role"] == "system"
    assert parse_chat_request(body(), MODEL, BOUNDS).max_tokens == 128


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"model": "gpt-4o"}, 404, "model_not_found", "model"),
        ({"messages": []}, 400, "invalid_value", "messages"),
        ({"n": 2}, 400, None, "n"),
        ({"temperature": 3}, 400, "invalid_value", "temperature"),
        ({"max_tokens": 4096}, 400, "invalid_value", "max_tokens"),
        (
            {"messages": [{"role": "robot", "content": "x"}]},
            400,
            "invalid_value",
            "messages[0].role",
        ),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, None, "stop"),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]},
            400,
            None,
            "messages[0].tool_calls",
        ),
    ],
)
def test_bad_requests_get_openais_status_and_body(fields, status, code, param):
    with pytest.raises(OpenAIError) as refused:
        parse_chat_request(body(**fields), MODEL, BOUNDS)
    error = refused.value
    assert (error.status, error.code, error.param) == (status, code, param)
    # The body the openai client reads its error from.
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_a_prompt_past_the_context_gets_openais_error():
    error = context_exceeded(600, BOUNDS)
    assert error.status == 400 and error.code == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in error.message
    assert "resulted in 600 tokens" in error.message


def test_a_completion_parses_as_the_client_parses_it():
    from openai.types import Model
    from openai.types.chat import ChatCompletion

    response = ChatCompletion.model_validate(
        chat_completion(MODEL, "Four.", "stop", 12, 3, tools_offered=False)
    )
    assert response.choices[0].message.content == "Four."
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.total_tokens == 15
    listed = models_list(MODEL, 0)
    assert [Model.model_validate(m).id for m in listed["data"]] == [MODEL]


def test_hermes_tool_calls_come_back_as_openai_tool_calls():
    from openai.types.chat import ChatCompletion

    text = (
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    response = ChatCompletion.model_validate(
        chat_completion(MODEL, text, "stop", 10, 20, tools_offered=True)
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 2}
    assert call.id.startswith("call_")
    # The malformed block stays in the text, with what came before the call.
    assert choice.message.content == "Let me add.\n<tool_call>not json</tool_call>"
    # Without tools offered, the text is returned as it is.
    assert split_tool_calls("plain") == ("plain", [])
    plain = chat_completion(MODEL, text, "length", 10, 20, tools_offered=False)
    assert plain["choices"][0]["message"]["content"] == text
