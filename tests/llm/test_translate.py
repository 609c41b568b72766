"""OpenAI chat <-> Anthropic Messages, without sockets: the translation tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stockade.llm._anthropic import _StreamTranslator, from_anthropic, messages_url, to_anthropic
from stockade.llm._upstreams import ChatRequest, Collected, UpstreamError


def _request(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", **fields})


def test_messages_url_with_or_without_v1() -> None:
    assert messages_url("https://api.anthropic.com") == "https://api.anthropic.com/v1/messages"
    assert messages_url("https://api.anthropic.com/") == "https://api.anthropic.com/v1/messages"
    assert messages_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1/messages"


def test_request_translation() -> None:
    request = _request(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "Read two files."},
            {
                "role": "assistant",
                "content": "Reading.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "b"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "A"},
            {"role": "tool", "tool_call_id": "c2", "content": "B"},
            {"role": "user", "content": "Now summarise."},
        ],
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
        tool_choice="required",
        max_completion_tokens=100,
        stop="END",
        temperature=0.5,
    )
    body = to_anthropic(request, "claude-x")
    assert body["model"] == "claude-x"
    assert body["system"] == "Be brief.\n\nUse tools."
    assert body["max_tokens"] == 100
    assert body["stop_sequences"] == ["END"]
    assert body["temperature"] == 0.5
    assert body["tool_choice"] == {"type": "any"}
    assert body["tools"] == [{"name": "read_file", "description": "", "input_schema": {"type": "object"}}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Read two files."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "c2", "name": "read_file", "input": {"path": "b"}},
            ],
        },
        {
            # Both results and the next user text in one user turn: the API wants turns alternating.
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "A"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "B"},
                {"type": "text", "text": "Now summarise."},
            ],
        },
    ]
    assert "stream" not in body


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "function", "function": {"name": "shell"}}, {"type": "tool", "name": "shell"}),
    ],
)
def test_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    body = to_anthropic(_request(messages=[{"role": "user", "content": "x"}], tool_choice=choice), "m")
    assert body["tool_choice"] == expected


def test_images() -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    body = to_anthropic(_request(messages=[{"role": "user", "content": content}]), "m")
    blocks = body["messages"][0]["content"]
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert blocks[2] == {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [("{not json", "not JSON"), ("[1]", "not a JSON object")],
)
def test_untranslatable_tool_arguments_are_the_agents_error(arguments: str, problem: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "x", "arguments": arguments}}
    request = _request(
        messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
    )
    with pytest.raises(UpstreamError, match=problem) as caught:
        to_anthropic(request, "m")
    assert caught.value.status == 400
    assert "messages[1].tool_calls[0]" in caught.value.message


@pytest.mark.parametrize(
    ("stop", "finish"),
    [("end_turn", "stop"), ("max_tokens", "length"), ("tool_use", "tool_calls"), ("stop_sequence", "stop")],
)
def test_response_translation(stop: str, finish: str) -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"command": "ls"}},
        ],
        "stop_reason": stop,
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3},
    }
    answer = from_anthropic(message, "m")
    choice = answer["choices"][0]
    assert choice["finish_reason"] == finish
    assert choice["message"]["content"] == "Let me look."
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] == "toolu_1"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert answer["usage"] == {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}


def test_stream_translation_with_tool_argument_deltas() -> None:
    events = [
        {
            "type": "message_start",
            "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 20}},
        },
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Two "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "calls."}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t1", "name": "a"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"x"'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ": 1}"},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "t2", "name": "b"},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": "{}"},
        },
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
        {"type": "message_stop"},
    ]
    translator = _StreamTranslator("m")
    chunks = [chunk for event in events if (chunk := translator.translate(event)) is not None]
    chunks.append(translator.usage_chunk())
    collected = Collected()
    for chunk in chunks:
        collected.add_chunk(chunk)
    assert collected.text() == "Two calls."
    assert collected.tool_calls == {
        0: {"id": "t1", "name": "a", "arguments": '{"x": 1}'},
        1: {"id": "t2", "name": "b", "arguments": "{}"},
    }
    assert collected.finish_reason == "tool_calls"
    assert collected.usage == {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    assert {chunk["id"] for chunk in chunks} == {"chatcmpl-msg_1"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_stream_error_event_raises() -> None:
    translator = _StreamTranslator("m")
    with pytest.raises(UpstreamError, match="Overloaded"):
        translator.translate(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )


def test_event_detail_cuts_long_content() -> None:
    collected = Collected()
    collected.add_response(
        {
            "choices": [{"message": {"content": "x" * 5000}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1},
        }
    )
    detail = collected.detail()
    assert detail["content"].startswith("x" * 2000 + "…")
    assert "3000 more characters" in detail["content"]
    assert collected.usage == {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}
