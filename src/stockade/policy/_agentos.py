"""AgentOS manifests: their format, and what each of their fields means here.

AgentOS (github.com/Harrishayy/AgentOS) describes an agent with flat keys,
``allowed_hosts``, ``allowed_paths``, ``allowed_bins``, ``forbidden_caps``,
``working_dir``, ``env``, ``mode``…; ``_load`` recognises a manifest by those
keys and loads it unchanged into the same ``Policy`` a stockade file would give:

=================  ===========================================================
``allowed_paths``  ``filesystem.write`` (AgentOS grants any kind of open);
                   an entry inside a system directory stays read-only, in
                   ``filesystem.read``; the system directories, secrets and
                   protected files of ``base: system`` apply as always
``allowed_bins``   ``exec.allow``
``allowed_hosts``  ``network.allow`` (``host[:port]``, IP, CIDR; port 443)
``forbidden_caps`` validated; a cell holds no capability at all
``working_dir``    ``workdir``
``env``            ``env.set``, after ``${VAR}`` expansion
``timeout``        ``limits.timeout`` (absent or ``0``: no timeout)
``user``           validated; a cell never runs as host root, stockade picks
                   its unprivileged uid itself
``stdin``          validated; ``stockade exec`` passes its own stdin
=================  ===========================================================

The table in docs/POLICY.md is the reference; keep the two in step.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, WithJsonSchema

from stockade.policy._default import DEFAULT_LIMITS, PROTECT, SECRETS_DENY, SYSTEM_READ
from stockade.policy._model import (
    ExecPolicy,
    FilesystemPolicy,
    HostRule,
    Limits,
    NetworkPolicy,
    Policy,
)
from stockade.policy._schema import (
    AbsDir,
    Command,
    EnvName,
    EnvValue,
    HostRuleSection,
    Name,
    PathPattern,
    Problem,
    Problems,
    Program,
    _checked,
    _host_entry,
    _Section,
    covered_by,
    default_env,
    fail,
)
from stockade.policy._units import parse_duration, show

AGENTOS_KEYS = (
    "name",
    "command",
    "mode",
    "allowed_hosts",
    "allowed_paths",
    "allowed_bins",
    "forbidden_caps",
    "working_dir",
    "env",
    "user",
    "stdin",
    "timeout",
    "description",
    "id",
)
"""Every key of an AgentOS manifest or policy, in AgentOS's own order."""

AGENTOS_ONLY = frozenset(AGENTOS_KEYS) - {"name", "command", "mode", "env", "description", "user"}
"""Keys that mark a file as AgentOS: stockade has no key of these names
(``user`` is a key of both: a workbench's user in stockade's format)."""

STOCKADE_EQUIVALENT: dict[str, tuple[str | None, str]] = {
    "allowed_hosts": ("network.allow", ""),
    "allowed_paths": ("filesystem.write", ""),
    "allowed_bins": ("exec.allow", ""),
    "working_dir": ("workdir", ""),
    "timeout": ("limits.timeout", ""),
    "forbidden_caps": (None, "a cell holds no capability at all"),
    "user": (None, "stockade picks the cell's unprivileged uid itself"),
    "stdin": (None, "stockade exec passes its own stdin"),
    "id": (None, "stockade names a policy by its name"),
}
"""What to write in a stockade file instead of each AgentOS-only key."""

CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)
"""capabilities(7), in bit order (0 … 40, Linux 5.9+)."""

_USER = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_-]{0,31}$")


def _capability(value: str) -> str:
    if value in CAPABILITIES:
        return value
    close = difflib.get_close_matches(value.upper(), CAPABILITIES, n=1, cutoff=0.7)
    hint = f"did you mean {show(close[0])}?" if close else "see capabilities(7) for the names"
    raise ValueError(f"{show(value)} is not a capability name; {hint}")


def _user(value: str) -> str:
    if value.isdigit():
        if int(value) > 2**31 - 1:
            raise ValueError(f"{show(value)} is not a valid uid; write a number below 2147483648")
        return value
    if not _USER.match(value):
        raise ValueError(
            f"{show(value)} is not a user name or uid; write a name such as 'nobody' or a uid such as '65534'"
        )
    return value


