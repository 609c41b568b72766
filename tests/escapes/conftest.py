"""Fixtures shared by the escape suite. Kept small and generic on purpose:
helpers of one area live in that area's own modules (``_probes``, ``_fs*``,
``_proc*``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.policy import default_policy


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A scratch directory on the host *outside* ``/tmp``, world-traversable.

    A cell has a ``/tmp`` of its own, so a host path under ``/tmp`` that no
    grant shows is simply absent from its view; a path elsewhere is shown as a
    decoy or refused by Landlock, which is what most escape tests need.
    """
    path = Path(tempfile.mkdtemp(prefix="stockade-escape-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cell() -> Iterator[Cell]:
    """A cell with the default policy, a fresh workspace and an empty environment."""
    with Cell(default_policy(), environ={}) as c:
        yield c


__all__ = ["cell", "host_dir"]
