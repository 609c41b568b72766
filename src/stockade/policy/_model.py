"""The policy as the rest of stockade sees it: frozen, validated, normalised.

The file format (YAML, validated by pydantic in ``_schema``) is a trust boundary;
these frozen value classes are what comes out of it (``stockade._slots``:
``dataclasses.replace``, ``fields`` and ``asdict`` work on them). Nothing here
does I/O, and importing this module stays cheap: ``stockade exec`` without ``--policy`` builds the
default policy from these classes without loading pydantic or YAML, and the
rule classes only a policy file brings (``_rules``) are imported when named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from stockade._slots import Frozen

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


class FilesystemPolicy(Frozen):
    """What the cell's filesystem view holds.

    Paths are absolute and normalised; they may hold shell globs (``*``, ``?``,
    ``[...]``, not ``**``), expanded on the host when a cell starts. The
    workspace is always read-write and need not be listed.
    """

    _fields = ("read", "write", "deny", "protect", "mounts")
    __slots__ = _fields

    read: tuple[str, ...]
    """Shown read-only (and executable, subject to ``exec.allow``)."""
    write: tuple[str, ...]
    """Shown read-write."""
    deny: tuple[str, ...]
    """Hidden even where a ``read`` or ``write`` entry covers them (secrets)."""
    protect: tuple[str, ...]
    """Read-only inside writable paths, even before they exist; relative
    entries (``.git/hooks``) are taken relative to the workspace."""
    mounts: tuple[MountRule, ...]
    """Host paths shown at other paths inside (``MountRule``)."""

    def __init__(
        self,
        read: tuple[str, ...] = (),
        write: tuple[str, ...] = (),
        deny: tuple[str, ...] = (),
        protect: tuple[str, ...] = (),
        mounts: tuple[MountRule, ...] = (),
    ) -> None:
        object.__setattr__(self, "read", read)
        object.__setattr__(self, "write", write)
        object.__setattr__(self, "deny", deny)
        object.__setattr__(self, "protect", protect)
        object.__setattr__(self, "mounts", mounts)


class ExecPolicy(Frozen):
    """Which binaries the cell may execute."""

    _fields = ("allow",)
    __slots__ = _fields

    allow: tuple[str, ...]
    """Absolute paths of executables; empty means any readable file may run."""

    def __init__(
        self,
        allow: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "allow", allow)


class EnvPolicy(Frozen):
    """The cell's environment: nothing of the caller's crosses unless named."""

    _fields = ("passthrough", "set")
    __slots__ = _fields

    passthrough: tuple[str, ...]
    """Names whose values are copied from the caller's environment, if set."""
    set: tuple[tuple[str, str], ...]
    """Variables set to fixed values (``${VAR}`` already expanded)."""

    def __init__(
        self,
        passthrough: tuple[str, ...] = (),
        set: tuple[tuple[str, str], ...] = (),
    ) -> None:
        object.__setattr__(self, "passthrough", passthrough)
        object.__setattr__(self, "set", set)


class Limits(Frozen):
    """Resource limits; ``None`` means no limit of that kind."""

    _fields = ("memory", "pids", "cpu", "timeout", "output", "denials", "disk")
    __slots__ = _fields

    memory: int | None
    """Bytes of memory (RAM + swap) for the whole cell."""
    pids: int | None
    """Processes and threads alive at once in the cell."""
    cpu: float | None
    """CPU time as a number of cores (0.5 = half of one core)."""
    timeout: float | None
    """Wall-clock seconds from start until every process of the cell is killed."""
    output: int | None
    """Bytes of stdout + stderr kept; past it output is dropped and recorded."""
    denials: int | None
    """The tripwire: after this many denials of the broker in one run, the run
    halts (its cells stop, every later intent is refused and recorded)."""
    disk: DiskLimit | None
    """The cell's ``/tmp`` and a fresh workspace, each: bytes and files (``DiskLimit``); None for no limit."""

    def __init__(
        self,
        memory: int | None = None,
        pids: int | None = None,
        cpu: float | None = None,
        timeout: float | None = None,
        output: int | None = None,
        denials: int | None = None,
        disk: DiskLimit | None = None,
    ) -> None:
        object.__setattr__(self, "memory", memory)
        object.__setattr__(self, "pids", pids)
        object.__setattr__(self, "cpu", cpu)
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "denials", denials)
        object.__setattr__(self, "disk", disk)


