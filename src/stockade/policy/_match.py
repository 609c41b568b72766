"""Host patterns of ``network.allow``: their grammar and how they match.

Pure functions, no I/O and no DNS: the gateway resolves names itself and
decides about the addresses it would connect to; this module only says whether
a requested ``host:port`` is one that a rule names.

A pattern is one of:

=====================  ===========================================================
``api.example.com``    that name only
``*.example.com``      exactly one more label: ``a.example.com``; not
                       ``example.com``, not ``a.b.example.com``
``**.example.com``     one or more labels: ``a.example.com``, ``a.b.example.com``;
                       not ``example.com``
``192.0.2.10``         that address (IPv4 or IPv6)
``10.0.0.0/8``         any address of that network
=====================  ===========================================================

Names match names and addresses match addresses: a name rule never matches an
IP literal that the name happens to resolve to, nor the other way round.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache
from typing import Literal

from stockade.policy._model import HostRule

PatternKind = Literal["name", "one", "many", "ip", "cidr"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_NUMERIC_LOOKING = re.compile(r"^(0x[0-9a-f]*|[0-9.]+)$")

# Addresses the gateway never connects to, so that a rule naming them can only
# be a mistake: loopback would reach the host itself (the daemon's own sockets),
# link-local holds the cloud metadata services.
_NEVER: tuple[tuple[IPNetwork, str], ...] = (
    (ipaddress.ip_network("127.0.0.0/8"), "a loopback address"),
    (ipaddress.ip_network("::1/128"), "a loopback address"),
    (ipaddress.ip_network("0.0.0.0/8"), "an unspecified address"),
    (ipaddress.ip_network("::/128"), "an unspecified address"),
    (ipaddress.ip_network("169.254.0.0/16"), "link-local (home of cloud metadata services)"),
    (ipaddress.ip_network("fe80::/10"), "link-local"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "a cloud metadata address"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
    (ipaddress.ip_network("255.255.255.255/32"), "the broadcast address"),
)

_EXAMPLE = "name a domain such as '*.example.com'"


def _q(text: str) -> str:
    """Quote a pattern for a message (as ``_schema.show`` does, without importing pydantic)."""
    text = "".join(f"\\x{ord(c):02x}" if c < " " or c == "\x7f" else c for c in text)
    if len(text) > 80:
        text = text[:60] + "…" + text[-15:]
    return "'" + text.replace("'", "\\'") + "'"


def _to_ascii(name: str) -> str:
    """Lower-case ``name`` and turn an internationalised name into its A-label form."""
    name = name.lower()
    if name.isascii():
        return name
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(
            f"{_q(name)} is not a valid internationalised host name; write its 'xn--' form"
        ) from exc


def _unmap(address: IPAddress) -> IPAddress:
    """``::ffff:a.b.c.d`` is the IPv4 address a.b.c.d reached over IPv6."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _check_name(name: str, original: str) -> None:
    if len(name) > 253:
        raise ValueError(
            f"{_q(original)} is longer than 253 characters, the limit for a host name; check it for a mistake"
        )
    labels = name.split(".")
    for label in labels:
        if not label:
            raise ValueError(f"{_q(original)} has an empty label; remove the doubled or leading '.'")
        if len(label) > 63:
            raise ValueError(
                f"{_q(original)} has a label longer than 63 characters, the limit in a host name; "
                "check it for a mistake"
            )
        if not _LABEL.match(label):
            raise ValueError(
                f"{_q(original)} is not a valid host name; use letters, digits, '-' and '.', "
                "or write an IP address"
            )
    if labels[-1].isdigit() or _NUMERIC_LOOKING.match(name):
        # 127.1, 2130706433, 0x7f000001, 0177.0.0.1, 1.2.3.256: resolvers read
        # these as addresses in odd encodings, so they are never names.
        raise ValueError(
            f"{_q(original)} is not a valid IP address; write an IPv4 address as four "
            "decimal numbers, such as '192.0.2.10'"
        )
    if name == "localhost" or name.endswith(".localhost"):
        raise ValueError(
            f"{_q(original)} names this machine, which the gateway never connects to; "
            "to reach a server inside the cell use network.loopback_ports"
        )


def _check_network(net: IPNetwork, original: str) -> None:
    if net.prefixlen == 0:
        raise ValueError(f"{_q(original)} matches every address; name a network such as '203.0.113.0/24'")
    for bad, what in _NEVER:
        if net.version == bad.version and net.overlaps(bad):  # type: ignore[arg-type,unused-ignore]
            if net.num_addresses == 1:
                raise ValueError(
                    f"{_q(original)} is {what}, where the gateway never connects; remove it "
                    "(a server inside the cell is reached through network.loopback_ports)"
                )
            raise ValueError(
                f"{_q(original)} includes {bad}, {what}, where the gateway never connects; "
                "name a narrower network"
            )


