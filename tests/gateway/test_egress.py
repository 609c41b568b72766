"""Egress: network.allow decides, the destination check picks the address, nothing looks it up twice."""

from __future__ import annotations

import asyncio
import ipaddress
import posixpath
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.gateway._egress import Destination, Egress, EgressRefused
from stockade.gateway._resolve import DnsResolver, ResolveError
from stockade.gateway._upstream import open_upstream
from stockade.policy import loads_policy
from tests._netns import TestNetns
from tests.gateway._dns import TestDns
from tests.gateway._servers import Canary, HttpServer, Reply

T = TypeVar("T")


class _NoResolver:
    async def resolve(self, name: str) -> list[object]:
        raise AssertionError(f"decide() must not resolve ({name})")


def egress(allow: str, **kwargs: object) -> Egress:
    policy = loads_policy(f"name: t\nnetwork:\n  allow:\n{allow}")
    return Egress(policy.network, resolver=kwargs.pop("resolver", _NoResolver()), **kwargs)  # type: ignore[arg-type]


RULES = """\
    - api.example.com
    - "*.one.example"
    - "**.many.example"
    - "*.ports.example:8443"
    - 93.184.216.34
    - 10.0.0.0/8
    - "[2606:4700::1111]"
    - host: git.example
      methods: [GET, HEAD]
      paths: [/repos/, /v1]
    - host: git.example
      methods: [POST]
      paths: [/upload/]
"""


@pytest.mark.parametrize(
    ("host", "port", "method", "path", "rule"),
    [
        ("api.example.com", 443, None, None, 0),
        ("API.Example.COM.", 443, None, None, 0),
        ("x.api.example.com", 443, None, None, None),
        ("example.com", 443, None, None, None),
        ("api.example.com", 80, None, None, None),
        ("a.one.example", 443, None, None, 1),
        ("one.example", 443, None, None, None),
        ("a.b.one.example", 443, None, None, None),
        ("a.many.example", 443, None, None, 2),
        ("a.b.c.many.example", 443, None, None, 2),
        ("many.example", 443, None, None, None),
        ("x.ports.example", 8443, None, None, 3),
        ("x.ports.example", 443, None, None, None),
        # The address rule, in every spelling of the address.
        ("93.184.216.34", 443, None, None, 4),
        ("1572395042", 443, None, None, 4),
        ("0x5db8d822", 443, None, None, 4),
        ("0135.0270.0330.042", 443, None, None, 4),
        ("93.184.55330", 443, None, None, 4),
        ("[::ffff:93.184.216.34]", 443, None, None, 4),
        ("[::ffff:5db8:d822]", 443, None, None, 4),
        ("93.184.216.35", 443, None, None, None),
        ("10.1", 443, None, None, 5),
        ("0xa000001", 443, None, None, 5),
        ("[2606:4700::1111]", 443, None, None, 6),
        ("2606:4700:0:0:0:0:0:1111", 443, None, None, 6),
        # Names never match address rules, addresses never name rules.
        ("www.example.net", 443, None, None, None),
        # Methods and paths.
        ("git.example", 443, None, None, 7),
        ("git.example", 443, "get", "/repos/x", 7),
        ("git.example", 443, "GET", "/repos/x?q=../../", 7),
        ("git.example", 443, "GET", "/rep%6fs/x", 7),
        ("git.example", 443, "HEAD", "/v1", 7),
        ("git.example", 443, "GET", "/v1/models", 7),
        ("git.example", 443, "GET", "/v1x", None),
        ("git.example", 443, "GET", "/repos", None),
        ("git.example", 443, "GET", "/admin", None),
        ("git.example", 443, "DELETE", "/repos/x", None),
        ("git.example", 443, "POST", "/upload/a", 8),
        ("git.example", 443, "POST", "/repos/x", None),
        ("git.example", 443, "GET", "/repos/../admin", None),
        ("git.example", 443, "GET", "/repos/%2e%2e/admin", None),
        ("git.example", 443, "GET", "/repos/%2E%2e/admin", None),
        ("git.example", 443, "GET", "/repos/%252e%252e/admin", None),
        ("git.example", 443, "GET", "/repos/..;/admin", None),
        ("git.example", 443, "GET", "/repos/..%2fadmin", None),
        ("git.example", 443, "GET", "/repos\\..\\admin", None),
        ("git.example", 443, "GET", "/repos/./x", None),
        ("git.example", 443, "GET", "/repos/x/..%00/", None),
        ("git.example", 443, "GET", "/repos/x%0d%0aX:1", None),
        ("git.example", 443, "GET", "/repos/...", 7),
        ("git.example", 443, "GET", "/repos/a%2Fb", 7),
        ("git.example", 443, "GET", "/repos/a b", None),
        ("git.example", 443, "GET", "*", None),
    ],
)
def test_allow_matrix(host: str, port: int, method: str | None, path: str | None, rule: int | None) -> None:
    decision = egress(RULES).decide(host, port, method=method, path=path)
    if rule is None:
        assert decision.verdict == "deny", decision
        assert not decision.inspect
    else:
        assert decision.verdict == "allow", decision.reason
        assert decision.rule is not None and decision.rule.startswith(f"network.allow[{rule}] (")
        assert decision.reason == f"allowed by {decision.rule}"


