"""The broker: the daemon's wire protocol and the intents a cell asks for.

``stockade.broker._protocol`` is the protocol of the daemon's sockets without
I/O (docs/PROTOCOL.md); the client that does the I/O is
``stockade.daemon._client``. The broker's logic (rules, tokens, tripwire,
approvals, intents; docs/BROKER.md) is exported lazily: it pulls in pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from stockade.broker._approvals import Approval, ApprovalError, Approvals
    from stockade.broker._intents import IntentError, IntentExecutor, parse_args, redact, refusal
    from stockade.broker._rules import Decision, Rules
    from stockade.broker._tokens import TokenCheck, Tokens
    from stockade.broker._tripwire import Tripwire

_LAZY = {
    "Approval": "_approvals",
    "ApprovalError": "_approvals",
    "Approvals": "_approvals",
    "Decision": "_rules",
    "IntentError": "_intents",
    "IntentExecutor": "_intents",
    "Rules": "_rules",
    "TokenCheck": "_tokens",
    "Tokens": "_tokens",
    "Tripwire": "_tripwire",
    "parse_args": "_intents",
    "redact": "_intents",
    "refusal": "_intents",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stockade.broker' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"stockade.broker.{module}"), name)


__all__ = [
    "ERROR_CODES",
    "MAX_DEPTH",
    "MAX_FRAME",
    "MAX_ID",
    "MAX_METHOD",
    "VERSION",
    "Approval",
    "ApprovalError",
    "Approvals",
    "Connection",
    "Decision",
    "ErrorCode",
    "Failure",
    "FrameDecoder",
    "IntentError",
    "IntentExecutor",
    "ProtocolViolation",
    "Push",
    "Request",
    "Response",
    "Rules",
    "TokenCheck",
    "Tokens",
    "Tripwire",
    "encode",
    "parse_args",
    "parse_reply",
    "redact",
    "refusal",
]
