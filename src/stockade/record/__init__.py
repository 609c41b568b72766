"""The record: events from every layer, their store and hash chain, and
exports. (The kernel audit reader, which turns the kernel's refusals into
events, is the cell layer's: ``stockade.cell._audit``.)

Only the event model is imported eagerly. The rest is imported when first
used: the store pulls in sqlite3, the chain hashlib and json, the exports
datetime; ``stockade exec`` needs none of them to start a cell."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade.record._event import EVENT_VERSION, Event, Layer, Outcome

if TYPE_CHECKING:
    from stockade.record._chain import GENESIS, StoredEvent, VerifyResult, canonical_json, chain_hash
    from stockade.record._export import ExportFormat, export, export_to_file, parse_since
    from stockade.record._head import Head, parse_head, read_head
    from stockade.record._store import EventStore, SqliteStore, open_store

_LAZY = {
    "GENESIS": "_chain",
    "StoredEvent": "_chain",
    "VerifyResult": "_chain",
    "canonical_json": "_chain",
    "chain_hash": "_chain",
    "ExportFormat": "_export",
    "export": "_export",
    "export_to_file": "_export",
    "parse_since": "_export",
    "Head": "_head",
    "parse_head": "_head",
    "read_head": "_head",
    "EventStore": "_store",
    "SqliteStore": "_store",
    "open_store": "_store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stockade.record' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"stockade.record.{module}"), name)


__all__ = [
    "EVENT_VERSION",
    "GENESIS",
    "Event",
    "EventStore",
    "ExportFormat",
    "Head",
    "Layer",
    "Outcome",
    "SqliteStore",
    "StoredEvent",
    "VerifyResult",
    "canonical_json",
    "chain_hash",
    "export",
    "export_to_file",
    "open_store",
    "parse_head",
    "parse_since",
    "read_head",
]
