"""The Anthropic Messages API behind the OpenAI dialect: translated both ways.

Requests: system (and developer) messages become ``system``; user and
assistant turns become ``messages``, consecutive turns of one role merged
(the API wants them alternating); an assistant's ``tool_calls`` become
``tool_use`` blocks and ``tool`` messages ``tool_result`` blocks in a user
turn; ``tools`` become ``{name, description, input_schema}``. Responses:
text blocks become ``content``, ``tool_use`` blocks ``tool_calls``, stop
reasons finish reasons, usage usage. Streams: Anthropic's events
(``message_start``, ``content_block_*``, ``message_delta``...) become OpenAI
chunks, tool input deltas becoming tool call argument deltas.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from stockade.llm._upstreams import (
    ChatRequest,
    ImagePart,
    Message,
    TextPart,
    Upstream,
    UpstreamError,
    sse_data,
    transport_failure,
)

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
"""The Messages API requires ``max_tokens``; OpenAI clients often leave it out."""

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def messages_url(base_url: str) -> str:
    """``…/v1/messages`` whether or not the configured base URL ends in ``/v1``
    (the policy's default, ``https://api.anthropic.com``, does not)."""
    base = base_url.rstrip("/")
    return f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"


# --------------------------------------------------------------------------- requests


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        try:  # a broken image is the agent's error, not the upstream's
            base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise UpstreamError(
                "an image_url data URL holds invalid base64; send the image base64-encoded",
                status=400,
                type="invalid_request_error",
            ) from exc
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _user_blocks(message: Message) -> list[dict[str, Any]]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}] if message.content else []
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            blocks.append(_image_block(part.image_url.url))
    return blocks