def test_rule_names_and_the_rule_to_add() -> None:
    e = egress(RULES)
    assert e.decide("api.example.com", 443).rule == "network.allow[0] (api.example.com)"
    denied = e.decide("evil.example", 443)
    assert denied.rule is None
    assert denied.reason == (
        'no network.allow rule matches evil.example:443; add "- host: evil.example" to network.allow'
    )
    assert 'add "- evil.example:8443"' in e.decide("evil.example", 8443).reason
    assert 'add "- host: 93.184.216.35"' in e.decide("93.184.216.35", 443).reason
    assert "[2001:4860::1]:443" in e.decide("2001:4860::1", 443).reason


def test_near_misses_name_the_rule_and_the_change() -> None:
    e = egress(RULES)
    port = e.decide("x.ports.example", 443)
    assert port.rule == "network.allow[3] (*.ports.example)"
    assert "allows x.ports.example on port 8443 only, not 443; add 443 to its ports" in port.reason
    method = e.decide("git.example", 443, method="DELETE", path="/repos/x")
    assert method.rule == "network.allow[7] (git.example)"
    assert "allows methods GET, HEAD only; add DELETE to its methods" in method.reason
    path = e.decide("git.example", 443, method="GET", path="/admin/x")
    assert "allows paths under /repos/, /v1 only; add a prefix of /admin/x to its paths" in path.reason
    dots = e.decide("git.example", 443, method="GET", path="/repos/%2e%2e/admin")
    assert "'..' segments" in dots.reason


def test_first_matching_rule_wins() -> None:
    e = egress("    - {host: api.example.com, methods: [GET]}\n    - api.example.com\n")
    assert (
        e.decide("api.example.com", 443, method="GET", path="/").rule == "network.allow[0] (api.example.com)"
    )
    assert (
        e.decide("api.example.com", 443, method="PUT", path="/").rule == "network.allow[1] (api.example.com)"
    )
    e = egress("    - api.example.com\n    - {host: api.example.com, methods: [GET]}\n")
    assert (
        e.decide("api.example.com", 443, method="GET", path="/").rule == "network.allow[0] (api.example.com)"
    )


def test_inspect_when_the_rule_limits_methods_or_a_secret_wants_the_host() -> None:
    e = egress(RULES, inspect_hosts=lambda h: h == "api.example.com")
    assert e.decide("git.example", 443).inspect
    assert e.decide("api.example.com", 443).inspect
    assert not e.decide("a.one.example", 443).inspect


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("127.1", "none may: 127.0.0.1 is a loopback address"),
        ("0xa9fea9fe", "none may: 169.254.169.254 is the cloud metadata address"),
        ("[::1]", "none may"),
        ("1.2.3.256", "is not a valid IP address"),
        ("08.0.0.1", "is not a valid IP address"),
        # Full-width digits and ideographic dots become 127.0.0.1 under IDNA: never a name.
        ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "is not a valid IP address"),
        ("127\u30020\u30020\u30021", "is not a valid IP address"),
        ("exa mple.com", "is not a valid host name"),
        ("localhost", "none may: 'localhost' names this machine"),
        ("a_b.example", "none may: 'a_b.example' is not a valid host name"),
        ("", "is not a valid host name"),
    ],
)
def test_refused_hosts(host: str, words: str) -> None:
    decision = egress(RULES).decide(host, 443)
    assert decision.verdict == "deny"
    assert words in decision.reason


def test_bad_port() -> None:
    assert egress(RULES).decide("api.example.com", 0).verdict == "deny"


# ------------------------------------------------------------------ destination

NS_ADDRESSES = ["93.184.216.34", "10.0.0.1"]


@pytest.fixture(scope="module")
def ns() -> Iterator[TestNetns]:
    with TestNetns(NS_ADDRESSES) as namespace:
        yield namespace


def with_dns(ns: TestNetns, allow: str, body: Callable[[Egress, TestDns], Awaitable[T]]) -> T:
    async def main() -> T:
        dns = await TestDns().start()
        try:
            return await body(egress(allow, resolver=DnsResolver(dns.spec)), dns)
        finally:
            await dns.close()

    with ns.entered():
        return asyncio.run(main())


