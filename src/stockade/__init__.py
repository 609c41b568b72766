"""stockade: contain AI agents on Linux.

The public API. Names are imported lazily so that ``import stockade`` stays cheap
on the ``stockade exec`` path (no pydantic, no YAML until a policy file is read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from stockade.cell import Cell, CellResult
    from stockade.errors import (
        CellError,
        DaemonError,
        HostError,
        PolicyError,
        ProtocolError,
        StockadeError,
        StoreError,
    )
    from stockade.policy import Policy, default_policy, load_policy
    from stockade.record import Event

_LAZY = {
    "Cell": "stockade.cell",
    "CellResult": "stockade.cell",
    "CellError": "stockade.errors",
    "DaemonError": "stockade.errors",
    "Event": "stockade.record",
    "HostError": "stockade.errors",
    "Policy": "stockade.policy",
    "PolicyError": "stockade.errors",
    "ProtocolError": "stockade.errors",
    "StockadeError": "stockade.errors",
    "StoreError": "stockade.errors",
    "default_policy": "stockade.policy",
    "load_policy": "stockade.policy",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stockade' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    # The lazy names too: ``dir(stockade)`` and completion in a REPL list them.
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Cell",
    "CellError",
    "CellResult",
    "DaemonError",
    "Event",
    "HostError",
    "Policy",
    "PolicyError",
    "ProtocolError",
    "StockadeError",
    "StoreError",
    "__version__",
    "default_policy",
    "load_policy",
]
