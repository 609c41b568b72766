"""The daemon's descriptor reserve (``stockade._fds``) counts what is open,
not only the number a new descriptor got: a low number (a hole left by
closed connections) with thousands open above it is still within the reserve."""

from __future__ import annotations

import os

import pytest

from stockade import _fds


def test_a_low_descriptor_number_does_not_hide_a_full_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fds, "RECOUNT", 0.0)  # count at every check
    base = _fds.open_count()
    monkeypatch.setattr(_fds, "_soft_limit", lambda: base + _fds.RESERVE + 3)
    assert not _fds.low(3), "the control: below the reserve by count and by number"
    held = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(6)]
    try:
        assert _fds.low(3), "six more open: within the reserve, whatever the number"
        soft = _fds._soft_limit()
        assert _fds.low(soft - _fds.RESERVE)  # a number within it, as before
    finally:
        for fd in held:
            os.close(fd)
    assert not _fds.low(3), "closed again: out of the reserve"


def test_the_count_is_reused_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fds, "RECOUNT", 3600.0)
    monkeypatch.setattr(_fds, "RECOUNT_EVERY", 2)
    monkeypatch.setattr(_fds, "_count", _fds._Count())
    first = _fds.open_count()
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert _fds.open_count() == first  # the second use of the first count
        assert _fds.open_count() == first + 1  # past RECOUNT_EVERY: counted again
    finally:
        os.close(fd)
