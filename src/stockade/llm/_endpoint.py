"""The cell's OpenAI-compatible LLM endpoint: the run's token in, the operator's key out.

The agent in a cell calls ``http://127.0.0.1:3129/v1`` with its run token as
API key. The endpoint checks the token, the run's budgets and the body, puts
the policy's model in place of the requested one, forwards to the policy's
upstream with the operator's key (which never enters the cell), and records
one ``llm.call`` event per call (docs/LLM.md, docs/EVENTS.md).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import socket
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stockade.errors import PolicyError, StoreError
from stockade.gateway._forms import ValueForms
from stockade.gateway._secrets import Secrets
from stockade.llm._anthropic import AnthropicUpstream
from stockade.llm._serve import AppServer
from stockade.llm._upstreams import (
    UPSTREAM_TIMEOUT,
    ChatRequest,
    Collected,
    ImagePart,
    OpenAIUpstream,
    Upstream,
    UpstreamError,
    cut,
)
from stockade.policy import LlmPolicy
from stockade.record import Event

log = logging.getLogger("stockade.llm")

MAX_BODY = 4 * 1024 * 1024
"""Bytes of a request body; a conversation larger than this is not a chat."""


class GatewayHooks(Protocol):
    """What the daemon gives the endpoint: the same protocol as
    ``stockade.gateway._proxy.GatewayHooks`` (structural, so one object serves
    both), declared here so that the LLM package does not import the proxy."""

    async def record(self, events: Sequence[Event]) -> None: ...
    async def denied(self) -> None: ...
    def halted(self) -> str | None: ...


def _error(status: int, type: str, message: str, code: str | None = None) -> JSONResponse:
    """An OpenAI error body: clients read ``error.message``."""
    return JSONResponse(
        {"error": {"message": message, "type": type, "code": code or type}}, status_code=status
    )


def _field(loc: Sequence[int | str]) -> str:
    # pydantic puts union members' labels ("str", "list[...]") in the path;
    # they are not fields the agent wrote.
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" in part or part in ("str", "int", "float", "bool", "none", "dict", "function-after"):
            continue
        else:
            path += f".{part}" if path else part
    return path or "body"


def _estimate(text_chars: int) -> int:
    # Four characters a token: the usual rule of thumb for English text,
    # used only when the upstream reported no usage at all.
    return math.ceil(text_chars / 4)


@dataclass
class _Call:
    """One call in progress: what the event will say."""

    cell: str
    started: float
    request: ChatRequest | None = None
    model: str | None = None
    stream: bool = False


@dataclass(slots=True)
class LlmUsage:
    """Calls and tokens spent, against ``llm.max_requests`` and ``llm.max_tokens``."""

    requests: int = 0
    tokens: int = 0


def _upstream_tls() -> ssl.SSLContext:
    """The context httpx would make for ``verify=True, trust_env=False`` (certifi's
    roots), made once per process: making it reads the bundle (~20 ms here),
    which every gateway, so every run and daemon session, paid at its start.
    A bundle changed on disk makes a new one."""
    import certifi

    from stockade.gateway._upstream import tls_context_once

    return tls_context_once((certifi.where(),), lambda: httpx.create_ssl_context(trust_env=False))


class LlmEndpoint:
    """The LLM endpoint of one run, served on one socket per cell.

    The budgets (``llm.max_requests``, ``llm.max_tokens``) are the run's: every
    cell of the run draws from them. A call in flight when the token budget
    runs out finishes; the next is refused.
    """

    def __init__(
        self,
        llm: LlmPolicy,
        *,
        run_id: str,
        token: str,
        hooks: GatewayHooks,
        environ: Mapping[str, str],
        secrets: Secrets | None = None,
        image_url_refused: Callable[[str], str | None] | None = None,
    ) -> None:
        """``secrets``: the run's, refused in requests and hidden in events.
        ``image_url_refused``: with ``llm.remote_images``, why a remote image's URL
        may not be fetched (``network.allow``), or ``None``; without one, every
        remote image is refused."""
        key: str | None = None
        if llm.api_key_env is not None:
            key = environ.get(llm.api_key_env) or None
            if key is None:
                raise PolicyError(
                    f"llm.api_key_env names {llm.api_key_env}, which is not set (or empty); export it in the "
                    "shell that runs `stockade run` or `stockade exec` (or where the daemon starts), or "
                    "remove llm.api_key_env for a local model"
                )
        self.llm = llm
        self.run_id = run_id
        self._token = token.encode()
        # The key and the token in every form a value is searched in (an upstream
        # may quote the key URL-encoded or in JSON).
        self._own = ValueForms([(s.encode(), 0) for s in (key, token) if s])
        self._run_secrets = secrets or Secrets()
        self._image_url_refused = image_url_refused
        self._hooks = hooks
        self._client = httpx.AsyncClient(
            timeout=UPSTREAM_TIMEOUT, follow_redirects=False, trust_env=False, verify=_upstream_tls()
        )
        upstream_class = AnthropicUpstream if llm.provider == "anthropic" else OpenAIUpstream
        self._upstream: Upstream = upstream_class(llm.base_url, key, self._client)
        self._upstream.scrub = self.scrub
        self._servers: list[AppServer] = []
        self._pending: set[asyncio.Task[None]] = set()
        self.usage = LlmUsage()
        """What the budgets count; a helper's endpoint is given its family
        root's (``share_usage``), so the family draws from one budget."""

    @property
    def requests_used(self) -> int:
        return self.usage.requests

    @requests_used.setter
    def requests_used(self, value: int) -> None:
        self.usage.requests = value

    @property
    def tokens_used(self) -> int:
        return self.usage.tokens

    @tokens_used.setter
    def tokens_used(self, value: int) -> None:
        self.usage.tokens = value

    def share_usage(self, other: LlmEndpoint) -> None:
        """Count this endpoint's calls and tokens with ``other``'s (a helper's
        with its family root's): with ``llm.max_requests: 2`` a family of four
        runs made 8 calls on the operator's key when each counted its own."""
        self.usage = other.usage

    # ------------------------------------------------------------------ serving

    def app(self, cell_id: str) -> Starlette:
        """The ASGI app for one cell (its events carry ``cell_id``)."""

        async def models(request: Request) -> Response:
            return await self._models(request)

        async def chat(request: Request) -> Response:
            return await self._chat(request, cell_id)

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
            path = request.url.path
            code = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request")
            return _error(status, "invalid_request_error", f"{request.method} {path}: {detail}", code)

        return Starlette(
            routes=[
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/chat/completions", chat, methods=["POST"]),
            ],
            exception_handlers={HTTPException: http_error},
        )

    async def serve(self, sock: socket.socket, cell_id: str) -> None:
        """Serve ``cell_id``'s endpoint on ``sock`` (listening already); return once serving."""
        # Its limits (connections, idle ones, the daemon's descriptor
        # reserve) are the server's; its refusals go to the run's record.
        server = AppServer(
            self.app(cell_id), sock, record=self._hooks.record, run_id=self.run_id, cell=cell_id
        )
        await server.start()
        self._servers.append(server)

    async def close(self) -> None:
        """Stop every cell's server, let the last events be recorded, close the upstream client."""
        servers, self._servers = self._servers, []
        await asyncio.gather(*(server.close() for server in servers))
        await self.flush()
        await self._client.aclose()

    async def flush(self) -> None:
        """Wait until every finished call's event has been handed to ``hooks.record``."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    # ------------------------------------------------------------------ checks

    def _authorized(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)

    def _over_budget(self) -> str | None:
        llm = self.llm
        if llm.max_requests is not None and self.requests_used >= llm.max_requests:
            return (
                f"the run's budget of {llm.max_requests} LLM requests is spent; "
                "raise llm.max_requests in the policy to allow more"
            )
        if llm.max_tokens is not None and self.tokens_used >= llm.max_tokens:
            return (
                f"the run's budget of {llm.max_tokens} LLM tokens is spent ({self.tokens_used} used); "
                "raise llm.max_tokens in the policy to allow more"
            )
        return None

    async def _read_body(self, request: Request) -> bytes | None:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            return None
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > MAX_BODY:
                return None
        return bytes(body)

    # ------------------------------------------------------------------ events

    def scrub(self, text: str) -> str:
        """``text`` with the key and the run token (``[redacted]``) and the run's
        secrets replaced, in every form; cut a text only after this."""
        if self._own:
            text = self._own.scrub(text, lambda _: "[redacted]")
        return self._run_secrets.scrub(text)

    def _scrub(self, value: Any) -> Any:
        """``value`` with the key and the run token replaced wherever they appear
        (an upstream may echo a key in an error; an agent may paste its token)."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        return value

    def _event(
        self,
        call: _Call,
        *,
        status: int,
        verdict: str,
        reason: str | None,
        collected: Collected | None = None,
        usage_source: str | None = None,
    ) -> Event:
        messages = []
        if call.request is not None:
            for message in call.request.messages:
                messages.append(
                    {
                        "role": message.role,
                        "content": cut(self.scrub(message.text())),
                        "tool_calls": [
                            {
                                "id": c.id,
                                "name": c.function.name,
                                "arguments": cut(self.scrub(c.function.arguments)),
                            }
                            for c in message.tool_calls or ()
                        ],
                    }
                )
        usage = collected.usage if collected is not None else None
        latency = round(time.monotonic() - call.started, 3)
        llm = self.llm
        detail: dict[str, Any] = {
            "provider": llm.provider,
            "model": call.model,
            "requested_model": call.request.model if call.request is not None else None,
            "stream": call.stream,
            "messages": messages,
            "response": collected.detail(self.scrub) if collected is not None else None,
            "usage": usage,
            "usage_source": usage_source,
            "latency": latency,
            "status": status,
            "verdict": verdict,
            "reason": reason,
            "budget": {
                "requests": self.requests_used,
                "max_requests": llm.max_requests,
                "tokens": self.tokens_used,
                "max_tokens": llm.max_tokens,
            },
        }
        if verdict == "deny":
            summary = f"LLM call refused ({status}): {reason}"
        elif status >= 300:
            summary = f"LLM call to {call.model} ({llm.provider}) failed ({status}): {reason}"
        else:
            tokens = usage["total_tokens"] if usage else 0
            estimated = " (estimated)" if usage_source == "estimated" else ""
            summary = (
                f"LLM call to {call.model} ({llm.provider}) allowed: {status}, "
                f"{tokens:,} tokens{estimated}, {latency:.1f} s"
            )
        return Event(
            kind="llm.call",
            cell=call.cell,
            layer="llm",
            outcome="denied" if verdict == "deny" else "allowed",
            detail=self._scrub(detail),
            summary=self._scrub(summary),
            run=self.run_id,
        )

    async def _refuse(
        self, call: _Call, status: int, type: str, message: str, *, attack: bool = False
    ) -> Response:
        """Record a refusal (awaited: before the agent learns of it), then answer it."""
        event = self._event(call, status=status, verdict="deny", reason=message)
        try:
            await self._hooks.record([event])
            if attack:
                await self._hooks.denied()
        except StoreError as exc:
            return _error(503, "store_error", f"stockade cannot record this call, so it is refused: {exc}")
        return _error(status, type, message)

    async def _failed(self, call: _Call, exc: UpstreamError) -> Response:
        """Record an upstream failure (or a refusal the agent can fix), then answer it."""
        message = self._scrub(exc.message)
        event = self._event(call, status=exc.status, verdict="allow", reason=message)
        try:
            await self._hooks.record([event])
        except StoreError as store:
            log.error("stockade could not record an LLM call of run %s: %s", self.run_id, store)
        return _error(exc.status, exc.type, message)

    def _spawn(self, work: Awaitable[None]) -> None:
        # Allowed calls are recorded after the answer went out, in a task of
        # their own so that a client that hangs up mid-stream (which cancels
        # the response) cannot cancel the recording with it.
        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _record_later(self, event: Event) -> None:
        try:
            await self._hooks.record([event])
        except StoreError as exc:
            log.error("stockade could not record an LLM call of run %s: %s", self.run_id, exc)

    def _finish(self, call: _Call, collected: Collected, status: int, reason: str | None) -> None:
        """Count the call's tokens toward the budget and record it (later)."""
        usage_source = "upstream"
        if collected.usage is None:
            usage_source = "estimated"
            prompt_chars = _prompt_chars(call.request)
            answer_chars = len(collected.text()) + sum(
                len(c["arguments"]) for c in collected.tool_calls.values()
            )
            prompt, completion = _estimate(prompt_chars), _estimate(answer_chars)
            collected.usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        self.tokens_used += collected.usage["total_tokens"]
        event = self._event(
            call,
            status=status,
            verdict="allow",
            reason=reason,
            collected=collected,
            usage_source=usage_source,
        )
        self._spawn(self._record_later(event))

    # ------------------------------------------------------------------ routes

    async def _models(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "invalid_api_key", "the Authorization header does not carry this run's token")
        if (halted := self._hooks.halted()) is not None:
            return _error(403, "run_halted", f"the run is halted: {halted}")
        if self.llm.model is not None:
            names = [self.llm.model]
        else:
            try:
                names = await self._upstream.models()
            except UpstreamError as exc:
                return _error(exc.status, exc.type, self._scrub(exc.message))
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": self.llm.provider} for name in names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request, cell_id: str) -> Response:
        call = _Call(cell=cell_id, started=time.monotonic())
        if not self._authorized(request):
            return await self._refuse(
                call,
                401,
                "invalid_api_key",
                "the Authorization header does not carry this run's token; "
                "send 'Authorization: Bearer $OPENAI_API_KEY' as set in the cell",
                attack=True,
            )
        if (halted := self._hooks.halted()) is not None:
            return await self._refuse(
                call, 403, "run_halted", f"the run is halted, every call is refused: {halted}"
            )
        raw = await self._read_body(request)
        if raw is None:
            return await self._refuse(
                call,
                413,
                "invalid_request_error",
                f"the request body is larger than {MAX_BODY} bytes; send less",
            )
        try:
            body = json.loads(raw)
        except ValueError:
            return await self._refuse(call, 400, "invalid_request_error", "the request body is not JSON")
        if not isinstance(body, dict):
            return await self._refuse(
                call, 400, "invalid_request_error", "the request body is not a JSON object"
            )
        try:
            chat = ChatRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = _field(first["loc"])
            return await self._refuse(
                call,
                400,
                "invalid_request_error",
                f"{field}: {first['msg']}; fix this field of the request body",
            )
        call.request, call.stream = chat, chat.stream
        if (refused := self._way_out(raw, body, chat)) is not None:
            return await self._refuse(call, 403, "permission_error", refused, attack=True)
        call.model = self.llm.model or chat.model
        if call.model is None:
            return await self._refuse(
                call,
                400,
                "invalid_request_error",
                "model is missing; name the model to use in the request body",
            )
        try:
            payload = self._upstream.prepare(chat, {**body, "model": call.model})
        except UpstreamError as exc:
            return await self._refuse(call, exc.status, exc.type, exc.message)
        if (over := self._over_budget()) is not None:
            # Exhaustion is not an attack: recorded, not counted as a denial.
            return await self._refuse(call, 429, "budget_exceeded", over)
        self.requests_used += 1
        if chat.stream:
            return await self._stream(call, chat, payload)
        try:
            answer = await self._upstream.complete(payload)
        except UpstreamError as exc:
            return await self._failed(call, exc)
        collected = Collected()
        collected.add_response(answer)
        self._finish(call, collected, 200, None)
        return JSONResponse(answer)

    def _way_out(self, raw: bytes, body: Mapping[str, Any], chat: ChatRequest) -> str | None:
        """Why a request would carry something past ``network.allow``, or ``None``.

        The provider is one more host: a secret's value is never for it, and
        what it fetches for the agent (a remote ``image_url``, web search) is
        egress the gateway would not see.
        """
        names = self._run_secrets.values_in(raw)
        if names:
            return (
                f"the request carries the value of secret {', '.join(names)}, which is not meant for "
                "the LLM provider; send the conversation without it"
            )
        if "web_search_options" in body:
            return (
                "web_search_options makes the provider fetch pages past network.allow; "
                "fetch them with http.fetch or through the gateway instead"
            )
        for i, message in enumerate(chat.messages):
            if isinstance(message.content, str) or message.content is None:
                continue
            for j, part in enumerate(message.content):
                if not isinstance(part, ImagePart):
                    continue
                url = part.image_url.url
                if url[:5].lower() == "data:":
                    continue
                where = f"messages[{i}].content[{j}].image_url"
                shown = cut(self.scrub(url), 200)
                if not self.llm.remote_images or self._image_url_refused is None:
                    return (
                        f"{where} is the remote URL {shown!r}, which the provider would fetch past "
                        "network.allow; send the image inline as a data: URL (base64), or set "
                        "llm.remote_images: true with its host in network.allow"
                    )
                why = self._image_url_refused(url)
                if why is not None:
                    return f"{where} {shown!r} may not be fetched: {self.scrub(why)}"
        return None

    async def _stream(self, call: _Call, chat: ChatRequest, payload: dict[str, Any]) -> Response:
        try:
            chunks = await self._upstream.stream(payload)
        except UpstreamError as exc:
            return await self._failed(call, exc)
        collected = Collected()

        async def events() -> AsyncGenerator[str, None]:
            status, reason = 200, None
            try:
                async for chunk in chunks:
                    collected.add_chunk(chunk)
                    if not chat.wants_usage:
                        # The usage was asked for the budget, not by the agent:
                        # keep the stream as the agent asked for it.
                        if not chunk.get("choices"):
                            continue
                        chunk.pop("usage", None)
                    yield f"data: {json.dumps(chunk)}\n\n"
            except UpstreamError as exc:
                status, reason = 502, self._scrub(exc.message)
                error = {"message": reason, "type": exc.type, "code": exc.type}
                yield f"data: {json.dumps({'error': error})}\n\n"
            except BaseException:
                status, reason = 499, "the agent closed the connection before the stream ended"
                raise
            finally:
                self._finish(call, collected, status, reason)
                self._spawn(chunks.aclose())
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )


def _prompt_chars(request: ChatRequest | None) -> int:
    """Characters of the prompt: message texts and tool call arguments."""
    if request is None:
        return 0
    return sum(
        len(message.text()) + sum(len(c.function.arguments) for c in message.tool_calls or ())
        for message in request.messages
    )
