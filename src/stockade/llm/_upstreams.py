"""What the LLM endpoint forwards to: the request it accepts, the upstreams, what a call gave.

The agent speaks the OpenAI chat-completions dialect to the endpoint; an
upstream turns that into its provider's API and back, so that the endpoint
sees OpenAI responses and OpenAI stream chunks whatever the provider.
``OpenAIUpstream`` is here; ``AnthropicUpstream`` (a translation) is in
``_anthropic``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

CONTENT_CUT = 2000
"""Characters of a message's content (or a tool call's arguments) kept in an event."""

UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)
"""Models can think for minutes before their first byte; connecting should not take long."""

# --------------------------------------------------------------------------- the request


class _Wire(BaseModel):
    # Unknown fields are kept: an OpenAI-compatible upstream gets every
    # parameter the agent sent (seed, response_format, logprobs...).
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Wire):
    name: str
    arguments: str


class ToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Wire):
    type: Literal["text"]
    text: str


class ImageUrl(_Wire):
    url: str


class ImagePart(_Wire):
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tool_has_id(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message of role 'tool' needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        """The content as plain text (text parts joined, images left out)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))


class FunctionDef(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Wire):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Wire):
    include_usage: bool = False


class ChatRequest(_Wire):
    """The body of ``POST /v1/chat/completions`` (validated, then forwarded)."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None

    @property
    def wants_usage(self) -> bool:
        """The agent asked for the usage chunk at the end of a stream."""
        return self.stream_options is not None and self.stream_options.include_usage


# --------------------------------------------------------------------------- what a call gave


class UpstreamError(Exception):
    """The upstream failed or refused; ``status`` and ``type`` are what the agent gets."""

    def __init__(self, message: str, *, status: int = 502, type: str = "upstream_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type


def _as_is(text: str) -> str:
    return text


def cut(text: str | None, limit: int = CONTENT_CUT) -> str | None:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"… [{len(text) - limit} more characters]"


@dataclass
class Collected:
    """The answer of one call, gathered from a response or from stream chunks."""

    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None

    def add_chunk(self, chunk: Mapping[str, Any]) -> None:
        """Fold one OpenAI stream chunk in (tool call arguments arrive in pieces)."""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(
                    int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""}
                )
                function = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self._take_usage(chunk.get("usage"))

    def add_response(self, response: Mapping[str, Any]) -> None:
        """Take a whole (non-stream) OpenAI response."""
        choices = response.get("choices") or [{}]
        message = choices[0].get("message") or {}
        if isinstance(message.get("content"), str):
            self.content.append(message["content"])
        for index, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            self.tool_calls[index] = {
                "id": str(call.get("id", "")),
                "name": str(function.get("name", "")),
                "arguments": str(function.get("arguments", "")),
            }
        self.finish_reason = choices[0].get("finish_reason")
        self._take_usage(response.get("usage"))

    def _take_usage(self, usage: object) -> None:
        if isinstance(usage, Mapping) and "prompt_tokens" in usage:
            prompt = int(usage.get("prompt_tokens") or 0)
            completion = int(usage.get("completion_tokens") or 0)
            self.usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": int(usage.get("total_tokens") or prompt + completion),
            }

    def text(self) -> str:
        return "".join(self.content)

    def detail(self, scrub: Callable[[str], str] = _as_is) -> dict[str, Any]:
        """The ``response`` field of an ``llm.call`` event; ``scrub`` runs before any cut."""
        return {
            "content": cut(scrub(self.text())) or None,
            "tool_calls": [
                {"id": call["id"], "name": call["name"], "arguments": cut(scrub(call["arguments"]))}
                for _, call in sorted(self.tool_calls.items())
            ],
            "finish_reason": self.finish_reason,
        }


# --------------------------------------------------------------------------- upstreams


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data:`` payloads of a server-sent-events body, one per event.

    Written here because httpx has no SSE parser and the format is a few
    lines (WHATWG HTML, "server-sent events"): fields until a blank line,
    ``data`` lines joined with newlines, comments (``:``) and other fields
    (``event``, ``id``, ``retry``) ignored (both dialects repeat the event's
    type inside its JSON).
    """
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


async def upstream_failure(
    response: httpx.Response, where: str, scrub: Callable[[str], str] = _as_is
) -> UpstreamError:
    """The error for a non-2xx answer of the upstream (its body read and closed).

    ``scrub`` hides the operator's key (and the run's secrets) before anything
    is cut: a body cut first could end in half a key that no scrub finds.

    A refusal of the request itself (400, 404, 413, 422, 429) goes back to the
    agent with its status and the upstream's message: the agent can fix it. A
    refused key (401, 403) or a server error is the operator's or provider's
    problem: 502, with a message that says so.
    """
    body = await response.aread()
    await response.aclose()
    message = cut(scrub(body.decode("utf-8", "replace")), 500) or ""
    try:
        parsed = json.loads(body)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = cut(scrub(error["message"]), 2000) or ""
        elif isinstance(error, str):
            message = cut(scrub(error), 2000) or ""
    except ValueError:
        pass
    status = response.status_code
    if status in (401, 403):
        return UpstreamError(
            f"the LLM upstream {where} refused the operator's credentials ({status}: {message}); "
            "check the key named by the policy's llm.api_key_env",
            status=502,
        )
    if status in (400, 404, 409, 413, 422, 429):
        return UpstreamError(
            f"the LLM upstream {where} refused the request ({status}): {message}",
            status=status,
            type="invalid_request_error" if status != 429 else "rate_limit_error",
        )
    return UpstreamError(f"the LLM upstream {where} failed ({status}): {message}", status=502)


