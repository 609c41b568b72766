"""Host patterns of network.allow: their grammar, and matching (tables and properties)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stockade.policy._match import host_rule_matches, normalize_host_pattern, pattern_kind
from stockade.policy._model import HostRule

# ------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(
    ("written", "normalised", "kind"),
    [
        ("api.example.com", "api.example.com", "name"),
        ("API.Example.COM.", "api.example.com", "name"),
        ("*.example.com", "*.example.com", "one"),
        ("**.example.com", "**.example.com", "many"),
        ("*.co.uk", "*.co.uk", "one"),
        ("xn--mnchen-3ya.de", "xn--mnchen-3ya.de", "name"),
        ("münchen.de", "xn--mnchen-3ya.de", "name"),
        ("*.münchen.de", "*.xn--mnchen-3ya.de", "one"),
        ("1.1.1.1", "1.1.1.1", "ip"),
        ("2001:DB8::0:1", "2001:db8::1", "ip"),
        ("[2001:db8::1]", "2001:db8::1", "ip"),
        ("::ffff:203.0.113.9", "203.0.113.9", "ip"),
        ("10.0.0.0/8", "10.0.0.0/8", "cidr"),
        ("2001:db8::/32", "2001:db8::/32", "cidr"),
        ("::ffff:10.0.0.0/104", "10.0.0.0/8", "cidr"),
        ("203.0.113.7/32", "203.0.113.7/32", "cidr"),
        ("a-b.c-d.example", "a-b.c-d.example", "name"),
        ("4chan.org", "4chan.org", "name"),
    ],
)
def test_patterns_are_normalised(written: str, normalised: str, kind: str) -> None:
    assert normalize_host_pattern(written) == normalised
    assert pattern_kind(normalised) == kind
    assert normalize_host_pattern(normalised) == normalised


@pytest.mark.parametrize(
    "written",
    [
        "*",
        "**",
        "*.*",
        "*.com",
        "**.com",
        "a*.example.com",
        "api.*.com",
        "*example.com",
        "***.example.com",
        "127.0.0.1",
        "127.255.0.1",
        "::1",
        "localhost",
        "api.localhost",
        "169.254.169.254",
        "fe80::1",
        "fd00:ec2::254",
        "0.0.0.0",
        "0.0.0.0/0",
        "::/0",
        "0.0.0.0/1",
        "128.0.0.0/1",
        "224.0.0.1",
        "255.255.255.255",
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "10.0.0.0/33",
        "10.0.0.1/8",
        "2001:db8::/129",
        "a_b.example.com",
        "-a.example.com",
        "a-.example.com",
        "a..b",
        "http://example.com",
        "example.com/path",
        "example.com:443",
        "",
    ],
)
def test_patterns_refused(written: str) -> None:
    with pytest.raises(ValueError, match="; "):
        normalize_host_pattern(written)


# -------------------------------------------------------------------------- matching


def rule(host: str, *ports: int) -> HostRule:
    return HostRule(normalize_host_pattern(host), ports=ports or (443,))


@pytest.mark.parametrize(
    ("pattern", "host", "port", "matches"),
    [
        ("api.example.com", "api.example.com", 443, True),
        ("api.example.com", "API.EXAMPLE.COM.", 443, True),
        ("api.example.com", "api.example.com", 80, False),
        ("api.example.com", "example.com", 443, False),
        ("api.example.com", "x.api.example.com", 443, False),
        ("api.example.com", "api.example.com.evil.net", 443, False),
        ("*.example.com", "a.example.com", 443, True),
        ("*.example.com", "example.com", 443, False),
        ("*.example.com", "a.b.example.com", 443, False),
        ("*.example.com", "aexample.com", 443, False),
        ("*.example.com", "a.example.com.evil.net", 443, False),
        ("*.example.com", ".example.com", 443, False),
        ("**.example.com", "a.example.com", 443, True),
        ("**.example.com", "a.b.c.example.com", 443, True),
        ("**.example.com", "example.com", 443, False),
        ("**.example.com", "badexample.com", 443, False),
        ("münchen.de", "xn--mnchen-3ya.de", 443, True),
        ("münchen.de", "MÜNCHEN.de", 443, True),
        ("1.1.1.1", "1.1.1.1", 443, True),
        ("1.1.1.1", "::ffff:1.1.1.1", 443, True),
        ("1.1.1.1", "[::ffff:1.1.1.1]", 443, True),
        ("1.1.1.1", "1.1.1.2", 443, False),
        ("1.1.1.1", "one.one.one.one", 443, False),
        ("10.0.0.0/8", "10.1.2.3", 443, True),
        ("10.0.0.0/8", "11.0.0.1", 443, False),
        ("10.0.0.0/8", "ten.example.com", 443, False),
        ("2001:db8::/32", "2001:db8:1::5", 443, True),
        ("2001:db8::/32", "[2001:db8:1::5]", 443, True),
        ("2001:db8::/32", "2001:db9::5", 443, False),
        ("2001:db8::/32", "10.0.0.1", 443, False),
        ("2001:db8::1", "fe80::1%eth0", 443, False),
        ("example.com", "2130706433", 443, False),
        ("example.com", "exa mple.com", 443, False),
        ("example.com", "", 443, False),
    ],
)
def test_matching(pattern: str, host: str, port: int, matches: bool) -> None:
    assert host_rule_matches(rule(pattern), host, port) is matches


def test_ports_must_be_listed() -> None:
    r = rule("api.example.com", 443, 8443)
    assert host_rule_matches(r, "api.example.com", 8443)
    assert not host_rule_matches(r, "api.example.com", 80)
    assert not host_rule_matches(r, "api.example.com", True)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ properties

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
WORDLIKE = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z])?", fullmatch=True)
SUFFIX = st.lists(WORDLIKE, min_size=2, max_size=4).map(".".join)
HOSTISH = st.text(alphabet="abcxyz.-*0123", max_size=30)


@given(LABEL, SUFFIX)
def test_one_label_wildcard_matches_exactly_one_extra_label(label: str, suffix: str) -> None:
    r = rule("*." + suffix)
    assert host_rule_matches(r, f"{label}.{suffix}", 443)
    assert not host_rule_matches(r, suffix, 443)


@given(st.lists(LABEL, min_size=2, max_size=5), SUFFIX)
def test_one_label_wildcard_never_matches_more_labels(labels: list[str], suffix: str) -> None:
    assert not host_rule_matches(rule("*." + suffix), ".".join([*labels, suffix]), 443)


@given(SUFFIX, HOSTISH)
def test_wildcard_never_matches_a_name_without_the_suffix(suffix: str, host: str) -> None:
    for r in (rule("*." + suffix), rule("**." + suffix)):
        if host_rule_matches(r, host, 443):
            name = host.lower().removesuffix(".")
            assert name.endswith("." + suffix)
            assert name != suffix


@given(SUFFIX, HOSTISH)
def test_one_label_wildcard_match_has_one_more_dot(suffix: str, host: str) -> None:
    if host_rule_matches(rule("*." + suffix), host, 443):
        name = host.lower().removesuffix(".")
        assert name.count(".") == suffix.count(".") + 1


@given(st.lists(LABEL, min_size=1, max_size=6), SUFFIX)
def test_many_label_wildcard_matches_any_number_of_extra_labels(labels: list[str], suffix: str) -> None:
    r = rule("**." + suffix)
    assert host_rule_matches(r, ".".join([*labels, suffix]), 443)
    assert not host_rule_matches(r, suffix, 443)


@given(SUFFIX, HOSTISH, st.booleans())
def test_exact_name_matches_only_itself(name: str, host: str, upper: bool) -> None:
    r = rule(name)
    assert host_rule_matches(r, name.upper() if upper else name, 443)
    if host_rule_matches(r, host, 443):
        assert host.lower().removesuffix(".") == name


@given(st.integers(1, 65535), st.integers(1, 65535), SUFFIX)
def test_a_port_not_listed_never_matches(allowed: int, asked: int, name: str) -> None:
    assume(allowed != asked)
    r = rule(name, allowed)
    assert not host_rule_matches(r, name, asked)
    assert host_rule_matches(r, name, allowed)


@given(st.ip_addresses(v=4), st.integers(0, 32), st.ip_addresses(v=4))
def test_cidr_matches_exactly_the_addresses_of_its_network(
    base: ipaddress.IPv4Address, prefix: int, address: ipaddress.IPv4Address
) -> None:
    network = ipaddress.ip_network(f"{base}/{prefix}", strict=False)
    r = HostRule(str(network))
    assert host_rule_matches(r, str(address), 443) is (address in network)
    mapped = f"::ffff:{address}"
    assert host_rule_matches(r, mapped, 443) is (address in network)


@given(st.ip_addresses(v=6), st.integers(0, 128), st.ip_addresses(v=6))
def test_ipv6_cidr(base: ipaddress.IPv6Address, prefix: int, address: ipaddress.IPv6Address) -> None:
    assume(address.ipv4_mapped is None)
    network = ipaddress.ip_network(f"{base}/{prefix}", strict=False)
    r = HostRule(str(network))
    assert host_rule_matches(r, str(address), 443) is (address in network)
    assert host_rule_matches(r, f"[{address}]", 443) is (address in network)


@given(SUFFIX, st.ip_addresses())
def test_names_and_addresses_never_match_each_other(name: str, address: object) -> None:
    assert not host_rule_matches(rule(name), str(address), 443)
    assert not host_rule_matches(HostRule(str(address)), name, 443)


@given(st.text(max_size=40))
def test_normalising_is_idempotent_or_refuses(text: str) -> None:
    try:
        once = normalize_host_pattern(text)
    except ValueError as exc:
        assert "; " in str(exc)  # every refusal says how to fix it
        return
    assert normalize_host_pattern(once) == once
