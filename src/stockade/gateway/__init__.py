"""The gateway: the only way out of a cell, and its LLM endpoint.

A cell's network namespace holds only ``lo``. On it, the daemon serves an
HTTP/HTTPS proxy (``_proxy``) that lets through what ``network.allow`` names,
resolving names itself and refusing internal addresses (``_egress``,
``_addresses``, ``_resolve``), adding secrets only toward their hosts
(``_secrets``, with a per-run CA where it must see inside TLS: ``_ca``); and an
OpenAI-compatible LLM endpoint (``stockade.llm``). ``Gateway`` ties them to one
run. docs/GATEWAY.md explains it for users.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.gateway._gateway import Gateway
    from stockade.gateway._options import GatewayOptions


def __getattr__(name: str) -> Any:
    # The gateway pulls in h11, cryptography and starlette: only when a run needs it.
    if name == "GatewayOptions":
        from stockade.gateway._options import GatewayOptions

        return GatewayOptions
    if name == "Gateway":
        from stockade.gateway._gateway import Gateway

        return Gateway
    raise AttributeError(f"module 'stockade.gateway' has no attribute {name!r}")


__all__ = ["Gateway", "GatewayOptions"]
