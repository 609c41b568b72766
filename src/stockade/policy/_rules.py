"""The policy's rule classes that a policy holds only when its file names
them: mounts, a disk limit, network rules, secrets, tool rules, the LLM.

Apart from ``_model`` so that ``stockade exec`` with the default policy,
which holds none of them, does not pay their dataclass creation at import
(issue 18); ``_model`` and the package re-export them lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["allow", "deny", "ask"]
MountMode = Literal["ro", "rw"]


@dataclass(frozen=True)
class MountRule:
    """One ``filesystem.mounts`` entry: the host path ``source`` shown at
    ``target`` inside the cell, read-only (``ro``) or read-write (``rw``).
    Both are absolute and normalised; the target is a grant of the cell's
    view like a ``read`` or ``write`` entry, at another path."""

    source: str
    target: str
    mode: MountMode = "ro"


@dataclass(frozen=True)
class DiskLimit:
    """``limits.disk``: the size of the cell's own ``/tmp`` (a tmpfs of its
    own) and of a fresh workspace (an ext4 image of its own), so the kernel
    enforces it; ``None`` means no limit of that kind. A workspace the caller
    gives cannot be limited: such a policy is refused (docs/POLICY.md)."""

    bytes: int | None = None
    """Bytes of data, rounded up to whole pages."""
    files: int | None = None
    """Inodes: files, directories, links and the like, ``/tmp`` itself included."""


@dataclass(frozen=True)
class HostRule:
    """One ``network.allow`` entry: a host pattern the gateway lets through.

    ``host`` is a DNS name, a ``*.`` wildcard (one label or more, see
    docs/POLICY.md), an IP address or a CIDR network.
    """

    host: str
    ports: tuple[int, ...] = (443,)
    methods: tuple[str, ...] = ()
    """Upper-case HTTP methods; empty means any."""
    paths: tuple[str, ...] = ()
    """URL path prefixes; empty means any."""


@dataclass(frozen=True)
class SecretPolicy:
    """One secret the daemon holds and the gateway adds on the way out.

    Inside the cell the variable ``name`` holds a placeholder; the gateway
    replaces it with the value only in requests to ``hosts``.
    """

    name: str
    """The variable the cell sees (holding a placeholder)."""
    env: str | None = None
    """The daemon's environment variable holding the value."""
    file: str | None = None
    """Or a file (absolute path) on the daemon's host holding it."""
    hosts: tuple[str, ...] = ()
    """Host patterns (the grammar of ``network.allow``) the value may go to."""
    headers: tuple[str, ...] = ("Authorization",)
    """Request headers (any case) the placeholder may stand in; elsewhere it is refused."""
    body: bool = False
    """Whether the placeholder may stand in a request body."""
    url: bool = False
    """Whether the placeholder may stand in a URL's path or query."""


@dataclass(frozen=True)
class ToolRule:
    """One ``tools`` rule of the broker: an intent pattern and its verdict."""

    id: str
    intent: str
    verdict: Verdict
    match: tuple[tuple[str, str], ...] = ()
    """Argument name to glob pattern; every one must match."""


@dataclass(frozen=True)
class LlmPolicy:
    """Where the cell's LLM endpoint forwards (enforced by a later layer)."""

    provider: str = "openai"
    base_url: str = "http://127.0.0.1:11434/v1"
    model: str | None = None
    api_key_env: str | None = None
    max_requests: int | None = None
    max_tokens: int | None = None
    remote_images: bool = False
    """Whether ``image_url`` parts may name http(s) URLs (the provider fetches them; their
    hosts must pass ``network.allow``); only ``data:`` URLs otherwise."""
