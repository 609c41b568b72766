"""The house stays clean: ruff on the package and its tests, mypy --strict on
the package (pyproject.toml holds both configurations), as part of the one test
command that CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_finds_nothing() -> None:
    result = _run(str(BIN / "ruff"), "check", "--no-cache", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_finds_nothing() -> None:
    # The configuration ([tool.mypy] strict, files) is pyproject.toml's.
    result = _run(str(BIN / "mypy"), "--cache-dir", "/dev/null")
    assert result.returncode == 0, result.stdout + result.stderr
