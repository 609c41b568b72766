"""The cell: the kernel layer. One sandbox per agent process: namespaces, a
filesystem view, Landlock, seccomp, cgroups, a timeout, and no network but the
gateway."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.cell._cell import Cell, CellNetwork, CellResult
    from stockade.cell._session import Session, SessionResult


def __getattr__(name: str) -> Any:
    if name in ("Cell", "CellNetwork", "CellResult"):
        from stockade.cell import _cell

        return getattr(_cell, name)
    if name in ("Session", "SessionResult"):
        from stockade.cell import _session

        return getattr(_session, name)
    raise AttributeError(f"module 'stockade.cell' has no attribute {name!r}")


__all__ = ["Cell", "CellNetwork", "CellResult", "Session", "SessionResult"]
