"""http.fetch: every hop decided and checked, limits kept, canaries untouched where refused.

Everything runs inside a test network namespace where 93.184.216.34 (public
looking, allowed), 93.184.216.35 (public, not allowed), 10.0.0.1 (private),
169.254.169.254 (metadata), fd00::1 (ULA) and 2606:4700::1111 live on ``lo``,
with the test's DNS server on its 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import ipaddress
import ssl
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stockade.gateway._egress import Destination, Egress
from stockade.gateway._fetch import FetchFailed, FetchLimits, FetchRefused, FetchResult, fetch
from stockade.gateway._resolve import DnsResolver
from stockade.gateway._secrets import Secrets
from stockade.gateway._upstream import UpstreamError, open_upstream, upstream_tls_context
from stockade.policy import loads_policy
from stockade.policy._model import SecretPolicy
from tests._netns import TestNetns
from tests.gateway._dns import TestDns
from tests.gateway._servers import Canary, HttpServer, Reply
from tests.gateway._tls import TestPki
from tests.gateway.test_secret_leaks import recoverable

PUBLIC = "93.184.216.34"
OTHER = "93.184.216.35"
PRIVATE = "10.0.0.1"
METADATA = "169.254.169.254"
ULA = "fd00::1"
PUBLIC6 = "2606:4700::1111"

ALLOW = """\
    - api.example.com:443
    - api.example.com:80
    - www.example.com:443
    - wrong.example.com:443
    - internal.example.com:80
    - rebind.example.com:80
    - {host: git.example.com, methods: [GET], paths: [/v1/]}
    - "[2606:4700::1111]:80"
