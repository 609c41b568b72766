"""Fixtures shared by the escape suite. Kept small and generic on purpose:
helpers of one area live in that area's own modules (``_probes``, ``_fs*``,
``_proc*``)."""

from __future__ import annotations

import dataclasses
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


VIEWS = ("host", "image")
"""The views every test of the ``cell`` fixture runs in: the host's own system
directories, and a workbench's (an image as ``/``, tests/cell/_image.py), so
that a task's image is shown not to weaken the cell. A test whose attempt
means something in one view only says so with ``@pytest.mark.host_view``."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("host_view")
        views = ["host"] if only else list(VIEWS)
        metafunc.parametrize("cell", views, indirect=True, ids=lambda v: f"{v}-view")


@pytest.fixture
def cell(request: pytest.FixtureRequest) -> Iterator[Cell]:
    """A cell with the default policy, a fresh workspace and an empty
    environment, in the host's view or with the test image as ``/``."""
    image = None
    policy = default_policy()
    if getattr(request, "param", "host") == "image":
        from tests.cell._image import make_image

        image = make_image()
        # The escape suite's agent is the unprivileged one in both views (an
        # image without a User runs as its root; root workbenches have their
        # own escapes in test_workbench_escapes.py).
        policy = dataclasses.replace(policy, user="1000")
    with Cell(policy, environ={}, image=image) as c:
        yield c


__all__ = ["VIEWS", "cell", "host_dir"]
