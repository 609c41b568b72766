"""The daemon's settings for every run's gateway (cheap to import: no gateway code)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayOptions:
    """The daemon's settings for every run's gateway."""

    dns: str | None = None
    """``HOST:PORT`` of the DNS server the gateway asks; None: the system resolver."""
    upstream_ca: str | None = None
    """A file of extra CAs trusted for upstream servers (tests, a corporate CA)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GatewayOptions:
        return cls(
            dns=environ.get("STOCKADE_DNS") or None, upstream_ca=environ.get("STOCKADE_UPSTREAM_CA") or None
        )


__all__ = ["GatewayOptions"]
