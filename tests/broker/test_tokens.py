"""Capability tokens: issued, checked, and every way a bad one is told apart."""

from __future__ import annotations

import base64
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.broker._tokens import MAX_TOKEN_LENGTH, TokenCheck, Tokens

KEY = b"k" * 32


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_fresh_token_checks_ok_for_its_run_and_cell() -> None:
    tokens = Tokens(KEY, clock=Clock())
    token = tokens.issue("r-1", "c-1", ttl=60)
    assert tokens.check(token, run="r-1", cell="c-1") is TokenCheck.OK
    assert tokens.check(token, run="r-1", cell="c-1") == "ok"  # a StrEnum: the wire's string
    assert token.startswith("st1.") and token.count(".") == 2
    assert all(c.isalnum() or c in "-_." for c in token)  # base64url, unpadded


def test_expiry_is_enforced_by_the_injected_clock() -> None:
    clock = Clock()
    tokens = Tokens(KEY, clock=clock)
    token = tokens.issue("r-1", "c-1", ttl=10)
    clock.now += 9.99
    assert tokens.check(token, run="r-1", cell="c-1") is TokenCheck.OK
    clock.now += 0.01
    assert tokens.check(token, run="r-1", cell="c-1") is TokenCheck.EXPIRED


def test_another_runs_or_cells_token_is_wrong_run() -> None:
    tokens = Tokens(KEY, clock=Clock())
    token = tokens.issue("r-other", "c-1", ttl=60)
    assert tokens.check(token, run="r-1", cell="c-1") is TokenCheck.WRONG_RUN
    assert tokens.check(tokens.issue("r-1", "c-2", ttl=60), run="r-1", cell="c-1") is TokenCheck.WRONG_RUN


def test_wrong_run_is_reported_before_expiry() -> None:
    clock = Clock()
    tokens = Tokens(KEY, clock=clock)
    token = tokens.issue("r-other", "c-1", ttl=1)
    clock.now += 100
    assert tokens.check(token, run="r-1", cell="c-1") is TokenCheck.WRONG_RUN


def test_another_daemons_token_is_forged() -> None:
    mine, theirs = Tokens(KEY, clock=Clock()), Tokens(b"x" * 32, clock=Clock())
    token = theirs.issue("r-1", "c-1", ttl=60)
    assert mine.check(token, run="r-1", cell="c-1") is TokenCheck.FORGED


def test_an_edited_payload_is_forged() -> None:
    tokens = Tokens(KEY, clock=Clock())
    token = tokens.issue("r-other", "c-1", ttl=60)
    prefix, _payload, mac = token.split(".")
    edited = b64(b'["r-1","c-1",99999999999999]')
    assert tokens.check(f"{prefix}.{edited}.{mac}", run="r-1", cell="c-1") is TokenCheck.FORGED


def test_a_signed_payload_of_the_wrong_shape_is_forged() -> None:
    import hashlib
    import hmac

    tokens = Tokens(KEY, clock=Clock())
    for payload in (b"not json", b'{"run": "r-1"}', b'["r-1","c-1","soon"]', b'["r-1","c-1"]'):
        signed = "st1." + b64(payload)
        mac = b64(hmac.new(KEY, signed.encode(), hashlib.sha256).digest())
        assert tokens.check(f"{signed}.{mac}", run="r-1", cell="c-1") is TokenCheck.FORGED


@pytest.mark.parametrize(
    "token",
    [
        None,
        42,
        b"st1.a.b",
        "",
        "st1",
        "st1.",
        "st1..",
        "st1.abc",
        "st2." + b64(b"x") + "." + b64(b"y" * 32),
        "st1." + b64(b"x") + "." + b64(b"y" * 31),  # MAC of the wrong length
        "st1." + b64(b"x") + "." + b64(b"y" * 32) + "=",  # padding is not base64url as issued
        "st1." + b64(b"x") + "." + b64(b"y" * 32) + ".z",
        "st1.!!!." + b64(b"y" * 32),
        "st1." + b64(b"x") + "." + "A" * (len(b64(b"y" * 32)) - 1) + "B",  # non-canonical final bits
        "st1." + "é" + "." + b64(b"y" * 32),
        "st1." + "A" * MAX_TOKEN_LENGTH,
    ],
)
def test_malformed_tokens_are_told_apart_and_never_raise(token: object) -> None:
    tokens = Tokens(KEY, clock=Clock())
    assert tokens.check(token, run="r-1", cell="c-1") is TokenCheck.MALFORMED


def test_the_four_failures_are_distinct() -> None:
    clock = Clock()
    tokens = Tokens(KEY, clock=clock)
    good = tokens.issue("r-1", "c-1", ttl=5)
    results = {
        tokens.check("garbage", run="r-1", cell="c-1"),
        tokens.check(good[:-2] + ("AA" if not good.endswith("AA") else "BA"), run="r-1", cell="c-1"),
        tokens.check(tokens.issue("r-2", "c-1", ttl=5), run="r-1", cell="c-1"),
    }
    clock.now += 10
    results.add(tokens.check(good, run="r-1", cell="c-1"))
    assert results == {TokenCheck.MALFORMED, TokenCheck.FORGED, TokenCheck.WRONG_RUN, TokenCheck.EXPIRED}


@given(st.integers(min_value=4, max_value=200), st.characters(codec="ascii"))
def test_no_single_character_change_keeps_a_token_valid(position: int, char: str) -> None:
    tokens = Tokens(KEY, clock=Clock())
    token = tokens.issue("r-1", "c-1", ttl=60)
    position %= len(token)
    changed = token[:position] + char + token[position + 1 :]
    if changed != token:
        assert tokens.check(changed, run="r-1", cell="c-1") is not TokenCheck.OK


def test_the_key_is_never_shown_nor_pickled() -> None:
    tokens = Tokens(KEY)
    assert "k" * 8 not in repr(tokens) and "hidden" in repr(tokens)
    assert "k" * 8 not in str(tokens)
    with pytest.raises(TypeError):
        pickle.dumps(tokens)


def test_a_random_key_per_instance() -> None:
    a, b = Tokens(), Tokens()
    token = a.issue("r-1", "c-1", ttl=60)
    assert a.check(token, run="r-1", cell="c-1") is TokenCheck.OK
    assert b.check(token, run="r-1", cell="c-1") is TokenCheck.FORGED


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "60", True])
def test_a_bad_ttl_is_refused(ttl: object) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Tokens(KEY).issue("r-1", "c-1", ttl=ttl)  # type: ignore[arg-type]


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        Tokens(b"short")
