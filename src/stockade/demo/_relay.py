"""A relay from the demo's model port to a real OpenAI-compatible endpoint.

``stockade demo --model-url URL`` keeps the demo's network namespace closed:
the run's LLM endpoint reaches the model server on the namespace's
``127.0.0.1:11434``, where this relay listens; the relay itself runs in the
host's namespace (``_world.ModelServer``) and forwards ``/v1/<path>`` to
``URL/<path>``, streaming the answer back. The key, if any, is the one the LLM
endpoint adds (the policy's ``llm.api_key_env``); the relay adds nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length")
)


def relay_app(base_url: str) -> Any:
    """The ASGI app forwarding ``/v1/...`` to ``base_url``."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    base = base_url.rstrip("/")
    client = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=30.0), trust_env=False)

    async def forward(request: Request) -> StreamingResponse:
        path = request.url.path
        suffix = path[len("/v1") :] if path.startswith("/v1") else path
        url = base + suffix + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = client.build_request(request.method, url, headers=headers, content=await request.body())
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            # An answer the LLM endpoint passes on, not a traceback in the log.
            message = f"the model at {base} is unreachable: {exc or type(exc).__name__}"
            return JSONResponse(  # type: ignore[return-value]
                {"error": {"message": message, "type": "model_unreachable", "code": "model_unreachable"}},
                status_code=502,
            )

        async def body() -> AsyncIterator[bytes]:
            async for chunk in response.aiter_raw():
                yield chunk

        kept = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(
            body(), status_code=response.status_code, headers=kept, background=BackgroundTask(response.aclose)
        )

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    app.state.aclose = client.aclose  # the model server calls it when it stops
    return app


__all__ = ["relay_app"]
