"""The module Inspect's ``inspect_ai`` entry point names: importing it
registers the ``stockade`` sandbox environment (``@sandboxenv``)."""

from __future__ import annotations

from stockade.harness._inspect import StockadeSandboxEnvironment

__all__ = ["StockadeSandboxEnvironment"]
