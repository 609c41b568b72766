"""The AgentOS manifests the tests use as data: ``../shared/agentos`` beside
the checkout, read in place (never copied into the repository).

A checkout without them (``git clone . /tmp/x``) skips the tests that need
them, naming the directory, instead of failing to collect.
"""

from __future__ import annotations

from pathlib import Path

import pytest

AGENTOS = Path(__file__).resolve().parents[1].parent / "shared" / "agentos"
_NAMES = sorted(p.name for p in AGENTOS.iterdir()) if AGENTOS.is_dir() else []
GOOD = [n for n in _NAMES if n.endswith((".yaml", ".json")) and "bad-" not in n]
"""Manifests AgentOS accepts."""
BAD = [n for n in _NAMES if "bad-" in n]
"""Manifests AgentOS refuses."""


def require() -> Path:
    """The manifests' directory; the test is skipped where the shared data is absent."""
    if not AGENTOS.is_dir():
        pytest.skip(f"no AgentOS manifests at {AGENTOS} (the shared test data beside the checkout)")
    return AGENTOS


def manifest(name: str) -> Path:
    """The manifest ``name`` (see ``require``)."""
    return require() / name
