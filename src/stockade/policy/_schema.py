"""The policy file format: pydantic models, the grammar of its values, its units.

This is the trust boundary between a user's file and the frozen dataclasses of
``_model``. The models here validate the shape and every single value (a path,
a size, a host pattern); ``_load`` maps their errors back to ``file:line:col``
and turns a valid model into a ``Policy``.

A validator's message starts with the offending value and ends with the fix
(``'etc' is relative; write an absolute path, starting with '/'``); the loader
puts the field's dotted name in front of it.

Importing this module imports pydantic: only ``_load`` and ``_agentos`` do.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from stockade.policy._default import DEFAULT_LIMITS, DEFAULT_PASSTHROUGH, DEFAULT_PATH
from stockade.policy._match import normalize_host_pattern
from stockade.policy._model import FRAMING_HEADERS, EnvPolicy
from stockade.policy._units import (  # the grammar of values, shared with the CLI's flags
    DURATION_PATTERN,
    SIZE_PATTERN,
    format_duration,
    format_size,
    parse_cpu,
    parse_duration,
    parse_size,
    show,
)

T = TypeVar("T")
PathKey = tuple[str | int, ...]
"""Where a value is in the document: keys and list indices from the top."""

Intent = Literal[
    "fs.read",
    "fs.write",
    "fs.list",
    "exec",
    "ask",
    "http.fetch",
    "llm.chat",
    "agent.spawn",
    "agent.send",
    "agent.recv",
]
INTENTS: tuple[str, ...] = get_args(Intent)
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE")
LLM_BASE_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}

# --------------------------------------------------------------------------- errors


def fail(detail: str) -> NoReturn:
    """Raise the validation error the loader turns into ``<field> <detail>``."""
    raise PydanticCustomError("policy", "{detail}", {"detail": detail})


def _checked(check: Callable[[Any], T]) -> Callable[[Any], T]:
    """Wrap a pure ``check`` that raises ``ValueError`` into a pydantic validator."""

    def validator(value: Any) -> T:
        try:
            return check(value)
        except ValueError as exc:
            fail(str(exc))

    return validator


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a file, placed by where it is in the document."""

    path: PathKey
    detail: str
    """Starts with the offending value; the loader puts the field's name in front."""
    at_key: bool = False
    """Point at the key of ``path`` rather than its value."""
    offset: int = 0
    """Characters into a one-line scalar where the problem is (a ``${`` in it)."""
    at: tuple[int, int] | None = None
    """Line and column (from 1) when the path alone cannot say (a duplicate key)."""