def _parse_network(text: str) -> IPNetwork:
    address, _, prefix = text.partition("/")
    try:
        written = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(
            f"{_q(text)} is not a valid network: {_q(address)} is not an IP address; "
            "write a network such as '10.0.0.0/8'"
        ) from None
    limit = 32 if written.version == 4 else 128
    if not prefix.isdigit() or int(prefix) > limit:
        raise ValueError(
            f"{_q(text)} is not a valid network: the prefix length must be a number from 0 to "
            f"{limit} for IPv{written.version}; write a network such as "
            f"{_q('10.0.0.0/8' if written.version == 4 else '2001:db8::/32')}"
        )
    ip, plen = _unmap(written), int(prefix)
    if ip.version != written.version:
        # ::ffff:10.0.0.0/104 is 10.0.0.0/8 written as IPv6.
        if plen < 96:
            raise ValueError(
                f"{_q(text)} reaches beyond the IPv4-mapped range ::ffff:0:0/96; write an IPv4 network"
            )
        plen -= 96
    try:
        return ipaddress.ip_network(f"{ip}/{plen}", strict=True)
    except ValueError:
        network = ipaddress.ip_network(f"{ip}/{plen}", strict=False)
        raise ValueError(
            f"{_q(text)} has bits set after the prefix; write the network as {_q(str(network))}"
        ) from None


def normalize_host_pattern(text: str) -> str:
    """Validate a host pattern and return its canonical form.

    Names are lower-cased, stripped of a final ``.`` and given in their ASCII
    form; addresses and networks in their compressed form (an IPv4-mapped IPv6
    address becomes the IPv4 address).

    Raises:
        ValueError: the pattern is not valid; the message names the pattern and
            says how to fix it (it does not name the field).
    """
    original = text
    text = text.strip()
    if not text:
        raise ValueError(f"{_q(original)} is empty; {_EXAMPLE}")
    if "://" in text:
        rest = text.split("://", 1)[1]
        host = re.split(r"[/:?#]", rest, maxsplit=1)[0] or "example.com"
        raise ValueError(f"{_q(original)} is a URL; write the host name alone, such as {_q(host)}")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if "/" in text:
        if re.match(r"^[0-9a-fA-F.:]+/", text):
            return str(_checked_network(text, original))
        raise ValueError(
            f"{_q(original)} holds a '/', which a host name cannot; write the host alone and "
            "list URL paths under 'paths'"
        )
    if ":" in text:
        try:
            ip = _unmap(ipaddress.ip_address(text))
        except ValueError:
            raise ValueError(
                f"{_q(original)} is not a valid host: a ':' belongs only in an IPv6 address; "
                "give ports under 'ports' (or as 'host:port' in the short form)"
            ) from None
        _check_network(ipaddress.ip_network(ip), original)
        return str(ip)
    try:
        ip = _unmap(ipaddress.ip_address(text))
    except ValueError:
        pass
    else:
        _check_network(ipaddress.ip_network(ip), original)
        return str(ip)
    name = text[:-1] if text.endswith(".") else text
    if set(name) <= {"*", "."}:
        raise ValueError(f"{_q(original)} matches every host; {_EXAMPLE}")
    prefix = ""
    if name.startswith("**."):
        prefix, name = "**.", name[3:]
    elif name.startswith("*."):
        prefix, name = "*.", name[2:]
    if "*" in name:
        raise ValueError(
            f"{_q(original)} has a '*' that is not the whole leftmost label; "
            "write '*.example.com' (one label) or '**.example.com' (any number of labels)"
        )
    name = _to_ascii(name)
    _check_name(name, original)
    if prefix and "." not in name:
        raise ValueError(
            f"{_q(original)} matches every name under the top-level domain {_q(name)}; {_EXAMPLE}"
        )
    return prefix + name


def _checked_network(text: str, original: str) -> IPNetwork:
    network = _parse_network(text)
    _check_network(network, original)
    return network


@lru_cache(maxsize=4096)
def pattern_kind(pattern: str) -> PatternKind:
    """The kind of an already normalised pattern."""
    if pattern.startswith("**."):
        return "many"
    if pattern.startswith("*."):
        return "one"
    if "/" in pattern:
        return "cidr"
    try:
        ipaddress.ip_address(pattern)
    except ValueError:
        return "name"
    return "ip"


@lru_cache(maxsize=4096)
def _requested(host: str) -> str | IPAddress | None:
    """The requested host as a lower-case name or an address; ``None`` if it is neither.

    Cached: the gateway asks about the same few hosts for every request."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith(".") and host != ".":
        host = host[:-1]
    if not host or "%" in host:  # an IPv6 zone id names an interface, never a remote host
        return None
    try:
        return _unmap(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        name = _to_ascii(host)
    except ValueError:
        return None
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        return None
    return name


@lru_cache(maxsize=4096)
def _network(pattern: str) -> IPNetwork:
    return ipaddress.ip_network(pattern)


def host_rule_matches(rule: HostRule, host: str, port: int) -> bool:
    """Whether a request for ``host:port`` is one that ``rule`` allows.

    ``rule.host`` is a normalised pattern (as ``load_policy`` produces);
    ``host`` is what a client asked for: a name (any case, an optional final
    dot) or an IP literal (IPv6 with or without brackets). Methods and paths of
    the rule are not looked at here.
    """
    if isinstance(port, bool) or port not in rule.ports:
        return False
    requested = _requested(host)
    if requested is None:
        return False
    kind = pattern_kind(rule.host)
    if kind in ("ip", "cidr"):
        if isinstance(requested, str):
            return False
        network = _network(rule.host)
        return requested.version == network.version and requested in network
    if not isinstance(requested, str):
        return False
    if kind == "name":
        return requested == rule.host
    suffix = rule.host[rule.host.index(".") :]  # ".example.com"
    if not requested.endswith(suffix):
        return False
    extra = requested[: -len(suffix)]
    if not extra:
        return False
    return kind == "many" or "." not in extra


__all__ = ["PatternKind", "host_rule_matches", "normalize_host_pattern", "pattern_kind"]