def destination(
    ns: TestNetns, allow: str, records: dict[str, list[str]], host: str, port: int = 443
) -> Destination:
    async def body(e: Egress, dns: TestDns) -> Destination:
        dns.records.update(records)
        return await e.destination(host, port)

    return with_dns(ns, allow, body)


def refused(ns: TestNetns, allow: str, records: dict[str, list[str]], host: str, port: int = 443) -> str:
    with pytest.raises(EgressRefused) as caught:
        destination(ns, allow, records, host, port)
    return caught.value.reason


NAMES = "    - api.example.com\n"


def test_public_name(ns: TestNetns) -> None:
    dest = destination(ns, RULES, {"api.example.com": ["93.184.216.34"]}, "API.example.com.")
    assert dest == Destination("api.example.com", 443, ipaddress.ip_address("93.184.216.34"))


def test_private_answer_refused(ns: TestNetns) -> None:
    reason = refused(ns, NAMES, {"internal.example": ["10.0.0.5"]}, "internal.example")
    assert reason == (
        "internal.example resolves only to 10.0.0.5, a private address; the gateway connects there only "
        'when network.allow names the address; if that is meant, add "- host: 10.0.0.5"'
    )


def test_private_answer_allowed_by_an_address_rule_with_the_port(ns: TestNetns) -> None:
    allow = "    - internal.example\n    - {host: 10.0.0.0/8, ports: [443]}\n"
    dest = destination(ns, allow, {"internal.example": ["10.0.0.5"]}, "internal.example")
    assert str(dest.address) == "10.0.0.5"
    assert "private" in refused(ns, allow, {"internal.example": ["10.0.0.5"]}, "internal.example", 8443)


def test_metadata_answer_never(ns: TestNetns) -> None:
    reason = refused(ns, RULES, {"meta.example": ["169.254.169.254", "fd00:ec2::254"]}, "meta.example")
    assert (
        "169.254.169.254, the cloud metadata address and fd00:ec2::254, the cloud metadata address" in reason
    )
    assert reason.endswith("the gateway never connects there")


def test_mixed_answer_picks_the_public_address(ns: TestNetns) -> None:
    dest = destination(ns, NAMES, {"mixed.example": ["10.0.0.5", "93.184.216.34"]}, "mixed.example")
    assert str(dest.address) == "93.184.216.34"


def test_mapped_answers(ns: TestNetns) -> None:
    # A mapped answer is the IPv4 host itself: checked (and connected to) as IPv4.
    reason = refused(ns, NAMES, {"m.example": ["::ffff:10.0.0.5"]}, "m.example")
    assert reason.startswith("m.example resolves only to 10.0.0.5, a private address")
    dest = destination(ns, RULES, {"m.example": ["::ffff:93.184.216.34"]}, "m.example")
    assert dest.address.version == 4 and str(dest.address) == "93.184.216.34"


@pytest.mark.parametrize("host", ["0x7f.1", "[::ffff:127.0.0.1]", "2852039166", "[64:ff9b::a9fe:a9fe]", "0"])
def test_literals_checked_without_dns(ns: TestNetns, host: str) -> None:
    async def body(e: Egress, dns: TestDns) -> tuple[str, int]:
        with pytest.raises(EgressRefused) as caught:
            await e.destination(host, 443)
        return caught.value.reason, len(dns.queries)

    reason, queries = with_dns(ns, RULES, body)
    assert queries == 0
    assert " is " in reason


def test_literal_in_an_allowed_range(ns: TestNetns) -> None:
    dest = destination(ns, RULES, {}, "0xa000001")
    assert (dest.host, str(dest.address)) == ("10.0.0.1", "10.0.0.1")


def test_unresolvable_name_is_a_failure_not_a_refusal(ns: TestNetns) -> None:
    with pytest.raises(ResolveError, match="does not exist"):
        destination(ns, RULES, {}, "nowhere.example")


def test_international_name_resolved_as_its_a_label(ns: TestNetns) -> None:
    async def body(e: Egress, dns: TestDns) -> tuple[Destination, list[str]]:
        dns.records["xn--bcher-kva.example"] = ["93.184.216.34"]
        dest = await e.destination("Bücher.example", 443)
        return dest, [n for n, _, _ in dns.queries]

    dest, names = with_dns(ns, RULES, body)
    assert dest.host == "xn--bcher-kva.example"
    assert set(names) == {"xn--bcher-kva.example"}


# ------------------------------------------------------------------ rebinding


