"""Sizes, durations and CPU amounts: tables and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.policy._schema import (
    format_duration,
    format_size,
    parse_cpu,
    parse_duration,
    parse_size,
)
from stockade.policy._units import MAX_DURATION

K, M, G, T = 1024, 1024**2, 1024**3, 1024**4
UNITS = {"": 1, "k": K, "K": K, "KB": K, "KiB": K, "m": M, "M": M, "MB": M, "MiB": M, "g": G}
UNITS |= {"G": G, "GB": G, "GiB": G, "gib": G, "T": T, "TiB": T, "P": 1024**5, "B": 1, "b": 1}


@pytest.mark.parametrize(
    ("written", "size"),
    [
        (0, 0),
        (512, 512),
        (1.0, 1),
        ("512", 512),
        ("1K", K),
        ("64k", 64 * K),
        ("512M", 512 * M),
        ("512MB", 512 * M),
        ("512 MiB", 512 * M),
        ("2G", 2 * G),
        ("1.5G", 3 * G // 2),
        (".5K", 512),
        (" 1 T ", T),
        ("1024B", 1024),
    ],
)
def test_sizes(written: object, size: int) -> None:
    assert parse_size(written) == size


@pytest.mark.parametrize(
    "written", ["", "M", "1.2.3G", "12X", "1 0M", "-1", "1e3", -1, 1.5, math.nan, True, None, [1]]
)
def test_not_sizes(written: object) -> None:
    with pytest.raises(ValueError, match=r"; write a number"):
        parse_size(written)


@given(st.integers(0, 10**9), st.sampled_from(sorted(UNITS)))
def test_size_with_unit_is_number_times_unit(n: int, unit: str) -> None:
    assert parse_size(f"{n}{unit}") == n * UNITS[unit]


@given(st.integers(0, 2**60))
def test_format_size_parses_back(n: int) -> None:
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        (30, 30.0),
        (2.5, 2.5),
        ("90", 90.0),
        ("1.5", 1.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        ("500ms", 0.5),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("1H", 3600.0),
        ("0", 0.0),
    ],
)
def test_durations(written: object, seconds: float) -> None:
    assert parse_duration(written) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "written", ["", "s", "5 minutes", "1h30", "h1", "-5m", "5m-", "1y", -1, math.inf, False, None]
)
def test_not_durations(written: object) -> None:
    with pytest.raises(ValueError, match=r"is not a duration; write a number of seconds"):
        parse_duration(written)


DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(DURATION_UNITS))), min_size=1))
def test_duration_parts_add_up(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * DURATION_UNITS[unit] for n, unit in parts)
    if expected > MAX_DURATION:
        with pytest.raises(ValueError, match="is longer than 366d"):
            parse_duration(text)
    else:
        assert parse_duration(text) == pytest.approx(expected)


@given(st.integers(1, int(MAX_DURATION)))
def test_format_duration_parses_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("written", "cores"),
    [
        (2, 2.0),
        (0.5, 0.5),
        ("0.5", 0.5),
        ("50%", 0.5),
        ("150 %", 1.5),
        ("400%", 4.0),
        (".25", 0.25),
    ],
)
def test_cpu(written: object, cores: float) -> None:
    assert parse_cpu(written) == cores


@pytest.mark.parametrize("written", [0, -1, "0%", "half", "%", "50%%", math.nan, True, None])
def test_not_cpu(written: object) -> None:
    with pytest.raises(ValueError, match=r"write a number of cores"):
        parse_cpu(written)


@given(st.integers(1, 100_000))
def test_cpu_percent_is_a_hundredth_of_a_core(percent: int) -> None:
    assert parse_cpu(f"{percent}%") == pytest.approx(percent / 100)
