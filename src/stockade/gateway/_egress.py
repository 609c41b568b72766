"""Whether the gateway lets a request out, and where exactly it then connects.

Two steps, both needed for every connection the gateway makes:

``Egress.decide``
    The policy question, on what the client asked for: does a ``network.allow``
    rule name this host and port (and, once known, this method and path)? The
    first rule that matches all of them wins. Pure, no I/O.
``Egress.destination``
    The address question: resolve the name once, drop the addresses the
    gateway never connects to on its own (private, loopback, metadata…; see
    ``forbidden_reason``) unless an address rule names them, and hand back the
    one address to connect to. The caller connects to exactly that address (no
    second lookup), so a DNS answer that changes in between cannot move the
    connection somewhere that was not checked.

Patterns are matched by ``stockade.policy._match`` (the same code that
validates them when the policy loads), never re-implemented here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal
from urllib.parse import unquote

from stockade.gateway._addresses import IPAddress, IPv6Address, forbidden_reason, parse_ip_literal
from stockade.gateway._resolve import Resolver
from stockade.policy._match import host_rule_matches, normalize_host_pattern, pattern_kind
from stockade.policy._model import HostRule, NetworkPolicy

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
# A last label like these makes resolvers and URL parsers read the whole host as
# an IPv4 address; one that does not parse as one is no name either.
_NUMERIC_LABEL = re.compile(r"^(0[x][0-9a-z]*|[0-9]+)$")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


@dataclass(frozen=True, slots=True)
class EgressDecision:
    """The verdict on one request (or CONNECT) by ``network.allow``."""

    verdict: Literal["allow", "deny"]
    rule: str | None
    """``"network.allow[2] (api.example.com)"``: for an allow the rule that
    matched; for a deny the rule that matched the host but not the port,
    method or path, or ``None`` when no rule named the host."""
    reason: str
    """One sentence; for a deny it names the rule to add or change."""
    inspect: bool
    """TLS must be terminated to enforce or serve this host: the rule limits
    methods or paths, or a secret is meant for the host."""


@dataclass(frozen=True, slots=True)
class Destination:
    """Where to connect, already checked: connect to ``address``, never look ``host`` up again."""

    host: str
    """As requested, normalised: lower case, A-label, a literal unbracketed in its usual form."""
    port: int
    address: IPAddress


class EgressRefused(Exception):
    """The gateway will not connect there; ``reason`` says why in one sentence."""

    def __init__(self, reason: str, *, rule: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rule = rule


@lru_cache(maxsize=65536)
def _matches(rule: HostRule, host: str, port: int) -> bool:
    """``host_rule_matches``, remembered: a proxy asks about the same few hosts all day.

    It parses the host anew on every call (tens of microseconds, times every
    rule of the policy); rules are frozen and hashable, so the answer can be
    kept. Bounded, and keyed by values only, so nothing of one run leaks into
    another's answers.
    """
    return host_rule_matches(rule, host, port)


def rule_name(index: int, rule: HostRule) -> str:
    """How events and messages name a rule: ``network.allow[2] (api.example.com)``."""
    return f"network.allow[{index}] ({rule.host})"


def _host_of(host: str) -> str | IPAddress:
    """``host`` as a normalised name or an address.

    Raises:
        EgressRefused: ``host`` is neither a valid name nor an address.
    """
    literal = parse_ip_literal(host)
    if literal is not None:
        return literal
    name = host.strip().lower()
    if name.endswith("."):
        name = name[:-1]
    if name and not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            name = ""
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise EgressRefused(f"{host!r} is not a valid host name; ask for a name such as 'api.example.com'")
    if _NUMERIC_LABEL.match(labels[-1]):
        raise EgressRefused(
            f"{host!r} is not a valid IP address, nor a host name; write an address as four "
            "decimal numbers, such as '93.184.216.34'"
        )
    return name


def _show_host(host: str | IPAddress) -> str:
    return str(host)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _suggest(host: str, port: int) -> str:
    """The ``network.allow`` entry that would let ``host:port`` through, as YAML."""
    if port == 443:
        return f'"- host: {host}"'
    return f'"- {{host: {host!r}, ports: [{port}]}}"' if ":" in host else f'"- {host}:{port}"'


def _normal_escapes(path: str) -> str:
    """``path`` with escaped unreserved characters decoded and other escapes upper-cased (RFC 3986 6.2.2)."""

    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(fix, path)


def _dot_trick(path: str) -> bool:
    """Whether some server could read a ``.`` or ``..`` segment (or a NUL, a line break) in ``path``.

    Decoded up to three times (double-encoded ``%252e%252e`` exists in the
    wild), split on ``/`` and ``\\`` (some servers treat both as separators),
    with ``;params`` cut off (``..;`` is ``..`` to Tomcat). An encoded control
    character ends a path early for some servers (``/v1/..%00/``), so it is
    refused too.
    """
    text = path
    for _ in range(4):
        if any(c < " " or c == "\x7f" for c in text):
            return True
        for segment in re.split(r"[/\\]", text):
            if segment.split(";", 1)[0] in (".", ".."):
                return True
        decoded = unquote(text, errors="replace")
        if decoded == text:
            return False
        text = decoded
    return True  # still changing after three decodings: nobody writes that by accident


def _normal_path(path: str) -> str | None:
    """The path to compare with a rule's prefixes, or ``None`` if it is refused (dot tricks, junk)."""
    path = path.split("#", 1)[0].split("?", 1)[0]
    if not path.startswith("/") or any(c <= " " or c == "\x7f" for c in path):
        return None
    if _dot_trick(path):
        return None
    return _normal_escapes(path)