def _stdin(value: str) -> str:
    if value in ("inherit", "close"):
        return value
    if value.startswith("file:/") and "\x00" not in value:
        return value
    raise ValueError(f"{show(value)} is not a stdin mode; write 'inherit', 'close' or 'file:/path'")


def _timeout(value: object) -> float | None:
    """AgentOS reads ``0`` (or nothing) as no timeout."""
    if value is None or value == "" or value == "0" or (value == 0 and not isinstance(value, bool)):
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        fail(str(exc))
    return seconds or None


def _host(value: object) -> object:
    if not isinstance(value, str):
        fail(f"{show(value)} is not a host; write 'host[:port]', such as 'api.example.com:443'")
    return _host_entry(value)


def _id(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


AgentOSHost = Annotated[
    HostRuleSection,
    BeforeValidator(_host),
    WithJsonSchema({"type": "string", "description": "host[:port], IP or CIDR; the port defaults to 443"}),
]
Capability = Annotated[str, AfterValidator(_checked(_capability))]


class AgentOSManifest(_Section):
    """An AgentOS agent manifest (or an AgentOS policy, which has ``id`` and no ``command``)."""

    model_config = ConfigDict(title="AgentOS manifest", strict=True, extra="forbid", frozen=True)

    name: Name
    command: Command | None = None
    mode: Literal["enforce", "audit", ""] = "enforce"
    allowed_hosts: list[AgentOSHost] = Field(default_factory=list)
    allowed_paths: list[PathPattern] = Field(default_factory=list)
    allowed_bins: list[Program] = Field(default_factory=list)
    forbidden_caps: list[Capability] = Field(default_factory=list)
    working_dir: AbsDir | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    user: Annotated[str, AfterValidator(_checked(_user))] | None = None
    stdin: Annotated[str, AfterValidator(_checked(_stdin))] | None = None
    timeout: Annotated[
        float | None,
        BeforeValidator(_timeout),
        WithJsonSchema({"type": ["string", "number"], "description": "'30s', '5m', '1h'; 0: none"}),
    ] = None
    description: str | None = None
    id: Annotated[str, BeforeValidator(_id)] | None = None


def to_policy(manifest: AgentOSManifest, *, source: str | None) -> Policy:
    """The ``Policy`` that means what ``manifest`` means to AgentOS.

    Raises:
        Problems: an allowed path lies inside a path stockade always hides.
    """
    problems: list[Problem] = []
    read: list[str] = list(SYSTEM_READ)
    write: list[str] = []
    for index, path in enumerate(manifest.allowed_paths):
        hidden = covered_by(path, SECRETS_DENY)
        if hidden is not None:
            problems.append(
                Problem(
                    ("allowed_paths", index),
                    f"{show(path)} is inside {show(hidden)}, which stockade always hides as a "
                    "secret; remove it",
                )
            )
        elif covered_by(path, SYSTEM_READ) is not None:
            read.append(path)  # the system directories stay read-only
        else:
            write.append(path)
    if problems:
        raise Problems(problems)
    rules = tuple(
        HostRule(
            host=rule.host,
            ports=tuple(rule.ports),
            methods=tuple(rule.methods),
            paths=tuple(rule.paths),
        )
        for rule in manifest.allowed_hosts
    )
    limits = DEFAULT_LIMITS
    return Policy(
        name=manifest.name,
        command=tuple(manifest.command or ()),
        mode="audit" if manifest.mode == "audit" else "enforce",
        workdir=manifest.working_dir,
        filesystem=FilesystemPolicy(
            read=tuple(dict.fromkeys(read)),
            write=tuple(dict.fromkeys(write)),
            deny=SECRETS_DENY,
            protect=PROTECT,
        ),
        exec=ExecPolicy(allow=tuple(dict.fromkeys(manifest.allowed_bins))),
        env=default_env(base="default", passthrough=(), values=manifest.env),
        limits=Limits(
            memory=limits.memory,
            pids=limits.pids,
            cpu=limits.cpu,
            timeout=manifest.timeout,
            output=limits.output,
        ),
        network=NetworkPolicy(allow=rules),
        source=source,
    )


__all__ = [
    "AGENTOS_KEYS",
    "AGENTOS_ONLY",
    "CAPABILITIES",
    "STOCKADE_EQUIVALENT",
    "AgentOSManifest",
    "to_policy",
]
