"""The policy as the rest of stockade sees it: frozen, validated, normalised.

The file format (YAML, validated by pydantic in ``_schema``) is a trust boundary;
these dataclasses are what comes out of it. Nothing here does I/O, and importing
this module stays cheap: ``stockade exec`` without ``--policy`` builds the
default policy from these classes without loading pydantic or YAML, and the
rule classes only a policy file brings (``_rules``) are imported when named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

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

_RULES = frozenset(
    {"DiskLimit", "HostRule", "LlmPolicy", "MountMode", "MountRule", "SecretPolicy", "ToolRule", "Verdict"}
)

if TYPE_CHECKING:
    from stockade.policy._rules import DiskLimit as DiskLimit
    from stockade.policy._rules import HostRule as HostRule
    from stockade.policy._rules import LlmPolicy as LlmPolicy
    from stockade.policy._rules import MountMode as MountMode
    from stockade.policy._rules import MountRule as MountRule
    from stockade.policy._rules import SecretPolicy as SecretPolicy
    from stockade.policy._rules import ToolRule as ToolRule
    from stockade.policy._rules import Verdict as Verdict


def __getattr__(name: str) -> Any:
    # The rule classes a default policy never holds (``_rules``): imported when
    # first named, so that their dataclass creation is off the exec path.
    if name in _RULES:
        from stockade.policy import _rules

        return getattr(_rules, name)
    raise AttributeError(f"module 'stockade.policy._model' has no attribute {name!r}")


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