def _assistant_blocks(message: Message, where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    text = message.text()
    if text:
        blocks.append({"type": "text", "text": text})
    for index, call in enumerate(message.tool_calls or ()):
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except ValueError as exc:
            raise UpstreamError(
                f"{where}.tool_calls[{index}].function.arguments is not JSON; "
                "send the arguments as a JSON object",
                status=400,
                type="invalid_request_error",
            ) from exc
        if not isinstance(arguments, dict):
            raise UpstreamError(
                f"{where}.tool_calls[{index}].function.arguments is not a JSON object; "
                "the Messages API takes tool input as an object",
                status=400,
                type="invalid_request_error",
            )
        blocks.append({"type": "tool_use", "id": call.id, "name": call.function.name, "input": arguments})
    return blocks


def _tool_choice(choice: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if choice is None or choice == "auto":
        return {"type": "auto"} if choice else None
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "tool", "name": str(choice["function"].get("name", ""))}
    raise UpstreamError(
        f"tool_choice {json.dumps(choice)} is not one the endpoint can translate; use 'auto', 'none', "
        "'required' or {'type': 'function', 'function': {'name': ...}}",
        status=400,
        type="invalid_request_error",
    )


def to_anthropic(request: ChatRequest, model: str) -> dict[str, Any]:
    """The Messages API body for an OpenAI chat request. Raises ``UpstreamError`` (400)
    for what cannot be translated."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for index, message in enumerate(request.messages):
        where = f"messages[{index}]"
        if message.role in ("system", "developer"):
            system.append(message.text())
        elif message.role == "user":
            add("user", _user_blocks(message))
        elif message.role == "assistant":
            add("assistant", _assistant_blocks(message, where))
        else:  # tool
            add(
                "user",
                [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.text()}],
            )
    body: dict[str, Any] = {
        "model": model,
        "messages": turns,
        "max_tokens": request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS,
    }
    if system:
        body["system"] = "\n\n".join(part for part in system if part)
    if request.tools:
        body["tools"] = [
            {
                "name": tool.function.name,
                "description": tool.function.description or "",
                "input_schema": tool.function.parameters or {"type": "object", "properties": {}},
            }
            for tool in request.tools
        ]
    tool_choice = _tool_choice(request.tool_choice)
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stop is not None:
        body["stop_sequences"] = [request.stop] if isinstance(request.stop, str) else request.stop
    if request.stream:
        body["stream"] = True
    return body


# --------------------------------------------------------------------------- responses


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    # Cached prompt tokens are prompt tokens too: they count toward the budget.
    prompt = sum(
        int(usage.get(name) or 0)
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    completion = int(usage.get("output_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def from_anthropic(message: dict[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI chat completion for a Messages API response."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        if block.get("type") == "text":
            text.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": json.dumps(block.get("input", {})),
                    },
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{message.get('id', '')}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(message.get("model") or model),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": FINISH_REASONS.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": _usage(message.get("usage") or {}),
    }


class _StreamTranslator:
    """Anthropic stream events in, OpenAI chunks out (one event gives at most one chunk)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = "chatcmpl-"
        self.created = int(time.time())
        self.tool_index: dict[int, int] = {}  # content block index -> tool call index
        self.usage: dict[str, Any] = {}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def usage_chunk(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": _usage(self.usage),
        }

    def translate(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.id = f"chatcmpl-{message.get('id', '')}"
            self.model = str(message.get("model") or self.model)
            self.usage.update(message.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = len(self.tool_index)
                self.tool_index[int(event.get("index", 0))] = index
                call = {
                    "index": index,
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": ""},
                }
                return self._chunk({"tool_calls": [call]})
            if block.get("type") == "text" and block.get("text"):
                return self._chunk({"content": block["text"]})
            return None
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return self._chunk({"content": delta.get("text", "")})
            if delta.get("type") == "input_json_delta":
                known = self.tool_index.get(int(event.get("index", 0)))
                if known is None:
                    return None
                call = {"index": known, "function": {"arguments": delta.get("partial_json", "")}}
                return self._chunk({"tool_calls": [call]})
            return None
        if kind == "message_delta":
            # output_tokens here is the running total for the message.
            self.usage.update(event.get("usage") or {})
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason:
                return self._chunk({}, FINISH_REASONS.get(str(reason), "stop"))
            return None
        if kind == "error":
            error = event.get("error") or {}
            raise UpstreamError(f"the Anthropic API failed during the stream: {error.get('message', error)}")
        return None  # ping, content_block_stop, message_stop


class AnthropicUpstream(Upstream):
    """The Anthropic Messages API (``x-api-key``, ``anthropic-version``)."""

    provider = "anthropic"

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self.key:
            headers["x-api-key"] = self.key
        return headers

    def prepare(self, request: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
        return to_anthropic(request, str(body["model"]))

    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        model = str(payload["model"])
        url = messages_url(self.base_url)
        message = await self._json("POST", url, payload)
        if not isinstance(message, dict) or message.get("type") != "message":
            raise UpstreamError(f"the LLM upstream {url} answered with something that is not a message")
        return from_anthropic(message, model)

    async def stream(self, payload: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        model = str(payload["model"])
        url = messages_url(self.base_url)
        return self._chunks(await self._open_stream(url, payload), url, model)

    async def _chunks(
        self, response: httpx.Response, url: str, model: str
    ) -> AsyncGenerator[dict[str, Any], None]:
        translator = _StreamTranslator(model)
        try:
            async for data in sse_data(response):
                try:
                    event = json.loads(data)
                except ValueError as exc:
                    raise UpstreamError(
                        f"the LLM upstream {url} sent a stream event that is not JSON"
                    ) from exc
                if not isinstance(event, dict):
                    continue
                chunk = translator.translate(event)
                if chunk is not None:
                    yield chunk
                if event.get("type") == "message_stop":
                    break
        except httpx.HTTPError as exc:
            raise transport_failure(exc, url, self.scrub) from exc
        finally:
            await response.aclose()
        if translator.usage:
            yield translator.usage_chunk()

    def _models_url(self) -> str:
        return messages_url(self.base_url).removesuffix("/messages") + "/models"