class Problems(Exception):
    """Internal: raised by a conversion to ``Policy``; the loader turns it into a ``PolicyError``."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems)
        self.problems = problems


# ---------------------------------------------------------------------------- units

# ---------------------------------------------------------------------------- paths

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def normalize_path(path: str) -> str:
    """Collapse ``//`` and ``/./`` and drop a trailing ``/``; never resolves ``..``."""
    absolute = path.startswith("/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    joined = "/".join(parts)
    return "/" + joined if absolute else joined


def check_path(value: str, *, relative: bool = False, dotdot: bool = False) -> str:
    """Validate and normalise a path or path glob of the filesystem lists.

    Globs may use ``*``, ``?`` and ``[...]`` within one component; ``**`` is
    refused, since a directory already stands for its whole tree.

    Raises:
        ValueError: the path is unusable; the message says how to write it.
    """
    if not value:
        raise ValueError("'' is empty; write a path, starting with '/'")
    if "\x00" in value:
        raise ValueError(f"{show(value)} contains a NUL byte, which no path can; remove it")
    if _CONTROL.search(value):
        raise ValueError(f"{show(value)} contains a control character; remove it")
    if value.startswith("~"):
        raise ValueError(
            f"{show(value)} starts with '~', which stockade does not expand; write the absolute "
            f"path, or {show('${HOME}' + value[1:])}"
        )
    if not relative and not value.startswith("/"):
        raise ValueError(f"{show(value)} is relative; write an absolute path, starting with '/'")
    parts = value.split("/")
    if ".." in parts and not dotdot:
        raise ValueError(
            f"{show(value)} contains '..', which could lead anywhere through a symbolic link; "
            "write the path without it"
        )
    if "**" in value:
        before = value.split("**", 1)[0]
        tree = before if before.endswith("/") else posixpath.dirname(before) + "/"
        raise ValueError(
            f"{show(value)} uses '**', which paths do not support; a directory stands for its "
            f"whole tree, so write {show(tree.replace('//', '/'))}"
        )
    if len(value) > 4095:
        raise ValueError(f"{show(value)} is longer than 4095 bytes, the limit of a path; shorten it")
    normalized = posixpath.normpath(value) if dotdot else normalize_path(value)
    if relative and not normalized:
        raise ValueError(f"{show(value)} names the workspace itself; name a path inside it")
    return normalized


def _relative_ok(value: str) -> str:
    return check_path(value, relative=True)


def check_dir(value: str) -> str:
    """An absolute directory, not a glob."""
    if is_glob(value):
        raise ValueError(f"{show(value)} is a glob; name one directory")
    return check_path(value)


def _abs_file(value: str) -> str:
    """An absolute file path, not a glob."""
    if is_glob(value):
        raise ValueError(f"{show(value)} is a glob; name one file")
    return check_path(value)


def _program(value: str) -> str:
    if is_glob(value):
        raise ValueError(
            f"{show(value)} is a glob, which exec.allow does not take; list each program, "
            "or the directory that holds them"
        )
    return check_path(value)


def _workspace(value: str) -> str:
    """The workspace may be relative to the policy file's directory, ``..`` included."""
    if is_glob(value):
        raise ValueError(f"{show(value)} is a glob; name one directory")
    return check_path(value, relative=True, dotdot=True)


def is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def _glob_covers(pattern: str, path: str) -> bool:
    """Whether the glob ``pattern`` matches ``path`` or one of its parents."""
    import fnmatch

    pat = pattern.strip("/").split("/")
    parts = path.strip("/").split("/")
    return len(parts) >= len(pat) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pat, strict=False))


def covered_by(path: str, entries: Iterable[str]) -> str | None:
    """The first of ``entries`` that is ``path`` or a parent of it (globs allowed)."""
    for entry in entries:
        if is_glob(entry):
            if _glob_covers(entry, path):
                return entry
        elif entry == "/" or path == entry or path.startswith(entry + "/"):
            return entry
    return None


# --------------------------------------------------------------------- small values

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOOL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{show(value)} is not a valid name; use up to 63 letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, such as 'my-agent'"
        )
    return value


def check_env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(
            f"{show(value)} is not a variable name; use letters, digits and '_', not starting with a digit"
        )
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{show(value)} contains a NUL byte, which cannot be passed to a program; remove it")
    return value


def _tool_id(value: str) -> str:
    if not _TOOL_ID.match(value):
        raise ValueError(
            f"{show(value)} is not a valid rule id; use letters, digits, '.', '_', ':' and '-', "
            "such as 'read-docs'"
        )
    return value


def _arg_name(value: str) -> str:
    if not _ARG_NAME.match(value):
        raise ValueError(
            f"{show(value)} is not an argument name; use letters, digits, '_' and '.', such as 'path'"
        )
    return value


def _method(value: str) -> str:
    upper = value.upper()
    if upper not in HTTP_METHODS:
        import difflib

        close = difflib.get_close_matches(upper, HTTP_METHODS, n=1)
        fix = f"did you mean {show(close[0])}?" if close else f"use one of {', '.join(HTTP_METHODS)}"
        raise ValueError(f"{show(value)} is not an HTTP method; {fix}")
    return upper


