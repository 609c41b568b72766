"""The LLM endpoint against the mock upstream, both dialects, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from stockade.errors import PolicyError
from stockade.llm import LlmEndpoint, Reply, Said
from stockade.policy import LlmPolicy
from tests.llm import KEY, TOKEN, TOOLS, Hooks, Setup, assemble, closed_port, read_stream, running

PROVIDERS = ["openai", "anthropic"]
TASK = "# Fix the flaky login test\nIt fails one run in ten.\n"
REPORT = "# Report\n\nFIX THE FLAKY LOGIN TEST\n"


async def _turn(setup: Setup, messages: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
    body = {"model": "gpt-agent", "messages": messages, "tools": TOOLS, "stream": stream, **extra}
    if not stream:
        response = await setup.client.post("/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        return {**choice["message"], "finish_reason": choice["finish_reason"]}
    async with setup.client.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks, done = await read_stream(response)
    assert done
    assert all(chunk["choices"] for chunk in chunks), "a usage-only chunk the agent did not ask for"
    return assemble(chunks)


async def _solve(setup: Setup, stream: bool) -> tuple[list[tuple[str, Any]], list[str | None], str]:
    """Run the demo agent's loop against the solver script: tool calls executed
    here, results sent back, until the model answers with text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are the demo agent."},
        {"role": "user", "content": "Do the task in task.md."},
    ]
    calls: list[tuple[str, Any]] = []
    finishes: list[str | None] = []
    for _ in range(6):
        reply = await _turn(setup, messages, stream)
        finishes.append(reply["finish_reason"])
        if not reply.get("tool_calls"):
            return calls, finishes, reply["content"]
        messages.append(
            {"role": "assistant", "content": reply.get("content") or None, "tool_calls": reply["tool_calls"]}
        )
        for call in reply["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            calls.append((call["function"]["name"], arguments))
            result = TASK if arguments.get("path") == "task.md" else "written"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise AssertionError("the solver did not finish in 6 turns")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_tool_calls_round_trip(provider: str, stream: bool) -> None:
    async def main() -> None:
        async with running(provider) as setup:
            calls, finishes, final = await _solve(setup, stream)
            await setup.endpoint.flush()
            assert calls == [
                ("read_file", {"path": "task.md"}),
                ("write_file", {"path": "report.md", "content": REPORT}),
            ]
            assert finishes == ["tool_calls", "tool_calls", "stop"]
            assert final.startswith("Done")
            events = setup.hooks.events
            assert [e.kind for e in events] == ["llm.call"] * 3
            assert {(e.layer, e.outcome, e.detail["status"], e.detail["verdict"]) for e in events} == {
                ("llm", "allowed", 200, "allow")
            }
            assert all(e.detail["usage"]["total_tokens"] > 0 for e in events)
            assert all(e.detail["usage_source"] == "upstream" for e in events)
            assert events[-1].detail["budget"]["requests"] == 3
            assert events[0].detail["response"]["tool_calls"][0]["name"] == "read_file"
            assert events[-1].detail["response"]["finish_reason"] == "stop"
            assert [m["role"] for m in events[-1].detail["messages"]][:2] == ["system", "user"]
            # The policy's model replaced the agent's.
            assert {e.detail["model"] for e in events} == {"policy-model"}
            assert {e.detail["requested_model"] for e in events} == {"gpt-agent"}
            assert {s.body["model"] for s in setup.mock.seen} == {"policy-model"}

    asyncio.run(main())


def test_anthropic_request_is_translated() -> None:
    async def main() -> None:
        async with running("anthropic") as setup:
            await _solve(setup, stream=False)
            last = setup.mock.seen[-1]
            assert last.path == "/v1/messages"
            assert last.headers["x-api-key"] == KEY
            assert last.headers["anthropic-version"] == "2023-06-01"
            assert "authorization" not in last.headers
            body = last.body
            assert body["system"] == "You are the demo agent."
            assert body["max_tokens"] == 4096
            assert [t["name"] for t in body["tools"]] == [
                "shell",
                "read_file",
                "write_file",
                "fetch",
                "intent",
            ]
            assert body["tools"][1]["input_schema"]["properties"] == {"path": {"type": "string"}}
            assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
            use = body["messages"][1]["content"][0]
            result = body["messages"][2]["content"][0]
            assert use["type"] == "tool_use" and use["input"] == {"path": "task.md"}
            assert result == {"type": "tool_result", "tool_use_id": use["id"], "content": TASK}

    asyncio.run(main())


def test_openai_upstream_gets_the_key_as_bearer() -> None:
    async def main() -> None:
        async with running("openai") as setup:
            await _turn(setup, [{"role": "user", "content": "hi"}], stream=False)
            assert setup.mock.seen[-1].headers["authorization"] == f"Bearer {KEY}"

    asyncio.run(main())


def test_no_key_env_sends_no_key() -> None:
    async def main() -> None:
        async with running("openai", key_env=None) as setup:
            await _turn(setup, [{"role": "user", "content": "hi"}], stream=False)
            headers = setup.mock.seen[-1].headers
            assert "authorization" not in headers
            assert TOKEN not in json.dumps(headers)

    asyncio.run(main())


def test_missing_key_variable_is_a_policy_error() -> None:
    llm = LlmPolicy(provider="openai", base_url="http://127.0.0.1:9/v1", api_key_env="NOT_SET_ANYWHERE")
    with pytest.raises(PolicyError, match="NOT_SET_ANYWHERE"):
        LlmEndpoint(llm, run_id="r", token=TOKEN, hooks=Hooks(), environ={})


def test_requested_model_passes_without_a_policy_model() -> None:
    async def main() -> None:
        async with running("openai", model=None) as setup:
            await _turn(setup, [{"role": "user", "content": "hi"}], stream=False)
            assert setup.mock.seen[-1].body["model"] == "gpt-agent"
            response = await setup.client.post(
                "/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            )
            assert response.status_code == 400
            assert response.json()["error"]["message"].startswith("model is missing")

    asyncio.run(main())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_usage_chunk_only_when_asked(provider: str) -> None:
    async def main() -> None:
        async with running(provider) as setup:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with setup.client.stream("POST", "/chat/completions", json=body) as response:
                chunks, done = await read_stream(response)
            assert done
            assert chunks[-1]["choices"] == []
            assert chunks[-1]["usage"]["total_tokens"] > 0
            # Without include_usage the endpoint still asked the upstream (openai), for the budget.
            await _turn(setup, [{"role": "user", "content": "hi"}], stream=True)
            if provider == "openai":
                assert setup.mock.seen[-1].body["stream_options"] == {"include_usage": True}
            await setup.endpoint.flush()
            assert [e.detail["usage_source"] for e in setup.hooks.events] == ["upstream", "upstream"]

    asyncio.run(main())


def test_stream_without_usage_is_estimated_and_says_so() -> None:
    async def main() -> None:
        async with running("openai", stream_usage=False, max_tokens=10_000) as setup:
            await _turn(setup, [{"role": "user", "content": "x" * 400}], stream=True)
            await setup.endpoint.flush()
            (event,) = setup.hooks.events
            assert event.detail["usage_source"] == "estimated"
            assert event.detail["usage"]["prompt_tokens"] == 100  # 400 characters / 4
            assert "(estimated)" in event.summary
            assert setup.endpoint.tokens_used == event.detail["usage"]["total_tokens"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("headers", "what"),
    [
        ({}, "none"),
        ({"authorization": "Bearer wrong-token"}, "wrong"),
        ({"authorization": TOKEN}, "no scheme"),
    ],
)
def test_auth(headers: dict[str, str], what: str) -> None:
    async def main() -> None:
        async with running() as setup:
            async with httpx.AsyncClient(base_url=setup.url, headers=headers, trust_env=False) as client:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                response = await client.post("/chat/completions", json=body)
                models = await client.get("/models")
            assert response.status_code == 401, what
            assert response.json()["error"]["type"] == "invalid_api_key"
            assert models.status_code == 401
            assert len(setup.mock.seen) == 0
            (event,) = setup.hooks.events
            assert (event.outcome, event.detail["status"], event.detail["verdict"]) == ("denied", 401, "deny")
            assert setup.hooks.denials == 1

    asyncio.run(main())


def test_max_requests() -> None:
    async def main() -> None:
        async with running(max_requests=2) as setup:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            statuses = [
                (await setup.client.post("/chat/completions", json=body)).status_code for _ in range(3)
            ]
            refused = await setup.client.post("/chat/completions", json=body)
            assert statuses == [200, 200, 429]
            error = refused.json()["error"]
            assert error["type"] == "budget_exceeded"
            assert "llm.max_requests" in error["message"]
            assert len(setup.mock.seen) == 2
            await setup.endpoint.flush()
            denied = [e for e in setup.hooks.events if e.outcome == "denied"]
            assert len(denied) == 2
            assert denied[0].detail["budget"] == {
                "requests": 2,
                "max_requests": 2,
                "tokens": 12,
                "max_tokens": None,
            }
            assert setup.hooks.denials == 0  # exhaustion is not an attack

    asyncio.run(main())


def test_max_tokens() -> None:
    async def main() -> None:
        async with running(max_tokens=50) as setup:
            body = {"model": "m", "messages": [{"role": "user", "content": "y" * 400}]}
            first = await setup.client.post("/chat/completions", json=body)
            second = await setup.client.post("/chat/completions", json=body)
            assert first.status_code == 200
            assert first.json()["usage"]["total_tokens"] > 50
            assert second.status_code == 429
            assert "llm.max_tokens" in second.json()["error"]["message"]
            assert len(setup.mock.seen) == 1
            assert setup.hooks.denials == 0

    asyncio.run(main())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"model": "m"}).encode(), "messages"),
        (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        (
            json.dumps({"model": "m", "messages": [{"role": "robot", "content": "x"}]}).encode(),
            "messages[0].role",
        ),
        (json.dumps({"model": "m", "messages": [{"role": "tool", "content": "x"}]}).encode(), "tool_call_id"),
        (
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"}
            ).encode(),
            "max_tokens",
        ),
        (
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}
            ).encode(),
            "tools[0]",
        ),
    ],
)
def test_bad_bodies(body: bytes, field: str) -> None:
    async def main() -> None:
        async with running() as setup:
            response = await setup.client.post(
                "/chat/completions", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert field in error["message"]
            assert len(setup.mock.seen) == 0
            assert setup.hooks.events[0].detail["status"] == 400

    asyncio.run(main())


def test_body_size_limit() -> None:
    async def main() -> None:
        async with running() as setup:
            body = {"model": "m", "messages": [{"role": "user", "content": "z" * (4 * 1024 * 1024)}]}
            response = await setup.client.post("/chat/completions", json=body)
            assert response.status_code == 413
            assert "larger than" in response.json()["error"]["message"]
            assert len(setup.mock.seen) == 0

    asyncio.run(main())


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_upstream_down(provider: str, stream: bool) -> None:
    async def main() -> None:
        base = f"http://127.0.0.1:{closed_port()}/v1"
        async with running(provider, upstream_base=base) as setup:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            response = await setup.client.post("/chat/completions", json=body)
            assert response.status_code == 502
            message = response.json()["error"]["message"]
            assert "could not be reached" in message and "127.0.0.1" in message
            (event,) = setup.hooks.events
            assert event.detail["status"] == 502
            assert "could not be reached" in event.detail["reason"]

    asyncio.run(main())


def _failing(status: int, message: str) -> Any:
    def script(conversation: Any) -> Reply:
        return Reply(error=(status, message))

    return script


@pytest.mark.parametrize("provider", PROVIDERS)
def test_upstream_errors_map(provider: str) -> None:
    async def main() -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with running(provider, script=_failing(500, "overloaded")) as setup:
            response = await setup.client.post("/chat/completions", json=body)
            assert response.status_code == 502
            assert "failed (500): overloaded" in response.json()["error"]["message"]
        async with running(provider, script=_failing(400, "prompt is too long")) as setup:
            response = await setup.client.post("/chat/completions", json=body)
            assert response.status_code == 400
            assert "prompt is too long" in response.json()["error"]["message"]
        async with running(provider, script=_failing(401, f"Incorrect API key provided: {KEY}")) as setup:
            response = await setup.client.post("/chat/completions", json=body)
            assert response.status_code == 502
            message = response.json()["error"]["message"]
            assert "llm.api_key_env" in message
            assert KEY not in message
            assert KEY not in "".join(setup.events_json())

    asyncio.run(main())


def test_no_key_or_token_in_any_event() -> None:
    def echo(conversation: Any) -> Reply:
        # A model that repeats what it was told, token included.
        return Reply(content=" ".join(s.text for s in conversation if isinstance(s, Said)))

    async def main() -> None:
        async with running("openai", script=echo, max_requests=3) as setup:
            pasted = [{"role": "user", "content": f"my key is {TOKEN} and {KEY}"}]
            await _turn(setup, pasted, stream=False)
            await _turn(setup, pasted, stream=True)
            await setup.client.post("/chat/completions", json={"messages": pasted, "stream": "sideways"})
            await setup.client.post("/chat/completions", json={"model": "m", "messages": pasted})
            await setup.client.post(
                "/chat/completions", json={"model": "m", "messages": pasted}
            )  # over budget
            await setup.endpoint.flush()
            events = setup.events_json()
            assert len(events) == 5
            assert {json.loads(e)["detail"]["status"] for e in events} == {200, 400, 429}
            for text in events:
                assert KEY not in text
                assert TOKEN not in text
                assert "authorization" not in text.lower()
            assert "[redacted]" in events[0]

    asyncio.run(main())


def test_halted_run_refuses() -> None:
    async def main() -> None:
        async with running() as setup:
            setup.hooks.halt = "the tripwire tripped after 10 denials"
            response = await setup.client.post(
                "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            assert response.status_code == 403
            assert response.json()["error"]["type"] == "run_halted"
            assert "tripwire" in response.json()["error"]["message"]
            assert len(setup.mock.seen) == 0
            assert setup.hooks.events[0].outcome == "denied"

    asyncio.run(main())


def test_store_failure_on_a_refusal_answers_503() -> None:
    async def main() -> None:
        async with running(max_requests=1) as setup:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert (await setup.client.post("/chat/completions", json=body)).status_code == 200
            setup.hooks.broken = True
            response = await setup.client.post("/chat/completions", json=body)
            assert response.status_code == 503
            assert response.json()["error"]["type"] == "store_error"

    asyncio.run(main())


def test_models() -> None:
    async def main() -> None:
        async with running("openai") as setup:
            listed = (await setup.client.get("/models")).json()
            assert [m["id"] for m in listed["data"]] == ["policy-model"]
        for provider in PROVIDERS:
            async with running(provider, model=None) as setup:
                response = await setup.client.get("/models")
                assert response.status_code == 200
                assert [m["id"] for m in response.json()["data"]] == ["mock-llm"]
                assert setup.mock.seen[-1].path == "/v1/models"

    asyncio.run(main())


def test_unknown_path_is_an_openai_error() -> None:
    async def main() -> None:
        async with running() as setup:
            response = await setup.client.get("/embeddings")
            assert response.status_code == 404
            assert "/v1/embeddings" in response.json()["error"]["message"]
            assert response.json()["error"]["code"] == "not_found"
            response = await setup.client.get("/chat/completions")
            assert response.status_code == 405
            assert response.json()["error"]["code"] == "method_not_allowed"

    asyncio.run(main())


def test_cells_share_the_run_budget() -> None:
    async def main() -> None:
        from tests.llm import listening

        async with running(max_requests=2) as setup:
            second = listening()
            await setup.endpoint.serve(second, "c-000000000002")
            other = f"http://127.0.0.1:{second.getsockname()[1]}/v1"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=other, headers=headers, trust_env=False) as client:
                assert (await client.post("/chat/completions", json=body)).status_code == 200
                assert (await setup.client.post("/chat/completions", json=body)).status_code == 200
                assert (await client.post("/chat/completions", json=body)).status_code == 429
            await setup.endpoint.flush()
            assert [e.cell for e in setup.hooks.events] == [
                "c-000000000002",
                "c-000000000001",
                "c-000000000002",
            ]

    asyncio.run(main())


def test_untranslatable_request_is_refused_before_it_counts() -> None:
    async def main() -> None:
        async with running("anthropic", max_requests=1) as setup:
            call = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{oops"}}
            messages = [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
            response = await setup.client.post("/chat/completions", json={"model": "m", "messages": messages})
            assert response.status_code == 400
            assert "messages[1].tool_calls[0].function.arguments" in response.json()["error"]["message"]
            assert len(setup.mock.seen) == 0
            assert setup.endpoint.requests_used == 0
            assert setup.hooks.events[0].outcome == "denied"
            fine = await setup.client.post("/chat/completions", json={"model": "m", "messages": messages[:1]})
            assert fine.status_code == 200

    asyncio.run(main())
