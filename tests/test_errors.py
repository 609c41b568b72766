"""The exception tree is one: drawn in ``stockade.errors`` and complete (issue 13)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator

import stockade
import stockade.errors as errors

# stockade.demo.agent runs inside a cell, where stockade_agent is on the path;
# the bench tasks are data (their tests are the tasks' own).
NOT_IMPORTABLE_HERE = ("stockade.demo.agent", "stockade.bench.tasks.")


def _every_module() -> list[str]:
    names = []
    for module in pkgutil.walk_packages(stockade.__path__, "stockade."):
        if module.name.startswith(NOT_IMPORTABLE_HERE):
            continue
        importlib.import_module(module.name)
        names.append(module.name)
    return names


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_stockade_error_is_defined_in_errors_and_drawn_there() -> None:
    """TaskError (bench) and ReplayError (dashboard) were StockadeErrors of
    their own modules, missing from the drawn tree; every class of the tree
    lives in stockade.errors, is in its __all__ and in its docstring's drawing."""
    assert len(_every_module()) > 100  # the walk saw the package, not a stub of it
    found = {cls for cls in _subclasses(errors.StockadeError) if not cls.__module__.startswith("tests.")}
    elsewhere = sorted(
        f"{cls.__module__}.{cls.__qualname__}" for cls in found if cls.__module__ != errors.__name__
    )
    assert elsewhere == [], f"define these in stockade.errors (and draw them): {elsewhere}"
    drawn = set(re.findall(r"(?:[├└]── |^    )(\w+) ", errors.__doc__ or "", re.MULTILINE))
    names = {cls.__name__ for cls in found} | {"StockadeError"}
    assert names - drawn == set(), f"not in the drawing of stockade.errors: {sorted(names - drawn)}"
    assert names - set(errors.__all__) == set()
