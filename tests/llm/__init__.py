"""Helpers for the LLM endpoint's tests: a mock upstream and an endpoint, both on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from stockade.errors import StoreError
from stockade.gateway._secrets import Secrets
from stockade.llm import AppServer, LlmEndpoint, MockLlm, Script
from stockade.llm._scripts import solver
from stockade.policy import LlmPolicy
from stockade.record import Event

TOKEN = "stockade-run-token-0123456789abcdef0123456789abcdef"
KEY = "sk-operator-key-DO-NOT-LEAK-9f8e7d6c5b4a"
KEY_ENV = "TEST_LLM_KEY"


def listening() -> socket.socket:
    """A TCP socket listening on 127.0.0.1, on a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens (bound, then closed)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


@dataclass
class Hooks:
    """GatewayHooks for tests: keeps what it is given."""

    events: list[Event] = field(default_factory=list)
    denials: int = 0
    halt: str | None = None
    broken: bool = False

    async def record(self, events: Sequence[Event]) -> None:
        if self.broken:
            raise StoreError("the test store cannot write")
        self.events.extend(events)

    async def denied(self) -> None:
        self.denials += 1

    def halted(self) -> str | None:
        return self.halt


@dataclass
class Setup:
    mock: MockLlm
    endpoint: LlmEndpoint
    hooks: Hooks
    client: httpx.AsyncClient
    url: str

    def events_json(self) -> list[str]:
        return [json.dumps(event.to_dict()) for event in self.hooks.events]


@asynccontextmanager
async def running(
    provider: str = "openai",
    *,
    script: Script = solver,
    stream_usage: bool = True,
    upstream_base: str | None = None,
    model: str | None = "policy-model",
    key_env: str | None = KEY_ENV,
    max_requests: int | None = None,
    max_tokens: int | None = None,
    hooks: Hooks | None = None,
    remote_images: bool = False,
    secrets: Secrets | None = None,
    image_url_refused: Callable[[str], str | None] | None = None,
) -> AsyncIterator[Setup]:
    """A mock upstream, an endpoint in front of it, and a client with the run's token."""
    mock = MockLlm(script, stream_usage=stream_usage)
    mock_server = AppServer(mock.app(), listening())
    await mock_server.start()
    port = mock_server.address[1]
    # The Anthropic default base URL has no /v1: test that form for it.
    base = upstream_base or (
        f"http://127.0.0.1:{port}/v1" if provider == "openai" else f"http://127.0.0.1:{port}"
    )
    llm = LlmPolicy(
        provider=provider,
        base_url=base,
        model=model,
        api_key_env=key_env,
        max_requests=max_requests,
        max_tokens=max_tokens,
        remote_images=remote_images,
    )
    hooks = hooks or Hooks()
    endpoint = LlmEndpoint(
        llm,
        run_id="r-000000000001",
        token=TOKEN,
        hooks=hooks,
        environ={KEY_ENV: KEY},
        secrets=secrets,
        image_url_refused=image_url_refused,
    )
    sock = listening()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    await endpoint.serve(sock, "c-000000000001")
    client = httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, trust_env=False)
    try:
        yield Setup(mock, endpoint, hooks, client, url)
    finally:
        await client.aclose()
        await endpoint.close()
        await mock_server.close()


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the demo agent's {name}",
            "parameters": {"type": "object", "properties": {arg: {"type": "string"} for arg in args}},
        },
    }
    for name, args in (
        ("shell", ["command"]),
        ("read_file", ["path"]),
        ("write_file", ["path", "content"]),
        ("fetch", ["url"]),
        ("intent", ["name", "args"]),
    )
]


async def read_stream(response: httpx.Response) -> tuple[list[dict[str, Any]], bool]:
    """The JSON chunks of an SSE answer, and whether it ended with ``[DONE]``
    (parsed here independently of the code under test)."""
    chunks: list[dict[str, Any]] = []
    done = False
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        assert not done, "data after [DONE]"
        if line == "data: [DONE]":
            done = True
        else:
            chunks.append(json.loads(line[6:]))
    return chunks, done


def assemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message the chunks spell, the way OpenAI clients rebuild it."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += call.get("function", {}).get("name") or ""
                slot["arguments"] += call.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {
        "content": content,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ],
        "finish_reason": finish,
    }