# RFC 9110 5.1: a field name is a token.
_HEADER_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Headers the gateway owns or drops on the way (framing, hop-by-hop, the
# proxy's own): a secret put there would never arrive, or would change the framing.
_SECRET_HEADERS_REFUSED = FRAMING_HEADERS | {"expect"}  # the proxy answers 100-continue itself


def _secret_header(value: str) -> str:
    if not _HEADER_TOKEN.match(value):
        raise ValueError(
            f"{show(value)} is not an HTTP header name; write a name of letters, digits and '-', "
            "such as 'Authorization' or 'X-Api-Key'"
        )
    if value.lower() in _SECRET_HEADERS_REFUSED:
        raise ValueError(
            f"{show(value)} is a header the gateway sets or drops itself, so a secret cannot go there; "
            "name the header the service reads its key from, such as 'Authorization'"
        )
    return value


def _url_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{show(value)} does not start with '/'; write a URL path such as '/v1/'")
    if _CONTROL.search(value) or " " in value or "?" in value or "#" in value:
        raise ValueError(
            f"{show(value)} is not a plain URL path; write the path alone, without spaces, query or fragment"
        )
    if "*" in value:
        raise ValueError(
            f"{show(value)} holds a '*', but paths are prefixes already; write {show(value.split('*', 1)[0])}"
        )
    return value


def _port(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{show(value)} is not a port; write a number from 1 to 65535")
    if not 1 <= value <= 65535:
        raise ValueError(f"{value} is not a port; write a number from 1 to 65535")
    return value


def _ports(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return list(dict.fromkeys(value)) if all(isinstance(v, int) for v in value) else value
    return value


def _url(value: str) -> str:
    hint = "write a URL such as 'https://api.openai.com/v1'"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"{show(value)} is not a valid URL; {hint}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{show(value)} is not an http or https URL; {hint}")
    if parts.username or parts.password:
        raise ValueError(
            f"{show(value)} holds a user name or password; remove it and name the key's "
            "variable in llm.api_key_env"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"{show(value)} has a query or fragment; {hint}")
    return value.rstrip("/")


def _command(value: object) -> object:
    """A string command runs through ``/bin/sh -c``; a list is the argv itself."""
    if isinstance(value, str):
        if not value.strip():
            fail(
                f"{show(value)} is empty; write the program and its arguments, or leave command "
                "out to give it on the command line"
            )
        if "\x00" in value:
            fail(f"{show(value)} contains a NUL byte, which cannot be passed to a program; remove it")
        return ["/bin/sh", "-c", value]
    if isinstance(value, list):
        if not value:
            fail(
                "[] is empty; list the program and its arguments, such as ['python3', 'agent.py'], "
                "or leave command out to give it on the command line"
            )
        if value[0] == "":
            fail("'' is an empty program name; write the program first, then its arguments")
    return value


def _limit(
    parse: Callable[[object], T], *, minimum: float = 0, what: str = ""
) -> Callable[[object], T | None]:
    """A limit: a value, or ``null``/``'unlimited'`` for no limit of that kind."""

    def validator(value: object) -> T | None:
        if value is None or (isinstance(value, str) and value.strip().lower() == "unlimited"):
            return None
        try:
            parsed = parse(value)
        except ValueError as exc:
            fail(str(exc))
        if parsed < minimum:  # type: ignore[operator]
            fail(what.format(value=show(value)))
        return parsed

    return validator


def _pids(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        raise ValueError(f"{show(value)} is text, not a number; write it without quotes: {value.strip()}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{show(value)} is not a whole number; write a number of processes such as 512")
    if value > PID_MAX_LIMIT:
        raise ValueError(
            f"{value} is more than the kernel's limit of {PID_MAX_LIMIT} processes; "
            "write a smaller number, or 'unlimited'"
        )
    return value


PID_MAX_LIMIT = 4 * 1024 * 1024
"""The most processes Linux can have (``PID_MAX_LIMIT`` on 64-bit, include/linux/threads.h)."""


def _files(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        raise ValueError(f"{show(value)} is text, not a number; write it without quotes: {value.strip()}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{show(value)} is not a whole number; write a number of files such as 100000")
    if value > 2**31 - 1:
        # tmpfs's nr_inodes is an unsigned long, but past 2^31 it is no limit worth the name.
        raise ValueError(f"{value} is more than {2**31 - 1} files; write a smaller number, or 'unlimited'")
    return value

_IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")


def _image_ref(value: str) -> str:
    if not _IMAGE_REF.match(value):
        raise ValueError(
            f"{show(value)} is not an image reference; write a name:tag given at `stockade image "
            "import` or `build` (such as 'task:latest'), or a digest such as 'sha256:3f2a…'"
        )
    return value


def _cell_user(value: object) -> str:
    if isinstance(value, bool):
        raise ValueError(f"{show(value)} is not a user; write root, a user name of the image, or a uid")
    if isinstance(value, int):
        if not 0 <= value <= 65534:
            raise ValueError(f"{value} is outside the cell's ids 0 to 65534; write a uid in that range")
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{show(value)} is not a user; write root, a user name of the image, or a uid")
    if value.isdigit():
        return _cell_user(int(value))
    if not _USER_NAME.match(value):
        raise ValueError(
            f"{show(value)} is not a user name (lower-case letters, digits, '_', '-', '.'); "
            "write root, a user name of the image's /etc/passwd, or a uid"
        )
    return value


# ------------------------------------------------------------------- annotated types

PathPattern = Annotated[str, AfterValidator(_checked(check_path))]
ProtectPattern = Annotated[str, AfterValidator(_checked(_relative_ok))]
AbsDir = Annotated[str, AfterValidator(_checked(check_dir))]
AbsFile = Annotated[str, AfterValidator(_checked(_abs_file))]
Program = Annotated[str, AfterValidator(_checked(_program))]
WorkspaceDir = Annotated[str, AfterValidator(_checked(_workspace))]
Name = Annotated[str, AfterValidator(_checked(check_name))]
ImageRef = Annotated[str, AfterValidator(_checked(_image_ref))]
CellUser = Annotated[
    str,
    BeforeValidator(_checked(_cell_user)),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 65534}],
            "description": "root, a user name of the image's /etc/passwd, or a uid.",
        }
    ),
]
EnvName = Annotated[str, AfterValidator(_checked(check_env_name))]
EnvValue = Annotated[str, AfterValidator(_checked(_no_nul))]
CommandArg = Annotated[str, AfterValidator(_checked(_no_nul))]
Port = Annotated[
    int,
    BeforeValidator(_checked(_port)),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 65535}),
]
PortList = Annotated[list[Port], BeforeValidator(_ports)]
HttpMethod = Annotated[str, AfterValidator(_checked(_method))]
UrlPath = Annotated[str, AfterValidator(_checked(_url_path))]
SecretHeader = Annotated[str, AfterValidator(_checked(_secret_header))]
HostPattern = Annotated[str, AfterValidator(_checked(normalize_host_pattern))]
ToolId = Annotated[str, AfterValidator(_checked(_tool_id))]
ArgName = Annotated[str, AfterValidator(_checked(_arg_name))]
Url = Annotated[str, AfterValidator(_checked(_url))]