def test_rebinding_connects_to_the_checked_address(ns: TestNetns) -> None:
    """The name turns private after the check: the connection still goes where the check said."""

    async def body(e: Egress, dns: TestDns) -> tuple[str, list[str], int, int]:
        server = await HttpServer({"/": Reply(body=b"public")}).listen("93.184.216.34", 80)
        canary = await Canary().listen("10.0.0.1", 80)
        dns.records["rebind.example"] = ["93.184.216.34"]

        def rebind(name: str, rdtype: str) -> None:
            dns.records["rebind.example"] = ["10.0.0.1"]

        dns.after_query = rebind
        try:
            dest = await e.destination("rebind.example", 80)
            reader, writer = await open_upstream(dest, tls=None, timeout=5)
            writer.write(b"GET / HTTP/1.1\r\nHost: rebind.example\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            return answer.decode(), canary.hits, dns.count("rebind.example"), len(server.seen)
        finally:
            await server.close()
            await canary.close()

    answer, hits, lookups, served = with_dns(ns, "    - rebind.example:80\n", body)
    assert answer.endswith("public")
    assert served == 1
    assert hits == []
    assert lookups == 1  # one A query: no second lookup before connecting


def test_rebinding_the_other_way_is_refused_before_connecting(ns: TestNetns) -> None:
    async def body(e: Egress, dns: TestDns) -> tuple[str, list[str], int]:
        server = await HttpServer().listen("93.184.216.34", 80)
        canary = await Canary().listen("10.0.0.1", 80)
        dns.records["rebind.example"] = ["10.0.0.1"]
        dns.after_query = lambda name, rdtype: dns.records.update({name: ["93.184.216.34"]})
        try:
            with pytest.raises(EgressRefused) as caught:
                await e.destination("rebind.example", 80)
            return caught.value.reason, canary.hits, server.connections
        finally:
            await server.close()
            await canary.close()

    reason, hits, connections = with_dns(ns, "    - rebind.example:80\n", body)
    assert reason.startswith("rebind.example resolves only to 10.0.0.1, a private address")
    assert hits == [] and connections == 0


# ------------------------------------------------------------------ paths, by Hypothesis

_PIECES = [
    "repos",
    "x",
    "..",
    ".",
    "%2e",
    "%2E%2e",
    "%252e%252e",
    "%2f",
    "%2F",
    "%5c",
    "\\",
    ";",
    "..;",
    "/",
    "%00",
]


def _resolved(path: str) -> str:
    """Where a lenient server could end up.

    Decoded until stable, '\\' read as '/', ';params' cut, dot segments resolved.
    """
    for _ in range(6):
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            break
        path = decoded
    segments = [s.split(";", 1)[0] for s in path.replace("\\", "/").split("/")]
    return "/" + posixpath.normpath("/".join(segments)).lstrip("/")


@given(st.lists(st.sampled_from(_PIECES), max_size=8))
def test_an_allowed_path_stays_under_its_prefix(pieces: list[str]) -> None:
    path = "/repos/" + "".join(pieces)
    decision = _PATH_EGRESS.decide("git.example", 443, method="GET", path=path)
    if decision.verdict == "allow":
        assert _resolved(path) == "/repos" or _resolved(path).startswith("/repos/"), path


_PATH_EGRESS = egress("    - {host: git.example, paths: [/repos/]}\n")


BOUND_RULES = """\
    - "**.example.com:80"
    - {host: 10.1.2.3, ports: [80], methods: [GET], paths: [/mirror/]}
    - {host: 10.9.0.0/16, ports: [80], methods: [GET]}
    - {host: 10.9.9.9, ports: [80]}
"""


@pytest.mark.parametrize(
    ("address", "method", "path", "refused"),
    [
        ("10.1.2.3", "GET", "/mirror/x", False),
        ("10.1.2.3", "POST", "/mirror/x", True),  # the repro: methods bind through the name
        ("10.1.2.3", "GET", "/admin/", True),
        ("10.1.2.3", "GET", "/mirror/%2e%2e/admin", True),  # dot tricks count as at the address rule
        ("10.9.1.1", "GET", "/anything", False),
        ("10.9.1.1", "DELETE", "/anything", True),
        ("10.9.9.9", "DELETE", "/anything", False),  # an unlimited rule also names it: it allows
        ("93.184.216.34", "POST", "/admin/", False),  # no address rule names it: the name rule decides
    ],
)
def test_address_rules_bind_a_request_a_name_rule_let_through(
    address: str, method: str, path: str, refused: bool
) -> None:
    rules = egress(BOUND_RULES)
    decided = rules.decide_address(
        "mirror.example.com", ipaddress.ip_address(address), 80, method=method, path=path
    )
    assert (decided is not None) is refused
    if decided is not None:
        assert (
            decided.verdict == "deny"
            and decided.rule is not None
            and decided.rule.startswith("network.allow[")
        )
        assert decided.reason.startswith(f"mirror.example.com resolves to {address}, and ")
    # A CONNECT there must be opened exactly when every rule naming the address limits it.
    limited = {"10.1.2.3": True, "10.9.1.1": True, "10.9.9.9": False, "93.184.216.34": False}[address]
    assert rules.address_limits(ipaddress.ip_address(address), 80) is limited
