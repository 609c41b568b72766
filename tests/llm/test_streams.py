"""Streams that go wrong: an upstream that fails mid-stream, an agent that hangs up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from stockade.llm import AppServer
from stockade.record import Event
from tests.llm import Hooks, listening, read_stream, running

FIRST = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}


class Waiting(Hooks):
    """Hooks that let a test wait for the first recorded event."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded = asyncio.Event()

    async def record(self, events: Sequence[Event]) -> None:
        await super().record(events)
        self.recorded.set()


@asynccontextmanager
async def _upstream(mode: str) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """An OpenAI upstream whose stream sends one chunk, then fails or waits for ``release``."""
    release = asyncio.Event()

    async def chat(request: Request) -> Response:
        async def body() -> AsyncGenerator[str, None]:
            yield f"data: {json.dumps(FIRST)}\n\n"
            if mode == "error":
                yield 'data: {"error": {"message": "the model crashed"}}\n\n'
                return
            await release.wait()
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    server = AppServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]), listening())
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.address[1]}/v1", release
    finally:
        release.set()
        await server.close()


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_upstream_failing_mid_stream() -> None:
    async def main() -> None:
        async with _upstream("error") as (base, _), running(upstream_base=base) as setup:
            async with setup.client.stream("POST", "/chat/completions", json=BODY) as response:
                assert response.status_code == 200  # sent before the failure
                chunks, done = await read_stream(response)
            assert done
            assert chunks[0]["choices"][0]["delta"]["content"] == "Hel"
            assert "the model crashed" in chunks[-1]["error"]["message"]
            await setup.endpoint.flush()
            (event,) = setup.hooks.events
            assert event.detail["status"] == 502
            assert "the model crashed" in event.detail["reason"]
            assert event.detail["response"]["content"] == "Hel"

    asyncio.run(main())


def test_agent_hanging_up_mid_stream_is_recorded() -> None:
    async def main() -> None:
        hooks = Waiting()
        async with _upstream("hang") as (base, _), running(upstream_base=base, hooks=hooks) as setup:
            async with setup.client.stream("POST", "/chat/completions", json=BODY) as response:
                lines = response.aiter_lines()
                assert await anext(lines) == f"data: {json.dumps(FIRST)}"
            # Leaving the block closed the connection while the upstream still streams.
            await asyncio.wait_for(hooks.recorded.wait(), timeout=30)
            (event,) = hooks.events
            assert event.detail["status"] == 499
            assert "closed the connection" in event.detail["reason"]
            assert event.detail["response"]["content"] == "Hel"
            assert event.detail["usage_source"] == "estimated"

    asyncio.run(main())