Command = Annotated[
    list[CommandArg],
    BeforeValidator(_command),
    WithJsonSchema(
        {
            "description": "The program and its arguments, or one string run by /bin/sh -c.",
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
            ],
        }
    ),
]

_UNLIMITED: list[dict[str, Any]] = [{"const": "unlimited"}, {"type": "null"}]
SIZE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": SIZE_PATTERN},
        *_UNLIMITED,
    ]
}
DURATION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": DURATION_PATTERN},
        *_UNLIMITED,
    ]
}

MemoryLimit = Annotated[
    int | None,
    BeforeValidator(
        _limit(
            parse_size,
            minimum=1024**2,
            what="{value} is less than 1 MiB; write a unit, such as '512M'",
        )
    ),
    WithJsonSchema({**SIZE_SCHEMA, "description": "Memory for the whole cell: '512M', '2G' or bytes."}),
]
OutputLimit = Annotated[
    int | None,
    BeforeValidator(_limit(parse_size)),
    WithJsonSchema({**SIZE_SCHEMA, "description": "Bytes of stdout + stderr kept: '64M'."}),
]
DiskBytes = Annotated[
    int | None,
    BeforeValidator(
        _limit(
            parse_size,
            minimum=1024**2,
            what="{value} is less than 1 MiB; write a unit, such as '1G'",
        )
    ),
    WithJsonSchema({**SIZE_SCHEMA, "description": "Bytes of /tmp and of a fresh workspace: '1G', or bytes."}),
]
DiskFiles = Annotated[
    int | None,
    BeforeValidator(
        _limit(_files, minimum=16, what="{value} is less than 16; write a number of files such as 100000")
    ),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 16, "maximum": 2**31 - 1}, *_UNLIMITED],
            "description": "Files (inodes) of /tmp and of a fresh workspace, each.",
        }
    ),
]
PidsLimit = Annotated[
    int | None,
    BeforeValidator(
        _limit(_pids, minimum=1, what="{value} is less than 1; write a number of processes such as 512")
    ),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 1, "maximum": PID_MAX_LIMIT}, *_UNLIMITED],
            "description": "Processes and threads alive at once.",
        }
    ),
]


