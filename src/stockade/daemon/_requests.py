"""The error a daemon's request ends with; it lives in ``stockade.errors`` (the
one exception tree) and is named here too, for the daemon's modules that import
it from here."""

from __future__ import annotations

from stockade.errors import RequestError

__all__ = ["RequestError"]