def transport_failure(
    exc: httpx.HTTPError, where: str, scrub: Callable[[str], str] = _as_is
) -> UpstreamError:
    """The error for an upstream that could not be reached or broke off."""
    reason = scrub(str(exc)) or type(exc).__name__
    return UpstreamError(f"the LLM upstream {where} could not be reached or broke off: {reason}", status=502)


class Upstream(ABC):
    """One provider behind the endpoint, speaking OpenAI to it."""

    provider: str

    def __init__(self, base_url: str, key: str | None, client: httpx.AsyncClient) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.client = client
        self.scrub: Callable[[str], str] = _as_is
        """Hides the key and the run's secrets in the messages of errors (the endpoint sets it)."""

    @abstractmethod
    def prepare(self, request: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
        """What to send upstream for ``request`` (``body`` is the agent's JSON, the
        model already replaced). Raises ``UpstreamError`` (400) for a request
        that cannot be translated: checked before the call counts."""

    @abstractmethod
    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI response to a prepared non-stream request. Raises ``UpstreamError``."""

    @abstractmethod
    async def stream(self, payload: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """OpenAI chunks of a stream request, without ``[DONE]``, ending with a
        usage chunk (empty ``choices``) when the upstream reported usage.

        The upstream is contacted before the first chunk is asked for, so that
        a failure to connect raises ``UpstreamError`` before any answer went
        out; a failure later raises it from the iteration.
        """

    @abstractmethod
    def _models_url(self) -> str:
        """Where the provider lists its models."""

    async def models(self) -> list[str]:
        """The upstream's model names. Raises ``UpstreamError``."""
        url = self._models_url()
        answer = await self._json("GET", url)
        try:
            return [str(item["id"]) for item in answer["data"]]
        except (KeyError, TypeError) as exc:
            raise UpstreamError(f"the LLM upstream {url} answered with an unexpected model list") from exc

    @abstractmethod
    def _headers(self) -> dict[str, str]:
        """The provider's headers (its key, its version)."""

    async def _json(self, method: str, url: str, payload: dict[str, Any] | None = None) -> Any:
        """The upstream's JSON answer to one request.

        Raises:
            UpstreamError: it could not be reached, refused, or did not answer JSON.
        """
        try:
            response = await self.client.request(method, url, json=payload, headers=self._headers())
        except httpx.HTTPError as exc:
            raise transport_failure(exc, url, self.scrub) from exc
        if response.status_code >= 300:
            raise await upstream_failure(response, url, self.scrub)
        try:
            return response.json()
        except ValueError as exc:
            raise UpstreamError(f"the LLM upstream {url} answered with something that is not JSON") from exc

    async def _open_stream(self, url: str, payload: dict[str, Any]) -> httpx.Response:
        """The upstream's streamed answer, its status checked (the body not read yet).

        Raises:
            UpstreamError: it could not be reached, or refused.
        """
        try:
            response = await self.client.send(
                self.client.build_request("POST", url, json=payload, headers=self._headers()), stream=True
            )
        except httpx.HTTPError as exc:
            raise transport_failure(exc, url, self.scrub) from exc
        if response.status_code >= 300:
            raise await upstream_failure(response, url, self.scrub)
        return response


class OpenAIUpstream(Upstream):
    """Any OpenAI-compatible API (OpenAI, Ollama, vLLM, llama.cpp...): passed through."""

    provider = "openai"

    def _headers(self) -> dict[str, str]:
        # No key, no header: a local server (Ollama) needs none.
        return {"authorization": f"Bearer {self.key}"} if self.key else {}

    def prepare(self, request: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
        if not request.stream:
            return body
        # Ask for usage so that the budget counts real tokens; the agent did
        # not necessarily ask, and the endpoint hides the extra chunk then.
        return {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}

    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/chat/completions"
        answer = await self._json("POST", url, payload)
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            raise UpstreamError(f"the LLM upstream {url} answered without choices")
        return answer

    async def stream(self, payload: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        url = f"{self.base_url}/chat/completions"
        return self._chunks(await self._open_stream(url, payload), url)

    async def _chunks(self, response: httpx.Response, url: str) -> AsyncGenerator[dict[str, Any], None]:
        try:
            async for data in sse_data(response):
                if data.strip() == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise UpstreamError(
                        f"the LLM upstream {url} sent a stream chunk that is not JSON"
                    ) from exc
                if isinstance(chunk, dict) and "error" in chunk:
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else str(error)
                    raise UpstreamError(f"the LLM upstream {url} failed during the stream: {message}")
                if isinstance(chunk, dict):
                    yield chunk
        except httpx.HTTPError as exc:
            raise transport_failure(exc, url, self.scrub) from exc
        finally:
            await response.aclose()

    def _models_url(self) -> str:
        return f"{self.base_url}/models"