def _denials(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        raise ValueError(f"{show(value)} is text, not a number; write it without quotes: {value.strip()}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{show(value)} is not a whole number; write a number of denials such as 10")
    return value


DenialsLimit = Annotated[
    int | None,
    BeforeValidator(
        _limit(_denials, minimum=1, what="{value} is less than 1; write a number of denials such as 10")
    ),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer", "minimum": 1}, *_UNLIMITED],
            "description": "The tripwire: denials of the broker after which the run halts.",
        }
    ),
]
CpuLimit = Annotated[
    float | None,
    BeforeValidator(_limit(parse_cpu)),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": r"^ *(\d+(\.\d+)?|\.\d+) *%?$"},
                *_UNLIMITED,
            ],
            "description": "CPU as cores (0.5, 2) or a percentage of one core ('50%').",
        }
    ),
]
TimeoutLimit = Annotated[
    float | None,
    BeforeValidator(
        _limit(
            parse_duration,
            minimum=1e-3,
            what="{value} is less than a millisecond; write a duration such as '30s', "
            "or 'unlimited' for none",
        )
    ),
    WithJsonSchema({**DURATION_SCHEMA, "description": "Wall-clock time: '30s', '5m', '1h' or seconds."}),
]


def _host_entry(value: object) -> object:
    """The short form ``host[:port]`` becomes ``{host, ports}``."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "://" in text:
        return {"host": text}
    if text.startswith("["):
        host, sep, rest = text.partition("]")
        host += sep
        if rest and not rest.startswith(":"):
            fail(f"{show(value)} is not 'host:port'; write an IPv6 address as '[2001:db8::1]:443'")
        port = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, None
    if port is None:
        return {"host": host}
    if not port.isdigit():
        fail(f"{show(value)} has the port {show(port)}, which is not a number; write a port from 1 to 65535")
    return {"host": host, "ports": [int(port)]}


class _ShortHostForm:
    """In the JSON Schema, an entry is a ``host[:port]`` string or the mapping."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        return {
            "anyOf": [
                {"type": "string", "description": "host[:port]; the port defaults to 443"},
                handler(core_schema),
            ]
        }


# -------------------------------------------------------------------------- models


