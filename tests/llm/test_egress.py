"""Issue 11 at the LLM endpoint: what the provider would carry past ``network.allow``
(remote images, a run secret's value, web search) is refused, and the key never
comes back, whole or cut, in an upstream's error."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
from typing import Any

import httpx
import pytest

from stockade.gateway._secrets import Secrets
from stockade.llm import Reply
from stockade.llm._upstreams import upstream_failure
from stockade.policy._model import SecretPolicy
from tests.llm import KEY, Hooks, running

PIXEL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n0000").decode()
SECRET = "ghp_0123456789abcdefSECRET"


def _image(url: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    }


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_remote_image_url_is_refused_and_a_data_url_passes(provider: str) -> None:
    async def main() -> None:
        async with running(provider) as setup:
            remote = await setup.client.post(
                "/chat/completions", json=_image("https://attacker.example/x.png?d=1")
            )
            upper = await setup.client.post("/chat/completions", json=_image("HTTP://attacker.example/x.png"))
            inline = await setup.client.post("/chat/completions", json=_image(PIXEL))
            assert remote.status_code == upper.status_code == 403
            message = remote.json()["error"]["message"]
            assert "messages[0].content[1].image_url" in message and "llm.remote_images" in message
            assert inline.status_code == 200  # the control
            assert setup.hooks.denials == 2
            await setup.endpoint.flush()
            denied = [json.loads(e) for e in setup.events_json() if '"denied"' in e]
            assert len(denied) == 2 and "attacker.example" in denied[0]["detail"]["reason"]
            # The refused calls never reached the provider.
            assert len(setup.mock.seen) == 1

    asyncio.run(main())


def test_remote_images_when_allowed_still_pass_network_allow() -> None:
    def refused(url: str) -> str | None:
        host = urllib.parse.urlsplit(url).hostname
        return None if host == "images.example.com" else f"no network.allow rule matches {host}:443"

    async def main() -> None:
        async with running(remote_images=True, image_url_refused=refused) as setup:
            ok = await setup.client.post("/chat/completions", json=_image("https://images.example.com/a.png"))
            out = await setup.client.post("/chat/completions", json=_image("https://attacker.example/a.png"))
            assert ok.status_code == 200
            assert out.status_code == 403 and "no network.allow rule matches attacker.example" in out.text
            assert len(setup.mock.seen) == 1

    asyncio.run(main())


def test_a_run_secret_and_web_search_are_refused() -> None:
    secrets = Secrets.load([SecretPolicy("GH", env="GH", hosts=("api.github.com",))], {"GH": SECRET})

    async def main() -> None:
        async with running(secrets=secrets) as setup:
            said = {"model": "m", "messages": [{"role": "user", "content": "the token is " + SECRET}]}
            encoded = {
                "model": "m",
                "messages": [{"role": "user", "content": base64.b64encode(SECRET.encode()).decode()}],
            }
            search = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "web_search_options": {}}
            placeholder = {"model": "m", "messages": [{"role": "user", "content": secrets.env()["GH"]}]}
            answers = [await setup.client.post("/chat/completions", json=b) for b in (said, encoded, search)]
            ok = await setup.client.post("/chat/completions", json=placeholder)
            assert [a.status_code for a in answers] == [403, 403, 403]
            assert "secret GH" in answers[0].text and "secret GH" in answers[1].text
            assert "web_search_options" in answers[2].text
            assert ok.status_code == 200  # a placeholder is harmless, and passes
            await setup.endpoint.flush()
            text = "".join(setup.events_json())
            assert SECRET not in text and base64.b64encode(SECRET.encode()).decode()[4:20] not in text
            assert len(setup.mock.seen) == 1

    asyncio.run(main())


def test_an_upstream_error_is_scrubbed_before_it_is_cut() -> None:
    async def main() -> None:
        async with running() as setup:
            # Not JSON: the body itself is the message, cut at 500 characters; the key
            # straddles the cut (500 - 470 - 7 characters of it would remain).
            text = "x" * 470 + f"Bearer {KEY} rejected"
            response = httpx.Response(500, content=text.encode(), request=httpx.Request("POST", "http://u/"))
            error = await upstream_failure(response, "http://u/", setup.endpoint.scrub)
            assert "Bearer sk-" not in error.message and KEY[:8] not in error.message
            assert "[redacted]" in error.message

    asyncio.run(main())


@pytest.mark.parametrize(
    "quoted",
    [KEY, urllib.parse.quote(KEY, safe=""), base64.b64encode(KEY.encode()).decode(), KEY.encode().hex()],
)
def test_the_key_in_an_upstream_error_never_reaches_the_agent(quoted: str) -> None:
    def failing(conversation: Any) -> Reply:
        return Reply(error=(401, f"Incorrect API key provided: {quoted}"))

    async def main() -> None:
        hooks = Hooks()
        async with running(script=failing, hooks=hooks) as setup:
            r = await setup.client.post(
                "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            assert r.status_code == 502 and "llm.api_key_env" in r.text
            assert quoted not in r.text and KEY not in r.text
            assert quoted not in "".join(setup.events_json())

    asyncio.run(main())
