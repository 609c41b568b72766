"""The broker: the daemon's wire protocol and the intents a cell asks for.

``stockade.broker._protocol`` is the protocol of the daemon's sockets without
I/O (docs/PROTOCOL.md); the client that does the I/O is
``stockade.daemon._client``.
"""

from __future__ import annotations

from stockade.broker._protocol import (
    ERROR_CODES,
    MAX_DEPTH,
    MAX_FRAME,
    MAX_ID,
    MAX_METHOD,
    VERSION,
    Connection,
    ErrorCode,
    Failure,
    FrameDecoder,
    ProtocolViolation,
    Push,
    Request,
    Response,
    encode,
    parse_reply,
)

__all__ = [
    "ERROR_CODES",
    "MAX_DEPTH",
    "MAX_FRAME",
    "MAX_ID",
    "MAX_METHOD",
    "VERSION",
    "Connection",
    "ErrorCode",
    "Failure",
    "FrameDecoder",
    "ProtocolViolation",
    "Push",
    "Request",
    "Response",
    "encode",
    "parse_reply",
]