class _Section(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FilesystemSection(_Section):
    base: Literal["system", "none"] = Field(
        "system",
        description="'system' adds the default policy's system read dirs, secrets deny list "
        "and protect list to the lists below; 'none' uses only the lists below.",
    )
    read: list[PathPattern] = Field(default_factory=list, description="Shown read-only.")
    write: list[PathPattern] = Field(default_factory=list, description="Shown read-write.")
    deny: list[PathPattern] = Field(
        default_factory=list, description="Hidden, even inside a read or write path."
    )
    protect: list[ProtectPattern] = Field(
        default_factory=list,
        description="Read-only inside writable paths, even before they exist; "
        "relative entries are inside the workspace.",
    )
    mounts: list[MountSection] = Field(
        default_factory=list,
        description="Host paths shown at other paths inside: [{source, target, mode: ro|rw}].",
    )


class MountSection(_Section):
    source: AbsFile = Field(description="The host path shown (a directory or a file); it must exist.")
    target: AbsFile = Field(description="Where the cell sees it.")
    mode: Literal["ro", "rw"] = Field("ro", description="Read-only (ro) or read-write (rw).")


class ExecSection(_Section):
    allow: list[Program] = Field(
        default_factory=list,
        description="Absolute paths of the programs the cell may run (a directory: every "
        "program under it); empty means any readable file.",
    )


class EnvSection(_Section):
    base: Literal["default", "none"] = Field(
        "default",
        description="'default' passes TERM, LANG, LC_ALL, TZ and sets PATH; 'none' starts empty.",
    )
    pass_: list[EnvName] = Field(
        default_factory=list, alias="pass", description="Names copied from the caller, if set."
    )
    set_: dict[EnvName, EnvValue] = Field(
        default_factory=dict, alias="set", description="Names set to these values."
    )


def _default_limit(name: str) -> Any:
    """A limit left out takes the default policy's value (not ``None``): say so in the schema."""
    value = getattr(DEFAULT_LIMITS, name)
    shown: str | int | float
    if value is None:
        shown = "unlimited"
    elif name in ("memory", "output"):
        shown = format_size(value).replace(" ", "").replace("iB", "")
    elif name == "timeout":
        shown = format_duration(value)
    else:
        shown = value
    return Field(None, json_schema_extra={"default": shown})


class DiskSection(_Section):
    """The cell's own /tmp and a fresh workspace: filesystems the kernel keeps to these sizes."""

    bytes: DiskBytes = None
    files: DiskFiles = None


class LimitsSection(_Section):
    """Each limit left out takes the default policy's value; null or 'unlimited' means none."""

    memory: MemoryLimit = _default_limit("memory")
    pids: PidsLimit = _default_limit("pids")
    cpu: CpuLimit = _default_limit("cpu")
    timeout: TimeoutLimit = _default_limit("timeout")
    output: OutputLimit = _default_limit("output")
    denials: DenialsLimit = _default_limit("denials")
    disk: Annotated[
        DiskSection | None,
        Field(
            description="The cell's /tmp and a fresh workspace, each: {bytes: '1G', files: 100000}; "
            "enforced by the kernel (a tmpfs, an ext4 image of their own) and recorded when reached. "
            "A given workspace cannot be limited: the policy is refused."
        ),
    ] = None


class HostRuleSection(_Section):
    host: HostPattern = Field(
        description="A DNS name, '*.example.com' (one label), '**.example.com' (one or more), "
        "an IP address or a CIDR network."
    )
    ports: PortList = Field(default_factory=lambda: [443], min_length=1)
    methods: list[HttpMethod] = Field(default_factory=list, description="Empty means any.")
    paths: list[UrlPath] = Field(default_factory=list, description="URL path prefixes; empty means any.")


HostEntry = Annotated[HostRuleSection, BeforeValidator(_host_entry), _ShortHostForm()]


class NetworkSection(_Section):
    allow: list[HostEntry] = Field(
        default_factory=list,
        description="Hosts the gateway lets through; everything else is refused.",
    )
    loopback_ports: list[Port] = Field(
        default_factory=list,
        description="TCP ports programs in the cell may bind and connect to on its own loopback.",
    )
    fetch_plain_http: bool = Field(
        False, description="Whether the broker's http.fetch may fetch http:// URLs (HTTPS only by default)."
    )


class SecretSection(_Section):
    name: EnvName = Field(description="The variable the cell sees; it holds a placeholder, never the value.")
    env: EnvName | None = Field(None, description="The daemon's environment variable holding the value.")
    file: AbsFile | None = Field(None, description="Or a file on the daemon's host holding the value.")
    hosts: list[HostPattern] = Field(
        min_length=1,
        description="Hosts the value may be sent to (the grammar of network.allow); the gateway "
        "puts it in place of the placeholder only in requests to these.",
    )
    headers: list[SecretHeader] = Field(
        default_factory=lambda: ["Authorization"],
        min_length=1,
        description="Request headers the placeholder may stand in (case-insensitive); a placeholder "
        "in any other header is refused.",
    )
    body: bool = Field(
        False, description="Whether the placeholder may stand in a request body (refused by default)."
    )
    url: bool = Field(
        False, description="Whether the placeholder may stand in a URL's path or query (refused by default)."
    )


class ToolRuleSection(_Section):
    id: ToolId
    intent: Intent
    verdict: Literal["allow", "deny", "ask"]
    match: dict[ArgName, str] = Field(
        default_factory=dict, description="Argument name to glob; every one must match."
    )


class LlmSection(_Section):
    provider: Literal["openai", "anthropic"] = "openai"
    base_url: Url | None = Field(None, description="Defaults to the provider's own API.")
    model: str | None = None
    api_key_env: EnvName | None = Field(
        None, description="The variable of the daemon's environment that holds the API key."
    )
    max_requests: Annotated[int, Field(ge=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    remote_images: bool = Field(
        False,
        description="Whether image_url parts may name http(s) URLs, which the provider fetches; "
        "their hosts must then pass network.allow. Only data: URLs by default.",
    )


class PolicyFile(_Section):
    """A stockade policy file (one agent)."""

    model_config = ConfigDict(title="stockade policy", strict=True, extra="forbid", frozen=True)

    name: Name
    description: str | None = None
    command: Command | None = None
    mode: Literal["enforce", "audit"] = "enforce"
    workspace: WorkspaceDir | None = Field(
        None,
        description="The read-write workspace; relative to the policy file's directory; "
        "absent means a fresh temporary directory.",
    )
    workdir: AbsDir | None = Field(None, description="Working directory; absent means the workspace.")
    image: ImageRef | None = Field(
        None,
        description="A workbench image (name:tag or sha256:...) whose root filesystem is the cell's /; "
        "absent means the host's own system directories.",
    )
    user: CellUser | None = Field(
        None,
        description="Who the command runs as inside: root (uid 0 of the cell's user namespace, never "
        "host root), a user name of the image's /etc/passwd, or a uid; absent means the image's "
        "user, or the agent (uid 1000).",
    )
    filesystem: FilesystemSection = Field(default_factory=lambda: FilesystemSection.model_validate({}))
    exec_: ExecSection = Field(default_factory=lambda: ExecSection(), alias="exec")
    env: EnvSection = Field(default_factory=lambda: EnvSection.model_validate({}))
    limits: LimitsSection = Field(default_factory=lambda: LimitsSection())
    network: NetworkSection = Field(default_factory=lambda: NetworkSection.model_validate({}))
    tools: list[ToolRuleSection] = Field(
        default_factory=list, description="Broker rules: per intent, first match wins, no match is a deny."
    )
    llm: LlmSection | None = Field(None, description="Where the cell's LLM endpoint forwards.")
    secrets: list[SecretSection] = Field(
        default_factory=list, description="Secrets the gateway adds on the way out, only toward their hosts."
    )
    schema_: str | None = Field(None, alias="$schema", description="Ignored; for editors.")


STOCKADE_KEYS = tuple((field.alias or name) for name, field in PolicyFile.model_fields.items())


# ------------------------------------------------------------- shared by both formats


def default_env(
    *, base: Literal["default", "none"], passthrough: Iterable[str], values: dict[str, str]
) -> EnvPolicy:
    """The cell's environment: the defaults of ``base``, then the file's names.

    What the file says wins over a default: a name the file passes is no longer
    set by default (``PATH``), and a name it sets is no longer passed (``TERM``).
    """
    names = list(DEFAULT_PASSTHROUGH) if base == "default" else []
    setting = {"PATH": DEFAULT_PATH} if base == "default" else {}
    explicit = list(dict.fromkeys(passthrough))
    for name in explicit:
        setting.pop(name, None)
        if name not in names:
            names.append(name)
    for name, value in values.items():
        setting[name] = value
        if name in names and name not in explicit:
            names.remove(name)
    return EnvPolicy(passthrough=tuple(names), set=tuple(setting.items()))