def _path_allowed(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``path`` lies under one of ``prefixes``.

    A prefix ending in ``/`` matches what starts with it; ``/v1`` matches
    ``/v1`` and ``/v1/…`` but not ``/v1x`` (a segment boundary, never half a
    name).
    """
    for prefix in prefixes:
        prefix = _normal_escapes(prefix)
        if prefix.endswith("/"):
            if path.startswith(prefix):
                return True
        elif path == prefix or path.startswith(prefix + "/"):
            return True
    return False


class Egress:
    """``network.allow`` applied to requests, with the resolver that checks addresses.

    ``inspect_hosts(host)`` says whether TLS to ``host`` must be terminated for
    another reason (a secret is meant for it).
    """

    def __init__(
        self,
        network: NetworkPolicy,
        *,
        resolver: Resolver,
        inspect_hosts: Callable[[str], bool] = lambda h: False,
    ) -> None:
        self.network = network
        self.resolver = resolver
        self.inspect_hosts = inspect_hosts
        self._by_address: tuple[NetworkPolicy, list[tuple[int, HostRule]]] | None = None

    def decide(
        self, host: str, port: int, *, method: str | None = None, path: str | None = None
    ) -> EgressDecision:
        """The verdict of ``network.allow`` on ``host:port`` (and ``method``, ``path`` once known).

        ``None`` for method and path means not known yet (a CONNECT): host and
        port decide, and ``inspect`` says whether the tunnel's requests must be
        seen. A literal host in any encoding is read as its address first;
        names match name rules only, addresses address rules only.
        """
        try:
            parsed = _host_of(host)
        except EgressRefused as exc:
            return EgressDecision("deny", None, exc.reason, False)
        shown = _show_host(parsed)
        if isinstance(port, bool) or not 1 <= port <= 65535:
            return EgressDecision("deny", None, f"port {port} is not a TCP port; ask for 1 to 65535", False)
        upper = method.upper() if method is not None else None
        normal: str | None = None
        if path is not None:
            normal = _normal_path(path)
        host_only: tuple[int, HostRule] | None = None
        near: tuple[int, HostRule] | None = None
        for index, rule in enumerate(self.network.allow):
            if not _matches(rule, shown, port):
                # Does the host match on one of the rule's own ports? (one is enough to know)
                if host_only is None and port not in rule.ports and _matches(rule, shown, rule.ports[0]):
                    host_only = (index, rule)
                continue
            method_ok = upper is None or not rule.methods or upper in rule.methods
            path_ok = (
                path is None or not rule.paths or (normal is not None and _path_allowed(normal, rule.paths))
            )
            if method_ok and path_ok:
                name = rule_name(index, rule)
                inspect = bool(rule.methods or rule.paths) or self.inspect_hosts(shown)
                return EgressDecision("allow", name, f"allowed by {name}", inspect)
            if near is None:
                near = (index, rule)
        if near is not None:
            return self._near_miss(near, shown, port, upper, path, normal)
        target = _host_port(shown, port)
        if host_only is not None:
            index, rule = host_only
            ports = ", ".join(str(p) for p in rule.ports)
            return EgressDecision(
                "deny",
                rule_name(index, rule),
                f"{rule_name(index, rule)} allows {shown} on port {ports} only, not {port}; "
                f"add {port} to its ports",
                False,
            )
        if isinstance(parsed, str):
            try:
                normalize_host_pattern(shown)
            except ValueError as exc:  # localhost, a name no rule can hold
                return EgressDecision(
                    "deny", None, f"no network.allow rule matches {target}, and none may: {exc}", False
                )
        else:
            why = forbidden_reason(parsed)
            if why is not None and not _may_name(shown):
                return EgressDecision(
                    "deny",
                    None,
                    f"no network.allow rule matches {target}, and none may: {shown} is {why}, "
                    "where the gateway never connects",
                    False,
                )
        return EgressDecision(
            "deny",
            None,
            f"no network.allow rule matches {target}; add {_suggest(shown, port)} to network.allow",
            False,
        )

    def _near_miss(
        self,
        near: tuple[int, HostRule],
        host: str,
        port: int,
        method: str | None,
        path: str | None,
        normal: str | None,
    ) -> EgressDecision:
        index, rule = near
        name = rule_name(index, rule)
        what = f"{method or 'a request'} {path or ''} to {_host_port(host, port)}".replace("  ", " ")
        if method is not None and rule.methods and method not in rule.methods:
            allowed = ", ".join(rule.methods)
            reason = f"{what} is refused: {name} allows methods {allowed} only; add {method} to its methods"
        elif normal is None:
            reason = (
                f"{what} is refused: its path has '.' or '..' segments (perhaps percent-encoded) or "
                f"characters a URL path cannot hold, and {name} limits paths; ask for the plain path"
            )
        else:
            allowed = ", ".join(rule.paths)
            reason = (
                f"{what} is refused: {name} allows paths under {allowed} only; "
                f"add a prefix of {normal} to its paths"
            )
        return EgressDecision("deny", name, reason, False)

    def _address_rules(self, address: IPAddress, port: int) -> list[tuple[int, HostRule]]:
        # The policy's address rules, found once: this runs for every request.
        if self._by_address is None or self._by_address[0] is not self.network:
            rules = [
                (index, rule)
                for index, rule in enumerate(self.network.allow)
                if pattern_kind(rule.host) in ("ip", "cidr")
            ]
            self._by_address = (self.network, rules)
        shown = str(address)
        return [(index, rule) for index, rule in self._by_address[1] if _matches(rule, shown, port)]

    def address_limits(self, address: IPAddress, port: int) -> bool:
        """Whether the address rules that name ``address`` limit methods or paths (then a
        CONNECT there must be inspected, whatever name led to it)."""
        named = self._address_rules(address, port)
        return bool(named) and all(rule.methods or rule.paths for _, rule in named)

    def decide_address(
        self, host: str, address: IPAddress, port: int, *, method: str, path: str
    ) -> EgressDecision | None:
        """The verdict of the address rules that name ``address`` on a request that a
        name rule let through to it; ``None`` when none of them limits it.

        A rule such as ``{host: 10.1.2.3, methods: [GET], paths: [/mirror/]}`` says
        what may reach that address; a name rule (``**.example.com``) whose name
        resolves there does not widen it.
        """
        named = self._address_rules(address, port)
        if not named or any(not (rule.methods or rule.paths) for _, rule in named):
            return None
        upper = method.upper()
        normal = _normal_path(path)
        for _index, rule in named:
            method_ok = not rule.methods or upper in rule.methods
            path_ok = not rule.paths or (normal is not None and _path_allowed(normal, rule.paths))
            if method_ok and path_ok:
                return None
        denied = self._near_miss(named[0], str(address), port, upper, path, normal)
        return EgressDecision(
            "deny",
            denied.rule,
            f"{host} resolves to {address}, and {denied.reason}",
            False,
        )

    def _named_by_rule(self, address: IPAddress, port: int) -> bool:
        """Whether an address or network rule of ``network.allow`` with ``port`` holds ``address``."""
        return any(
            pattern_kind(rule.host) in ("ip", "cidr") and _matches(rule, str(address), port)
            for rule in self.network.allow
        )

    async def destination(self, host: str, port: int) -> Destination:
        """The checked address to connect to for ``host:port``.

        A literal is read as its address; a name is resolved once. The first
        address that is public, or that an address rule of ``network.allow``
        with this port names, is the destination.

        Raises:
            EgressRefused: every address the name has is one the gateway does
                not connect to.
            ResolveError: the name did not resolve (no answer, no such name).
        """
        parsed = _host_of(host)
        shown = _show_host(parsed)
        if isinstance(parsed, str):
            # A name that does not resolve is a failure, not a refusal: it is
            # raised as ResolveError (a 502, not counted toward the tripwire).
            addresses = await self.resolver.resolve(parsed)
        else:
            addresses = [parsed]
        refused: list[tuple[IPAddress, str]] = []
        for address in addresses:
            if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
                address = address.ipv4_mapped  # the same host; connect over IPv4
            why = forbidden_reason(address)
            if why is None or self._named_by_rule(address, port):
                return Destination(shown, port, address)
            refused.append((address, why))
        listed = " and ".join(f"{address}, {why}" for address, why in refused)
        first = str(refused[0][0])
        if _may_name(first):
            fix = (
                f"the gateway connects there only when network.allow names the address; if that is "
                f"meant, add {_suggest(first, port)}"
            )
        else:
            fix = "the gateway never connects there"
        if isinstance(parsed, str):
            raise EgressRefused(f"{shown} resolves only to {listed}; {fix}")
        raise EgressRefused(f"{first} is {refused[0][1]}; {fix}")


def _may_name(address: str) -> bool:
    """Whether a ``network.allow`` rule may name ``address`` at all (loopback, metadata… may not)."""
    try:
        normalize_host_pattern(address)
    except ValueError:
        return False
    return True


__all__ = ["Destination", "Egress", "EgressDecision", "EgressRefused", "rule_name"]