"""


@pytest.fixture(scope="module")
def ns() -> Iterator[TestNetns]:
    with TestNetns([PUBLIC, OTHER, PRIVATE, METADATA, ULA, PUBLIC6]) as namespace:
        yield namespace


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki(tmp_path_factory.mktemp("pki"))


@dataclass
class World:
    egress: Egress
    dns: TestDns
    pki: TestPki
    web: HttpServer
    """http on 93.184.216.34:80 and https on :443 (certificate for api, www, git.example.com)."""
    other: HttpServer
    """Any server on the public address the policy does not name."""
    private: HttpServer
    """10.0.0.1:80, fd00::1:80 and 2606:4700::1111:80."""
    canaries: Canary
    """169.254.169.254:80/443, 10.0.0.1:443, 127.0.0.1:80."""

    async def get(self, url: str, **kwargs: object) -> FetchResult:
        kwargs.setdefault("tls", upstream_tls_context(self.pki.ca_file))
        return await fetch(self.egress, url, **kwargs)  # type: ignore[arg-type]

    def untouched(self) -> bool:
        return not self.canaries.hits and self.other.connections == 0 and self.private.connections == 0


def in_world(
    ns: TestNetns, pki: TestPki, body: Callable[[World], Awaitable[None]], *, allow: str = ALLOW
) -> None:
    async def main() -> None:
        dns = await TestDns(
            {
                "api.example.com": [PUBLIC],
                "www.example.com": [PUBLIC],
                "git.example.com": [PUBLIC],
                "wrong.example.com": [PUBLIC],
                "evil.example": [OTHER],
                "internal.example.com": [PRIVATE],
                "rebind.example.com": [PUBLIC],
            }
        ).start()
        tls = pki.server_context(["api.example.com", "www.example.com", "git.example.com"])
        web = HttpServer({"/": Reply(body=b"hello")})
        await web.listen(PUBLIC, 80)
        web_tls = HttpServer(tls=tls)
        web_tls.routes = web.routes
        web_tls.seen = web.seen
        await web_tls.listen(PUBLIC, 443)
        other = HttpServer({"/": Reply(body=b"other")})
        for port in (80, 443):
            await other.listen(OTHER, port)
        private = HttpServer({"/": Reply(body=b"private")})
        for host in (PRIVATE, ULA, PUBLIC6):
            await private.listen(host, 80)
        canaries = Canary()
        for host, port in ((METADATA, 80), (METADATA, 443), (PRIVATE, 443), ("127.0.0.1", 80)):
            await canaries.listen(host, port)
        policy = loads_policy(f"name: t\nnetwork:\n  allow:\n{allow}")
        world = World(
            Egress(policy.network, resolver=DnsResolver(dns.spec)), dns, pki, web, other, private, canaries
        )
        try:
            await body(world)
        finally:
            for server in (web, web_tls, other, private):
                await server.close()
            await canaries.close()
            await dns.close()

    with ns.entered():
        asyncio.run(main())


def test_https_get(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        result = await w.get("https://API.example.com/?q=1#frag", headers={"X-Test": "1"})
        assert (result.status, result.body, result.truncated) == (200, b"hello", False)
        assert ("Content-Length", "5") in result.headers or ("content-length", "5") in result.headers
        (hop,) = result.hops
        assert (hop.method, hop.host, hop.port, hop.address, hop.status) == (
            "GET",
            "api.example.com",
            443,
            PUBLIC,
            200,
        )
        assert (hop.verdict, hop.rule) == ("allow", "network.allow[0] (api.example.com)")
        assert hop.bytes_up > 0 and hop.bytes_down > len(b"hello")
        (seen,) = w.web.seen
        assert seen.target == "/?q=1"
        assert seen.headers["host"] == "api.example.com"
        assert seen.headers["x-test"] == "1"
        assert w.untouched()

    in_world(ns, pki, body)


def test_plain_http_refused_unless_allowed(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchRefused) as caught:
            await w.get("http://api.example.com/")
        assert "plain HTTP" in caught.value.reason and "fetch_plain_http" in caught.value.reason
        assert [h.verdict for h in caught.value.hops] == ["deny"]
        assert w.web.connections == 0
        result = await w.get("http://api.example.com/", plain_http=True)
        assert result.body == b"hello" and result.hops[0].rule == "network.allow[1] (api.example.com)"

    in_world(ns, pki, body)


def test_not_allowed_host_refused_with_the_rule_to_add(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchRefused) as caught:
            await w.get("https://evil.example/")
        assert caught.value.reason == (
            'no network.allow rule matches evil.example:443; add "- host: evil.example" to network.allow'
        )
        assert caught.value.hops[0].address is None
        assert w.untouched() and w.dns.queries == []  # refused before any lookup

    in_world(ns, pki, body)


def redirect(location: str, status: int = 302) -> Reply:
    return Reply(status, [("Location", location)], b"moved")


@pytest.mark.parametrize(
    ("location", "words"),
    [
        (f"http://{PRIVATE}/", "no network.allow rule matches 10.0.0.1:80"),
        (f"http://{METADATA}/latest/meta-data/", "none may: 169.254.169.254 is the cloud metadata address"),
        ("http://0xa9fea9fe/", "169.254.169.254"),
        ("http://0251.0376.0251.0376/", "169.254.169.254"),
        ("http://169.254.43518/", "169.254.169.254"),
        ("http://2852039166/", "169.254.169.254"),
        ("http://[::ffff:a9fe:a9fe]/", "::ffff:a9fe:a9fe"),
        ("http://[64:ff9b::a9fe:a9fe]/", "64:ff9b::a9fe:a9fe"),
        ("http://0x0a.1/", "10.0.0.1"),
        ("http://127.1/", "127.0.0.1 is a loopback address"),
        ("http://[fd00::1]/", "fd00::1"),
        ("http://internal.example.com/", "internal.example.com resolves only to 10.0.0.1, a private address"),
        ("https://evil.example/", 'add "- host: evil.example"'),
        ("http://evil.example/", 'add "- evil.example:80"'),
        ("file:///etc/passwd", "not an http(s) URL"),
        ("gopher://api.example.com/", "not an http(s) URL"),
    ],
)
def test_redirects_into_forbidden_places(ns: TestNetns, pki: TestPki, location: str, words: str) -> None:
    async def body(w: World) -> None:
        w.web.routes["/go"] = redirect(location)
        with pytest.raises(FetchRefused) as caught:
            await w.get("https://api.example.com/go", plain_http=True)
        assert words in caught.value.reason
        first, second = caught.value.hops
        assert (first.verdict, first.status, first.address) == ("allow", 302, PUBLIC)
        assert (second.verdict, second.status, second.address) == ("deny", None, None)
        assert w.untouched()

    in_world(ns, pki, body)


def test_redirect_followed_and_each_hop_checked(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        w.web.routes["/a"] = redirect("https://www.example.com/b", 301)
        w.web.routes["/b"] = redirect("/c", 307)
        w.web.routes["/c"] = Reply(body=b"done")
        result = await w.get(
            "https://api.example.com/a", headers={"Authorization": "Bearer t", "Cookie": "c=1"}
        )
        assert (result.status, result.body, result.url) == (200, b"done", "https://www.example.com/c")
        assert [(h.host, h.status, h.rule) for h in result.hops] == [
            ("api.example.com", 301, "network.allow[0] (api.example.com)"),
            ("www.example.com", 307, "network.allow[2] (www.example.com)"),
            ("www.example.com", 200, "network.allow[2] (www.example.com)"),
        ]
        first, *later = w.web.seen
        assert first.headers["authorization"] == "Bearer t" and first.headers["cookie"] == "c=1"
        assert all("authorization" not in s.headers and "cookie" not in s.headers for s in later)
        assert w.dns.count("api.example.com") == 1 and w.dns.count("www.example.com") == 2

    in_world(ns, pki, body)


def test_rebinding_between_hops_is_caught(ns: TestNetns, pki: TestPki) -> None:
    """One lookup per hop, the connection to the address it gave; a later hop checks again."""

    async def body(w: World) -> None:
        w.web.routes["/"] = redirect("/next")
        w.dns.after_query = lambda name, rdtype: w.dns.records.update({"rebind.example.com": [PRIVATE]})
        with pytest.raises(FetchRefused) as caught:
            await w.get("http://rebind.example.com/", plain_http=True)
        first, second = caught.value.hops
        assert (first.address, first.status) == (PUBLIC, 302)
        assert second.reason.startswith("rebind.example.com resolves only to 10.0.0.1, a private address")
        assert [s.local for s in w.web.seen] == [PUBLIC]
        assert w.dns.count("rebind.example.com") == 2  # one per hop, none in between
        assert w.untouched()

    in_world(ns, pki, body)


def test_post_redirects(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        w.web.routes["/p302"] = redirect("/landing", 302)
        w.web.routes["/p303"] = redirect("/landing", 303)
        w.web.routes["/landing"] = lambda seen: Reply(body=f"{seen.method} {len(seen.body)}".encode())
        kept = await w.get("https://api.example.com/p302", method="POST", body=b"data")
        assert kept.status == 302 and len(kept.hops) == 1 and kept.body == b"moved"
        turned = await w.get("https://api.example.com/p303", method="post", body=b"data")
        assert (turned.status, turned.body) == (200, b"GET 0")
        assert [h.method for h in turned.hops] == ["POST", "GET"]
        assert w.web.seen[0].body == b"data" and w.web.seen[1].headers["content-length"] == "4"

    in_world(ns, pki, body)


def test_head(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        result = await w.get("https://api.example.com/", method="HEAD")
        assert (result.status, result.body) == (200, b"")
        assert w.web.seen[0].method == "HEAD"

    in_world(ns, pki, body)


def test_certificate_for_another_name(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchFailed) as caught:
            await w.get("https://wrong.example.com/")
        assert "wrong.example.com" in caught.value.reason and "did not verify" in caught.value.reason
        (hop,) = caught.value.hops
        assert (hop.verdict, hop.status, hop.address) == ("allow", None, PUBLIC)
        assert w.web.seen == []

    in_world(ns, pki, body)


def test_certificate_from_an_untrusted_ca(ns: TestNetns, pki: TestPki, tmp_path: Path) -> None:
    stranger = TestPki(tmp_path)

    async def body(w: World) -> None:
        with pytest.raises(FetchFailed, match="did not verify"):
            await w.get("https://api.example.com/", tls=upstream_tls_context(stranger.ca_file))
        assert w.web.seen == []

    in_world(ns, pki, body)


def test_size_limit_truncates(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        w.web.routes["/big"] = Reply(body=b"x" * 200_000)
        result = await w.get("https://api.example.com/big", limits=FetchLimits(max_bytes=1000))
        assert result.truncated and result.body == b"x" * 1000
        exact = await w.get("https://api.example.com/", limits=FetchLimits(max_bytes=5))
        assert not exact.truncated and exact.body == b"hello"

    in_world(ns, pki, body)


def test_time_limit(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        w.web.routes["/hang"] = Reply(body=b"partial", hang=True)
        with pytest.raises(FetchFailed) as caught:
            await w.get("https://api.example.com/hang", limits=FetchLimits(timeout=0.3))
        assert "did not finish within 0.3 s" in caught.value.reason
        (hop,) = caught.value.hops
        assert hop.address == PUBLIC and hop.status is None and "time limit" in hop.reason

    in_world(ns, pki, body)


def test_too_many_redirects(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        w.web.routes["/loop"] = redirect("/loop")
        with pytest.raises(FetchFailed) as caught:
            await w.get("https://api.example.com/loop", limits=FetchLimits(max_redirects=2))
        assert "more than 2 times" in caught.value.reason
        assert len(caught.value.hops) == 3

    in_world(ns, pki, body)


@pytest.mark.parametrize(
    ("method", "url", "allowed"),
    [
        ("GET", "https://git.example.com/v1/repos", True),
        ("POST", "https://git.example.com/v1/repos", False),
        ("GET", "https://git.example.com/admin", False),
        ("GET", "https://git.example.com/v1/../admin", False),
        ("GET", "https://git.example.com/v1/%2e%2e/admin", False),
        ("GET", "https://git.example.com/v1/%252e%252e/admin", False),
    ],
)
def test_methods_and_paths(ns: TestNetns, pki: TestPki, method: str, url: str, allowed: bool) -> None:
    async def body(w: World) -> None:
        w.web.routes["/v1/repos"] = Reply(body=b"repos")
        if allowed:
            assert (await w.get(url, method=method)).body == b"repos"
            return
        with pytest.raises(FetchRefused) as caught:
            await w.get(url, method=method)
        assert caught.value.rule == "network.allow[6] (git.example.com)"
        assert w.web.connections == 0

    in_world(ns, pki, body)


def test_address_rules_reach_addresses_in_every_spelling(ns: TestNetns, pki: TestPki) -> None:
    """A policy that names 10.0.0.0/8 reaches 10.0.0.1 however it is written, and only there."""

    async def body(w: World) -> None:
        for url in ("http://10.0.0.1/", "http://0xa000001/", "http://10.1/", "http://012.0.0.01/"):
            result = await w.get(url, plain_http=True)
            assert result.body == b"private" and result.hops[0].address == PRIVATE
            assert w.private.seen[-1].headers["host"] == PRIVATE  # asked for by its normal form
        assert {s.local for s in w.private.seen} == {PRIVATE}
        result = await w.get(f"http://[{PUBLIC6}]/", plain_http=True)
        assert result.hops[0].address == PUBLIC6 and w.private.seen[-1].headers["host"] == f"[{PUBLIC6}]"
        assert not w.canaries.hits and w.other.connections == 0

    in_world(ns, pki, body, allow=ALLOW + "    - {host: 10.0.0.0/8, ports: [80]}\n")


def test_unresolvable_name_fails_without_a_refusal(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        del w.dns.records["api.example.com"]
        with pytest.raises(FetchFailed, match="does not exist") as caught:
            await w.get("https://api.example.com/")
        assert [hop.verdict for hop in caught.value.hops] == ["allow"]
        assert w.web.connections == 0

    in_world(ns, pki, body)


@pytest.mark.parametrize(
    "url",
    ["https://user:pw@api.example.com/", "https:///x", "https://api.example.com:99999/", "https://a b/"],
)
def test_malformed_urls(ns: TestNetns, pki: TestPki, url: str) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchFailed) as caught:
            await w.get(url)
        assert caught.value.hops == ()
        assert w.web.connections == 0

    in_world(ns, pki, body)


def test_server_down(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchFailed, match="could not connect") as caught:
            await w.get("https://www.example.com:8443/")
        assert caught.value.hops[0].verdict == "allow"

    in_world(ns, pki, body, allow=ALLOW + "    - www.example.com:8443\n")


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({"X-A": "1\r\nX-Injected: 1"}, "line break"),
        ({"Bad Name": "1"}, "not valid"),
        ({"X-A": "\u2603"}, "Latin-1"),
    ],
)
def test_bad_headers(ns: TestNetns, pki: TestPki, headers: dict[str, str], words: str) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchFailed, match=words):
            await w.get("https://api.example.com/", headers=headers)
        assert w.web.connections == 0

    in_world(ns, pki, body)


def test_port_zero_and_international_names(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchRefused, match="port 0 is not a TCP port"):
            await w.get("https://api.example.com:0/")
        with pytest.raises(FetchRefused) as caught:
            await w.get("https://Bücher.example/")
        assert 'add "- host: xn--bcher-kva.example"' in caught.value.reason
        assert w.untouched() and w.web.connections == 0

    in_world(ns, pki, body)


# ------------------------------------------------------------------ open_upstream


def test_upstream_tls_to_an_address_checks_its_ip_san(ns: TestNetns, pki: TestPki) -> None:
    async def main() -> tuple[bytes, str]:
        server = await HttpServer({"/": Reply(body=b"by address")}, tls=pki.server_context([PUBLIC])).listen(
            PUBLIC, 443
        )
        try:
            tls = upstream_tls_context(pki.ca_file)
            reader, writer = await open_upstream(
                Destination(PUBLIC, 443, ipaddress.ip_address(PUBLIC)), tls=tls, timeout=5
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: 93.184.216.34\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            with pytest.raises(UpstreamError) as caught:
                await open_upstream(
                    Destination("api.example.com", 443, ipaddress.ip_address(PUBLIC)), tls=tls, timeout=5
                )
            assert caught.value.verify
            return answer, str(caught.value)
        finally:
            await server.close()

    with ns.entered():
        answer, message = asyncio.run(main())
    assert answer.endswith(b"by address")
    assert message.startswith("the TLS certificate of 93.184.216.34:443 (api.example.com) did not verify")


def test_upstream_unreachable(ns: TestNetns) -> None:
    async def main() -> str:
        # Inside the namespace, which has no route but to its own lo.
        with pytest.raises(UpstreamError) as caught:
            await open_upstream(
                Destination("x.example", 443, ipaddress.ip_address("198.51.100.7")), tls=None, timeout=5
            )
        return str(caught.value)

    with ns.entered():
        message = asyncio.run(main())
    assert message.startswith("could not connect to 198.51.100.7:443 (x.example)")


def test_upstream_ca_file_must_load(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="could not be loaded"):
        upstream_tls_context(str(tmp_path / "junk.pem"))
    with pytest.raises(ValueError, match="could not be loaded"):
        upstream_tls_context(str(tmp_path / "missing.pem"))


def test_upstream_context_is_made_once_per_set_of_roots(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = TestPki(tmp_path / "a", name="stockade test CA one")
    second = TestPki(tmp_path / "b", name="stockade test CA two")

    def names(context: ssl.SSLContext) -> set[str]:
        return {str(dict(part[0] for part in c["subject"]).get("commonName")) for c in context.get_ca_certs()}

    shared = upstream_tls_context(first.ca_file)
    assert upstream_tls_context(first.ca_file) is shared
    assert upstream_tls_context(None) is not shared
    assert "stockade test CA one" in names(shared)
    # The same path holding another CA (a rotated file): a context that trusts it, not the old one.
    Path(first.ca_file).write_bytes(second.ca_pem + b"\n")
    rotated = upstream_tls_context(first.ca_file)
    assert rotated is not shared
    assert "stockade test CA two" in names(rotated)
    assert "stockade test CA one" not in names(rotated)


def test_upstream_sends_the_requested_name_as_sni(ns: TestNetns, pki: TestPki) -> None:
    names: list[str | None] = []

    async def main() -> None:
        context = pki.server_context(["api.example.com"])
        context.sni_callback = lambda sock, name, ctx: names.append(name)
        server = await HttpServer(tls=context).listen(PUBLIC, 443)
        try:
            dest = Destination("api.example.com", 443, ipaddress.ip_address(PUBLIC))
            _reader, writer = await open_upstream(dest, tls=upstream_tls_context(pki.ca_file), timeout=5)
            writer.close()
        finally:
            await server.close()

    with ns.entered():
        asyncio.run(main())
    assert names == ["api.example.com"]


# --------------------------------------------------------------------------- secrets (issue 11)

KEY = "sk-live-0123456789abcdef"


def _secrets() -> Secrets:
    return Secrets.load([SecretPolicy("API_KEY", env="K", hosts=("api.example.com",))], {"K": KEY})


def test_fetch_puts_a_secret_in_place_and_hides_it_in_answers(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        secrets = _secrets()
        placeholder = secrets.env()["API_KEY"]
        auth = {"Authorization": f"Bearer {placeholder}"}
        w.web.routes["/b64"] = lambda seen: Reply(
            body=base64.b64encode(seen.headers["authorization"].encode())
        )
        w.web.routes["/gz"] = lambda seen: Reply(
            headers=[("Content-Encoding", "gzip")], body=gzip.compress(seen.headers["authorization"].encode())
        )
        w.web.routes["/bounce"] = lambda seen: Reply(
            302, headers=[("Location", f"https://www.example.com/?t={seen.headers['authorization'][7:]}")]
        )
        encoded = await w.get("https://api.example.com/b64", headers=auth, secrets=secrets)
        zipped = await w.get("https://api.example.com/gz", headers=auth, secrets=secrets)
        # The value echoed in a Location becomes the placeholder, which then may not
        # follow the redirect to a host it is not for.
        with pytest.raises(FetchRefused) as bounced:
            await w.get("https://api.example.com/bounce", headers=auth, secrets=secrets)
        assert "not meant for www.example.com" in bounced.value.reason
        assert [s.headers["authorization"] for s in w.web.seen] == [f"Bearer {KEY}"] * 3
        assert w.web.seen[0].headers["accept-encoding"] == "identity"
        for result in (encoded, zipped):
            assert not recoverable(result.body + repr(result.headers).encode() + result.url.encode())
        # What could be cut out came back with the placeholder in place of the value.
        assert zipped.body == f"Bearer {placeholder}".encode()
        assert not any(k.lower() == "content-encoding" for k, _ in zipped.headers)
        for hop in (*encoded.hops, *zipped.hops, *bounced.value.hops):
            assert KEY not in hop.url + hop.reason and placeholder not in hop.url + hop.reason

    in_world(ns, pki, body)


def test_fetch_refuses_a_value_or_a_misplaced_placeholder(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        secrets = _secrets()
        placeholder = secrets.env()["API_KEY"]
        attempts = [
            ("https://www.example.com/?k=" + base64.b64encode(KEY.encode()).decode(), {}, b"", "value"),
            ("https://www.example.com/", {"X-Data": KEY.encode().hex()}, b"", "value"),
            ("https://www.example.com/", {"Authorization": f"Bearer {placeholder}"}, b"", "not meant"),
            ("https://api.example.com/", {}, placeholder.encode(), "in its body"),
            ("https://api.example.com/?k=" + placeholder, {}, b"", "in its URL"),
            ("https://api.example.com/", {"X-Other": placeholder}, b"", "in its header"),
        ]
        for url, headers, data, why in attempts:
            with pytest.raises(FetchRefused) as caught:
                await w.get(url, method="POST", headers=headers, body=data, secrets=secrets)
            assert "API_KEY" in caught.value.reason and why in caught.value.reason, caught.value.reason
            assert not recoverable(caught.value.reason.encode())
            (hop,) = caught.value.hops
            assert hop.verdict == "deny" and not recoverable((hop.url + hop.reason).encode())
            assert placeholder not in hop.url
        assert w.web.seen == []
        # Control: the placeholder in Authorization to its host goes, as the value.
        ok = await w.get("https://api.example.com/", headers={"Authorization": placeholder}, secrets=secrets)
        assert ok.status == 200 and w.web.seen[0].headers["authorization"] == KEY

    in_world(ns, pki, body)


def test_fetch_keeps_an_address_rules_methods_and_paths(ns: TestNetns, pki: TestPki) -> None:
    async def body(w: World) -> None:
        with pytest.raises(FetchRefused) as caught:
            await w.get("http://internal.example.com/admin/", method="POST", plain_http=True)
        assert f"internal.example.com resolves to {PRIVATE}" in caught.value.reason
        assert caught.value.rule is not None and PRIVATE in caught.value.rule
        assert w.private.connections == 0
        mirror = await w.get("http://internal.example.com/mirror/", plain_http=True)
        assert mirror.status == 404 and w.private.seen[0].target == "/mirror/"

    bound = ALLOW + f"    - {{host: {PRIVATE}, ports: [80], methods: [GET], paths: [/mirror/]}}\n"
    in_world(ns, pki, body, allow=bound)
