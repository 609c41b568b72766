"""The policy as the rest of stockade sees it: frozen, validated, normalised.

The file format (YAML, validated by pydantic in ``_schema``) is a trust boundary;
these dataclasses are what comes out of it. Nothing here does I/O, and importing
this module stays cheap: ``stockade exec`` without ``--policy`` builds the
default policy from these classes without loading pydantic or YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
"""Request headers the gateway sets or drops itself (framing, hop-by-hop, the
proxy's own), lower-case: an agent's value there never arrives as written. The
one table for ``http.fetch``, which drops them, and the policy, which refuses a
secret there."""

Mode = Literal["enforce", "audit"]
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
class FilesystemPolicy:
    """What the cell's filesystem view holds.

    Paths are absolute and normalised; they may hold shell globs (``*``, ``?``,
    ``[...]``, not ``**``), expanded on the host when a cell starts. The
    workspace is always read-write and need not be listed.
    """

    read: tuple[str, ...] = ()
    """Shown read-only (and executable, subject to ``exec.allow``)."""
    write: tuple[str, ...] = ()
    """Shown read-write."""
    deny: tuple[str, ...] = ()
    """Hidden even where a ``read`` or ``write`` entry covers them (secrets)."""
    protect: tuple[str, ...] = ()
    """Read-only inside writable paths, even before they exist; relative
    entries (``.git/hooks``) are taken relative to the workspace."""
    mounts: tuple[MountRule, ...] = ()
    """Host paths shown at other paths inside (``MountRule``)."""


@dataclass(frozen=True)
class ExecPolicy:
    """Which binaries the cell may execute."""

    allow: tuple[str, ...] = ()
    """Absolute paths of executables; empty means any readable file may run."""


@dataclass(frozen=True)
class EnvPolicy:
    """The cell's environment: nothing of the caller's crosses unless named."""

    passthrough: tuple[str, ...] = ()
    """Names whose values are copied from the caller's environment, if set."""
    set: tuple[tuple[str, str], ...] = ()
    """Variables set to fixed values (``${VAR}`` already expanded)."""


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
class Limits:
    """Resource limits; ``None`` means no limit of that kind."""

    memory: int | None = None
    """Bytes of memory (RAM + swap) for the whole cell."""
    pids: int | None = None
    """Processes and threads alive at once in the cell."""
    cpu: float | None = None
    """CPU time as a number of cores (0.5 = half of one core)."""
    timeout: float | None = None
    """Wall-clock seconds from start until every process of the cell is killed."""
    output: int | None = None
    """Bytes of stdout + stderr kept; past it output is dropped and recorded."""
    denials: int | None = None
    """The tripwire: after this many denials of the broker in one run, the run
    halts (its cells stop, every later intent is refused and recorded)."""
    disk: DiskLimit | None = None
    """The cell's ``/tmp`` and a fresh workspace, each: bytes and files (``DiskLimit``); None for no limit."""


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
class NetworkPolicy:
    """Egress through the gateway, and loopback ports inside the cell."""

    allow: tuple[HostRule, ...] = ()
    """Hosts the gateway lets through (enforced by the gateway, a later layer)."""
    loopback_ports: tuple[int, ...] = ()
    """TCP ports on the cell's own loopback that programs in it may bind and
    connect to (a test server, say). The cell has no other network."""
    fetch_plain_http: bool = False
    """Whether the broker's ``http.fetch`` may fetch ``http://`` URLs (HTTPS only by default)."""


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


@dataclass(frozen=True)
class Policy:
    """One agent's policy. Build it with ``load_policy`` or ``default_policy``."""

    name: str
    command: tuple[str, ...] = ()
    mode: Mode = "enforce"
    workspace: str | None = None
    """Absolute path of the workspace; ``None`` means a fresh temporary one."""
    workdir: str | None = None
    """Working directory inside the cell; ``None`` means the workspace."""
    filesystem: FilesystemPolicy = field(default_factory=FilesystemPolicy)
    exec: ExecPolicy = field(default_factory=ExecPolicy)
    env: EnvPolicy = field(default_factory=EnvPolicy)
    limits: Limits = field(default_factory=Limits)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    tools: tuple[ToolRule, ...] = ()
    llm: LlmPolicy | None = None
    secrets: tuple[SecretPolicy, ...] = ()
    source: str | None = None
    """The file this policy came from, for messages; ``None`` when built in code."""
    image: str | None = None
    """A workbench image reference (``name:tag``, ``sha256:…``) whose root
    filesystem is the cell's ``/`` (cell/_plan.py, docs/CELL.md); ``None``:
    the host's own system directories."""
    user: str | None = None
    """Who the command runs as inside the cell: ``root`` (uid 0 of the cell's
    user namespace, an unprivileged range on the host), a user name of the
    image's ``/etc/passwd`` or a number; ``None``: the image's own user, or
    the agent (uid 1000) without an image."""
