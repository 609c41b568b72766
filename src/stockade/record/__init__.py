"""The record: events from every layer, and the kernel audit reader.

``AuditReader`` is imported lazily: it pulls in threading and sockets, which
code that only handles events does not need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade.record._event import EVENT_VERSION, Event, Layer, Outcome

if TYPE_CHECKING:
    from stockade.record._audit import AuditReader, AuditStats


def __getattr__(name: str) -> Any:
    if name in ("AuditReader", "AuditStats"):
        from stockade.record import _audit

        return getattr(_audit, name)
    raise AttributeError(f"module 'stockade.record' has no attribute {name!r}")


__all__ = ["EVENT_VERSION", "AuditReader", "AuditStats", "Event", "Layer", "Outcome"]
