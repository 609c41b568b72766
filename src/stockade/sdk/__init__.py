"""The agent SDK: ``stockade_agent``, the module an agent imports inside its cell.

Inside a cell the module is ``/run/stockade/lib/stockade_agent.py`` (on
``PYTHONPATH``) and is imported as ``stockade_agent``; it uses only the
standard library and runs on Python 3.8 and later (docs/SDK.md). This package
re-exports it for host-side use (tests, tools that speak to a run's broker
socket with its token), and names the file for whoever mounts it into a cell
(``MODULE_PATH``).
"""

from __future__ import annotations

import os

from stockade.sdk.stockade_agent import (
    Broker,
    BrokerError,
    Denied,
    Entry,
    ExecResult,
    FetchResponse,
    IntentFailed,
    Listing,
    Message,
    NoAnswer,
    NotInCell,
    RunHalted,
    ToolCall,
    Unauthorized,
    Unreachable,
    WriteResult,
    current_tool_call,
    default_broker,
    tool,
)

MODULE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stockade_agent.py")
"""The SDK's one file on the host: what the cell mounts at ``/run/stockade/lib/stockade_agent.py``."""
IN_CELL_DIR = "/run/stockade/lib"
"""Where the cell shows it (and what ``PYTHONPATH`` names)."""

__all__ = [
    "IN_CELL_DIR",
    "MODULE_PATH",
    "Broker",
    "BrokerError",
    "Denied",
    "Entry",
    "ExecResult",
    "FetchResponse",
    "IntentFailed",
    "Listing",
    "Message",
    "NoAnswer",
    "NotInCell",
    "RunHalted",
    "ToolCall",
    "Unauthorized",
    "Unreachable",
    "WriteResult",
    "current_tool_call",
    "default_broker",
    "tool",
]
