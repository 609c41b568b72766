"""``stockade mock-llm``: an offline model server with scripted answers.

It speaks both dialects the LLM endpoint forwards to: OpenAI chat completions
(``/v1/chat/completions``, ``/v1/models``) and the Anthropic Messages API
(``/v1/messages``), each with and without streaming, so that the demo runs
without a model and the endpoint's translation is tested against a server
that checks what the real one checks (alternating turns, ``max_tokens``,
every ``tool_use`` answered by a ``tool_result``...). What it answers comes
from a script (``_scripts``); what it was sent is kept in ``seen`` for tests.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stockade.llm._scripts import Reply, Said, Script
from stockade.llm._upstreams import ChatRequest

MOCK_MODEL = "mock-llm"
CREATED = 1_700_000_000
"""A fixed timestamp: the same conversation gives byte-for-byte the same answer."""
PIECE = 16
"""Characters per streamed delta: small, so that clients reassemble pieces."""


@dataclass(frozen=True, slots=True)
class Seen:
    """One request the mock received (for tests: what did the endpoint send?)."""

    path: str
    headers: dict[str, str]
    body: Any


class BadRequest(Exception):
    """A request the real API would refuse; the message names the field."""


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE] for i in range(0, len(text), PIECE)] or [""]


def _tokens(chars: int) -> int:
    return max(1, math.ceil(chars / 4))


def _digest(conversation: Sequence[Said]) -> str:
    data = json.dumps([[s.role, s.text, s.tool_calls, s.tool_call_id] for s in conversation])
    return hashlib.sha256(data.encode()).hexdigest()[:24]


def _usage(conversation: Sequence[Said], reply: Reply) -> tuple[int, int]:
    prompt = _tokens(sum(len(s.text) + sum(len(c[2]) for c in s.tool_calls) for s in conversation))
    answer = len(reply.content or "") + sum(len(json.dumps(args)) for _, args in reply.tool_calls)
    return prompt, _tokens(answer)


# --------------------------------------------------------------------------- reading requests


def _from_openai(body: Any) -> tuple[ChatRequest, list[Said]]:
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadRequest(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from exc
    conversation = [
        Said(
            role="system" if m.role == "developer" else m.role,
            text=m.text(),
            tool_calls=tuple((c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()),
            tool_call_id=m.tool_call_id,
        )
        for m in request.messages
    ]
    return request, conversation


def _block_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: must be a string or a list of blocks")
    texts = []
    for index, block in enumerate(content):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise BadRequest(f"{where}.{index}: must be a text block")
        texts.append(block["text"])
    return "".join(texts)


def _from_anthropic(body: Any) -> list[Said]:
    """The conversation of a Messages API request, checked as the real API checks it."""
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise BadRequest("model: Field required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise BadRequest("max_tokens: Field required (a positive integer)")
    for index, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{index}.name: Field required")
        if not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"tools.{index}.input_schema: Field required")
    conversation: list[Said] = []
    if "system" in body:
        conversation.append(Said("system", _block_text(body["system"], "system")))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list")
    pending: set[str] = set()  # tool_use ids the next user turn must answer
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise BadRequest(f"{where}.role: must be 'user' or 'assistant'")
        if index == 0 and role != "user":
            raise BadRequest("messages.0.role: the first message must use the 'user' role")
        if index > 0 and messages[index - 1].get("role") == role:
            raise BadRequest(f"{where}.role: roles must alternate between 'user' and 'assistant'")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise BadRequest(f"{where}.content: must be a string or a list of blocks")
        texts: list[str] = []
        calls: list[tuple[str, str, str]] = []
        for number, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            at = f"{where}.content.{number}"
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "image" and role == "user" and isinstance(block.get("source"), dict):
                texts.append("[image]")
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("input"), dict) or not isinstance(block.get("id"), str):
                    raise BadRequest(f"{at}: a tool_use block needs an id and an input object")
                calls.append((block["id"], str(block.get("name")), json.dumps(block["input"])))
            elif kind == "tool_result" and role == "user":
                call_id = block.get("tool_use_id")
                if call_id not in pending:
                    raise BadRequest(
                        f"{at}.tool_use_id: {call_id!r} answers no tool_use of the previous turn"
                    )
                pending.discard(call_id)
                conversation.append(
                    Said("tool", _block_text(block.get("content", ""), f"{at}.content"), (), call_id)
                )
            else:
                raise BadRequest(f"{at}: a block of type {kind!r} is not allowed in a {role} message")
        if role == "user" and pending:
            raise BadRequest(f"{where}: tool_use ids {sorted(pending)} have no tool_result blocks here")
        if texts or calls:
            conversation.append(Said(role, "".join(texts), tuple(calls)))
        pending = {call[0] for call in calls}
    return conversation


# --------------------------------------------------------------------------- writing answers


def _openai_calls(digest: str, reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{digest}{index}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        for index, (name, arguments) in enumerate(reply.tool_calls)
    ]


def _openai_chunks(
    digest: str, model: str, reply: Reply, usage: tuple[int, int], include_usage: bool
) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{digest}",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(reply.content) if reply.content else ():
        chunks.append(chunk({"content": piece}))
    for index, call in enumerate(_openai_calls(digest, reply)):
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"], "arguments": ""}}]})
        )
        for piece in _pieces(call["function"]["arguments"]):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    if include_usage:
        prompt, completion = usage
        total = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        chunks.append({**chunk({}), "choices": [], "usage": total})
    return chunks


def _anthropic_blocks(digest: str, reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for index, (name, arguments) in enumerate(reply.tool_calls):
        blocks.append({"type": "tool_use", "id": f"toolu_{digest}{index}", "name": name, "input": arguments})
    return blocks


def _anthropic_events(digest: str, model: str, reply: Reply, usage: tuple[int, int]) -> list[dict[str, Any]]:
    prompt, completion = usage
    start: dict[str, Any] = {
        "id": f"msg_{digest}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for index, block in enumerate(_anthropic_blocks(digest, reply)):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            )
            for piece in _pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            head = {**block, "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": head})
            for piece in _pieces(json.dumps(block["input"])):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    stop = "tool_use" if reply.tool_calls else "end_turn"
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": completion},
        }
    )
    events.append({"type": "message_stop"})
    return events


class MockLlm:
    """The mock server's app and what it was sent.

    ``stream_usage=False`` makes it ignore ``stream_options.include_usage``,
    like an upstream that never reports usage in streams.
    """

    def __init__(self, script: Script, *, stream_usage: bool = True, keep: int = 100) -> None:
        self.script = script
        self.stream_usage = stream_usage
        self.seen: deque[Seen] = deque(maxlen=keep)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
            ]
        )

    async def _body(self, request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.seen.append(Seen(request.url.path, dict(request.headers), body))
        return body

    async def _models(self, request: Request) -> Response:
        self.seen.append(Seen(request.url.path, dict(request.headers), None))
        data = [{"id": MOCK_MODEL, "object": "model", "created": CREATED, "owned_by": "stockade"}]
        if request.headers.get("anthropic-version"):
            data = [
                {
                    "id": MOCK_MODEL,
                    "type": "model",
                    "display_name": "mock-llm",
                    "created_at": "2023-11-14T22:13:20Z",
                }
            ]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request) -> Response:
        body = await self._body(request)
        try:
            chat, conversation = _from_openai(body)
        except BadRequest as exc:
            return _openai_error(400, str(exc))
        reply = self.script(conversation)
        if reply.error is not None:
            return _openai_error(*reply.error)
        digest, model = _digest(conversation), chat.model or MOCK_MODEL
        usage = _usage(conversation, reply)
        if chat.stream:
            include = chat.wants_usage and self.stream_usage
            chunks = _openai_chunks(digest, model, reply, usage, include)
            return _sse([f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"])
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = _openai_calls(digest, reply)
        prompt, completion = usage
        return JSONResponse(
            {
                "id": f"chatcmpl-{digest}",
                "object": "chat.completion",
                "created": CREATED,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )

    async def _messages(self, request: Request) -> Response:
        body = await self._body(request)
        if request.headers.get("anthropic-version") is None:
            return _anthropic_error(400, "anthropic-version: header is required")
        try:
            conversation = _from_anthropic(body)
        except BadRequest as exc:
            return _anthropic_error(400, str(exc))
        reply = self.script(conversation)
        if reply.error is not None:
            return _anthropic_error(*reply.error)
        digest, model = _digest(conversation), str(body["model"])
        usage = _usage(conversation, reply)
        if body.get("stream"):
            events = _anthropic_events(digest, model, reply, usage)
            return _sse([f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events])
        prompt, completion = usage
        return JSONResponse(
            {
                "id": f"msg_{digest}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": _anthropic_blocks(digest, reply),
                "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": completion},
            }
        )


def _sse(frames: list[str]) -> StreamingResponse:
    async def body() -> AsyncGenerator[str, None]:
        for frame in frames:
            yield frame

    return StreamingResponse(body(), media_type="text/event-stream")


def _openai_error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status_code=status)


def _anthropic_error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "api_error"
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)
