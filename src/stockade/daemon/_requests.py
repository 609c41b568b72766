"""The error a daemon's request ends with (its own module: the parts of the
daemon that raise it import one another)."""

from __future__ import annotations

from stockade.errors import StockadeError


class RequestError(StockadeError):
    """A request the daemon refuses; ``code`` is the wire protocol's error code."""

    exit_code = 5

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


__all__ = ["RequestError"]
