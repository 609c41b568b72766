"""The cell's LLM endpoint, and the offline mock model behind ``stockade mock-llm``.

``LlmEndpoint`` serves the OpenAI chat-completions API to the agents of one
run (one socket per cell, on the cell's 127.0.0.1:3129), checks the run's
token and budgets, forwards to the policy's upstream (OpenAI-compatible, or
Anthropic translated both ways) with the operator's key, and records one
``llm.call`` event per call. ``MockLlm`` answers from scripts. docs/LLM.md
explains both for users.

Names are exported lazily: they pull in starlette, uvicorn and httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.llm._endpoint import MAX_BODY, GatewayHooks, LlmEndpoint
    from stockade.llm._mock import MockLlm, Seen
    from stockade.llm._scripts import (
        BUILTIN,
        ESCAPE_ATTEMPTS,
        INJECTION_MARKER,
        Attempt,
        Reply,
        Said,
        Script,
        load_script,
    )
    from stockade.llm._serve import AppServer
    from stockade.llm._upstreams import UpstreamError

_LAZY = {
    "AppServer": "_serve",
    "Attempt": "_scripts",
    "BUILTIN": "_scripts",
    "ESCAPE_ATTEMPTS": "_scripts",
    "GatewayHooks": "_endpoint",
    "INJECTION_MARKER": "_scripts",
    "LlmEndpoint": "_endpoint",
    "MAX_BODY": "_endpoint",
    "MockLlm": "_mock",
    "Reply": "_scripts",
    "Said": "_scripts",
    "Script": "_scripts",
    "Seen": "_mock",
    "UpstreamError": "_upstreams",
    "load_script": "_scripts",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stockade.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stockade.llm.{module}"), name)


__all__ = [
    "BUILTIN",
    "ESCAPE_ATTEMPTS",
    "INJECTION_MARKER",
    "MAX_BODY",
    "AppServer",
    "Attempt",
    "GatewayHooks",
    "LlmEndpoint",
    "MockLlm",
    "Reply",
    "Said",
    "Script",
    "Seen",
    "UpstreamError",
    "load_script",
]