class NetworkPolicy(Frozen):
    """Egress through the gateway, and loopback ports inside the cell."""

    _fields = ("allow", "loopback_ports", "fetch_plain_http")
    __slots__ = _fields

    allow: tuple[HostRule, ...]
    """Hosts the gateway lets through (enforced by the gateway, a later layer)."""
    loopback_ports: tuple[int, ...]
    """TCP ports on the cell's own loopback that programs in it may bind and
    connect to (a test server, say). The cell has no other network."""
    fetch_plain_http: bool
    """Whether the broker's ``http.fetch`` may fetch ``http://`` URLs (HTTPS only by default)."""

    def __init__(
        self,
        allow: tuple[HostRule, ...] = (),
        loopback_ports: tuple[int, ...] = (),
        fetch_plain_http: bool = False,
    ) -> None:
        object.__setattr__(self, "allow", allow)
        object.__setattr__(self, "loopback_ports", loopback_ports)
        object.__setattr__(self, "fetch_plain_http", fetch_plain_http)


_NO_FILESYSTEM = FilesystemPolicy()
_NO_EXEC = ExecPolicy()
_NO_ENV = EnvPolicy()
_NO_LIMITS = Limits()
_NO_NETWORK = NetworkPolicy()


class Policy(Frozen):
    """One agent's policy. Build it with ``load_policy`` or ``default_policy``."""

    _fields = (
        "name",
        "command",
        "mode",
        "workspace",
        "workdir",
        "filesystem",
        "exec",
        "env",
        "limits",
        "network",
        "tools",
        "llm",
        "secrets",
        "source",
        "image",
        "user",
    )
    __slots__ = _fields

    name: str
    command: tuple[str, ...]
    mode: Mode
    workspace: str | None
    """Absolute path of the workspace; ``None`` means a fresh temporary one."""
    workdir: str | None
    """Working directory inside the cell; ``None`` means the workspace."""
    filesystem: FilesystemPolicy
    exec: ExecPolicy
    env: EnvPolicy
    limits: Limits
    network: NetworkPolicy
    tools: tuple[ToolRule, ...]
    llm: LlmPolicy | None
    secrets: tuple[SecretPolicy, ...]
    source: str | None
    """The file this policy came from, for messages; ``None`` when built in code."""
    image: str | None
    """A workbench image reference (``name:tag``, ``sha256:…``) whose root
    filesystem is the cell's ``/`` (cell/_plan.py, docs/CELL.md); ``None``:
    the host's own system directories."""
    user: str | None
    """Who the command runs as inside the cell: ``root`` (uid 0 of the cell's
    user namespace, an unprivileged range on the host), a user name of the
    image's ``/etc/passwd`` or a number; ``None``: the image's own user, or
    the agent (uid 1000) without an image."""

    def __init__(
        self,
        name: str,
        command: tuple[str, ...] = (),
        mode: Mode = "enforce",
        workspace: str | None = None,
        workdir: str | None = None,
        filesystem: FilesystemPolicy = _NO_FILESYSTEM,
        exec: ExecPolicy = _NO_EXEC,
        env: EnvPolicy = _NO_ENV,
        limits: Limits = _NO_LIMITS,
        network: NetworkPolicy = _NO_NETWORK,
        tools: tuple[ToolRule, ...] = (),
        llm: LlmPolicy | None = None,
        secrets: tuple[SecretPolicy, ...] = (),
        source: str | None = None,
        image: str | None = None,
        user: str | None = None,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "workdir", workdir)
        object.__setattr__(self, "filesystem", filesystem)
        object.__setattr__(self, "exec", exec)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "limits", limits)
        object.__setattr__(self, "network", network)
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "llm", llm)
        object.__setattr__(self, "secrets", secrets)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "image", image)
        object.__setattr__(self, "user", user)
