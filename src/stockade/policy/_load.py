"""Loading a policy file: YAML with a mark on every key and value, precise errors.

The steps, each of which can fail with a ``PolicyError`` that names
``file:line:col``, the offending value and the fix:

1. read the file (UTF-8, at most 1 MiB);
2. compose the YAML and walk it into plain data (``_yaml``, shared with scenario
   files), recording where every key and
   value is, refusing duplicate keys, unknown tags and alias bombs;
3. tell the format by its keys: stockade, or an AgentOS manifest (``_agentos``);
4. expand ``${VAR}`` (``$${`` stays a literal ``${``);
5. validate with the pydantic models of ``_schema``, mapping each error's
   location back to the file;
6. check what only makes sense as a whole (a rule id used twice, a grant
   inside a hidden path…) and build the frozen ``Policy``.

The first problem is the error; every other one is attached as a note
(``exc.__notes__``), so a user can fix them all in one go.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from stockade.errors import PolicyError
from stockade.policy import _agentos
from stockade.policy._default import DEFAULT_LIMITS, PROTECT, SECRETS_DENY, SYSTEM_READ
from stockade.policy._model import (
    DiskLimit,
    ExecPolicy,
    FilesystemPolicy,
    HostRule,
    Limits,
    LlmPolicy,
    MountRule,
    NetworkPolicy,
    Policy,
    SecretPolicy,
    ToolRule,
)
from stockade.policy._schema import (
    LLM_BASE_URLS,
    STOCKADE_KEYS,
    DiskSection,
    PathKey,
    PolicyFile,
    Problem,
    Problems,
    covered_by,
    default_env,
)
from stockade.policy._units import show
from stockade.policy._workspace import workspace_problem
from stockade.policy._yaml import YamlDocument, located_error, read_text
from stockade.policy._yaml import dotted as _dotted

MAX_BYTES = 1024 * 1024
"""A policy file is a few kilobytes; a larger one is a mistake (or an attack)."""
MAX_NODES = 100_000
"""YAML aliases can make a small file expand exponentially ("billion laughs")."""

Format = Literal["stockade", "agentos"]

_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXAMPLES = {
    "name": "'name: my-agent'",
    "host": "'host: api.example.com'",
    "id": "'id: read-docs'",
    "intent": "'intent: fs.read'",
    "verdict": "'verdict: ask'",
}


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A policy and the format its file was written in."""

    policy: Policy
    format: Format


# --------------------------------------------------------------------------- public


def load_policy(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Policy:
    """Load the policy file at ``path`` (stockade YAML, or an AgentOS manifest in YAML or JSON).

    ``environ`` supplies ``${VAR}`` values (default: ``os.environ``).

    Raises:
        PolicyError: the file cannot be read or is wrong; ``location`` is
            ``file:line:col`` and further problems are in ``__notes__``.
    """
    return load_policy_file(path, environ=environ).policy


def loads_policy(text: str, *, source: str = "<string>", environ: Mapping[str, str] | None = None) -> Policy:
    """Load a policy from ``text``; ``source`` names it in messages.

    A ``source`` that is not of the form ``<…>`` is taken as the file's path:
    a relative ``workspace`` is then relative to its directory, and
    ``Policy.source`` is its absolute path.

    Raises:
        PolicyError: the text is not a valid policy.
    """
    return loads_policy_text(text, source=source, environ=environ).policy


def load_policy_file(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> LoadedPolicy:
    """``load_policy``, also saying which format the file was in."""
    name = os.fspath(path)
    return loads_policy_text(_read(name), source=name, environ=environ)


def loads_policy_text(
    text: str, *, source: str = "<string>", environ: Mapping[str, str] | None = None
) -> LoadedPolicy:
    """``loads_policy``, also saying which format the text was in."""
    doc = _Document(source)
    data = doc.compose(text)
    fmt = _detect_format(doc, data)
    env = os.environ if environ is None else environ
    path = None if source.startswith("<") and source.endswith(">") else os.path.abspath(source)
    if fmt == "agentos":
        # AgentOS expands ${VAR} in env values only.
        data, problems = _expand(data, env, lambda key: len(key) == 2 and key[0] == "env")
        manifest = _validate(doc, _agentos.AgentOSManifest, data, problems, flat=True)
        try:
            policy = _agentos.to_policy(manifest, source=path)
        except Problems as exc:
            raise doc.error(exc.problems) from None
        return LoadedPolicy(policy, "agentos")
    data, problems = _expand(data, env, lambda key: True)
    model = _validate(doc, PolicyFile, data, problems)
    return LoadedPolicy(_to_policy(doc, model, path), "stockade")


def policy_json_schema(*, agentos: bool = False) -> dict[str, Any]:
    """The JSON Schema of a stockade policy file (or of an AgentOS manifest), for editors."""
    model: type[BaseModel] = _agentos.AgentOSManifest if agentos else PolicyFile
    schema = model.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://stockade.dev/schema/" + ("agentos-manifest.json" if agentos else "policy.json"),
        **schema,
    }


# ------------------------------------------------------------------------- reading


def _read(name: str) -> str:
    return read_text(name, kind="policy", max_bytes=MAX_BYTES)


# ---------------------------------------------------------------- YAML with marks


class _Document(YamlDocument):
    """A policy file's data and marks (``_yaml``), with the policy's own problems
    placed by their path."""

    def __init__(self, source: str) -> None:
        super().__init__(source, kind="policy", example="'name: my-agent'", max_nodes=MAX_NODES)

    def shown(self, path: PathKey, value: object) -> str:
        """A value as the file has it (``yes``, not ``True``)."""
        raw = self.raw.get(path)
        if raw is not None and not isinstance(value, str | list | dict):
            return raw if isinstance(value, int | float) else show(raw)
        return show(value)

    def error(self, problems: list[Problem]) -> PolicyError:
        """One ``PolicyError`` for the first problem in the file, the others as notes."""
        return located_error(
            self.source,
            [
                (
                    problem.at or self.position(problem.path, at_key=problem.at_key, offset=problem.offset),
                    f"{_dotted(problem.path)} {problem.detail}".strip(),
                )
                for problem in problems
            ],
        )


# ---------------------------------------------------------------------------- format


def _detect_format(doc: _Document, data: dict[str, Any]) -> Format:
    agentos = [key for key in data if key in _agentos.AGENTOS_ONLY]
    if not agentos:
        return "stockade"
    stockade = [key for key in data if key in STOCKADE_KEYS and key not in _agentos.AGENTOS_KEYS]
    if stockade:
        key, other = agentos[0], stockade[0]
        line = doc.position((other,), at_key=True)[0]
        equivalent, why = _agentos.STOCKADE_EQUIVALENT[key]
        fix = f"write it as {equivalent}" if equivalent else f"remove it ({why})"
        raise PolicyError(
            f"{key} is a key of AgentOS manifests, but this file also has the stockade key "
            f"{show(other)} (line {line}); {fix}, so that the whole file is in stockade's format",
            location=doc.location((key,), at_key=True),
        )
    return "agentos"


# ------------------------------------------------------------------------- ${VAR}


def _expand(
    data: Any, environ: Mapping[str, str], applies: Callable[[PathKey], bool]
) -> tuple[Any, list[Problem]]:
    """``data`` with ``${VAR}`` expanded where ``applies``, and the problems met."""
    problems: list[Problem] = []

    def walk(value: Any, path: PathKey) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, str) and "$" in value and applies(path):
            return _expand_one(value, path, environ, problems)
        return value

    return walk(data, ()), problems


def _expand_one(text: str, path: PathKey, environ: Mapping[str, str], problems: list[Problem]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$${", i):
            out.append("${")
            i += 3
            continue
        if not text.startswith("${", i):
            out.append(text[i])
            i += 1
            continue
        end = text.find("}", i)
        if end < 0:
            problems.append(
                Problem(
                    path,
                    f"{show(text)} has a '${{' with no closing '}}'; close it, or write '$${{' "
                    "for a literal '${'",
                    offset=i,
                )
            )
            return text
        inner = text[i + 2 : end]
        name, sep, default = inner.partition(":-")
        if not _VAR.fullmatch(name):
            problems.append(
                Problem(
                    path,
                    f"{show(text)} has {show('${' + inner + '}')}, which does not name a "
                    "variable; write '${NAME}' or '${NAME:-default}', or '$${' for a literal '${'",
                    offset=i,
                )
            )
            return text
        value = environ.get(name)
        if sep and not value:
            value = default
        if value is None:
            problems.append(
                Problem(
                    path,
                    f"{show(text)} uses the variable {name}, which is not set; set it, give "
                    f"a default as '${{{name}:-value}}', or write '$${{' for a literal '${{'",
                    offset=i,
                )
            )
            return text
        out.append(value)
        i = end + 1
    return "".join(out)


# ------------------------------------------------------------------------ pydantic

M = TypeVar("M", bound=BaseModel)


def _validate(
    doc: _Document,
    model: type[M],
    data: dict[str, Any],
    earlier: list[Problem],
    *,
    flat: bool = False,
) -> M:
    """Validate ``data``; raise its problems and the ``earlier`` ones together.

    With ``flat``, a problem found inside a scalar that a validator expanded
    (``allowed_hosts[0]`` into ``{host, ports}``) is reported at the scalar.
    """
    for _ in range(4):
        try:
            result = model.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
        else:
            if earlier:
                raise doc.error(earlier)
            return result
        # A plain scalar where text is wanted is taken as written: command
        # [sleep, 10], env PYTHONUNBUFFERED: 1, user: 65534.
        changed = False
        for error in errors:
            path = tuple(error["loc"])
            value = error.get("input")
            if (
                error["type"] == "string_type"
                and path in doc.raw
                and value is not None
                and not isinstance(value, str | list | dict)
            ):
                _replace(data, path, doc.raw[path])
                changed = True
        if not changed:
            found = [_problem(doc, model, error) for error in errors]
            if flat:
                found = [_flatten(doc, problem) for problem in found]
            # A value whose ${VAR} could not be expanded has said what is wrong with it.
            unexpanded = {problem.path for problem in earlier}
            found = [problem for problem in found if problem.path not in unexpanded]
            raise doc.error([*earlier, *found])
    raise AssertionError("unreachable: each round replaces at least one value")


def _flatten(doc: _Document, problem: Problem) -> Problem:
    for cut in range(len(problem.path) - 1, 0, -1):
        if problem.path[:cut] in doc.raw:
            return Problem(problem.path[:cut], problem.detail)
    return problem


def _replace(data: Any, path: PathKey, value: str) -> None:
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if value is None:
        return "empty"
    return "a " + type(value).__name__


def _problem(doc: _Document, model: type[BaseModel], error: Any) -> Problem:
    loc: list[str | int] = list(error["loc"])
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if loc and loc[-1] == "[key]":
        loc.pop()
        path = tuple(loc)
        detail = ctx.get("detail") or error["msg"]
        return Problem(path[:-1], f"key {detail}", at=doc.position(path, at_key=True))
    path = tuple(loc)
    shown = doc.shown(path, value)
    if kind == "policy":
        return Problem(path, ctx["detail"])
    if kind == "missing":
        field = str(path[-1])
        example = _EXAMPLES.get(field, f"'{field}: …'")
        return Problem(path, f"is missing; add it, as in {example}")
    if kind == "extra_forbidden":
        return Problem(path, _unknown_key(model, path), at_key=True)
    if kind == "string_type":
        if value is None:
            return Problem(path, "is empty; give it a value")
        return Problem(path, f"must be text, not {_kind(value)}; write one value, such as 'example'")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        fix = (
            f"write it without quotes: {value.strip()}"
            if isinstance(value, str) and value.strip().isdigit()
            else "write a whole number, such as 10"
        )
        return Problem(path, f"{shown} is {_kind(value)}, not a whole number; {fix}")
    if kind in ("bool_type", "bool_parsing"):
        return Problem(
            path, f"{shown} is {_kind(value)}, not true or false; write true or false, without quotes"
        )
    if kind in ("list_type", "tuple_type"):
        return Problem(
            path,
            f"must be a list, not {_kind(value)}; write each item on its own '- ' line, or as [a, b]",
        )
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        keys = _fields_at(model, path)
        example = f" (such as {', '.join(repr(k) for k in keys[:3])})" if keys else ""
        return Problem(
            path,
            f"must be a mapping, not {_kind(value)}; write its keys{example} on the lines below, indented",
        )
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        options = re.findall(r"'([^']*)'", expected)
        close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
        fix = f"did you mean {show(close[0])}?" if close else "write one of them"
        return Problem(path, f"{shown} is not one of {expected}; {fix}")
    if kind == "too_short":
        return Problem(path, "is empty; list at least one value, or remove the line")
    if kind == "greater_than_equal":
        return Problem(path, f"{shown} is less than {ctx.get('ge')}; write {ctx.get('ge')} or more")
    msg = str(error["msg"]).removeprefix("Value error, ")
    return Problem(path, f"{shown} is not valid: {msg}")


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is not None and str(origin) == "typing.Annotated":
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _fields_at(model: type[BaseModel], path: PathKey) -> list[str]:
    """The keys that the mapping at ``path`` accepts, in the order of the model."""
    current: Any = model
    for part in path:
        current = _unwrap(current)
        origin = get_origin(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {(f.alias or n): f for n, f in current.model_fields.items()}
            if part not in fields:
                return []
            current = fields[str(part)].annotation
        elif origin is list:
            current = get_args(current)[0]
        elif origin is dict:
            current = get_args(current)[1]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [(f.alias or n) for n, f in current.model_fields.items()]
    return []


def _unknown_key(model: type[BaseModel], path: PathKey) -> str:
    key = str(path[-1])
    valid = _fields_at(model, path[:-1])
    if model is PolicyFile and path[:-1] == ("env",) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return (
            f"is not a key of env; to set the variable {key}, put it under env.set "
            f"(valid keys: {', '.join(valid)})"
        )
    lowered = {k.lower(): k for k in valid}
    close = [lowered[key.lower()]] if key.lower() in lowered else difflib.get_close_matches(key, valid, n=1)
    if close:
        return f"is not a known key; did you mean {show(close[0])}? (valid keys: {', '.join(valid)})"
    return f"is not a known key; use one of {', '.join(valid)}"


# ---------------------------------------------------------------- file → Policy


def _to_policy(doc: _Document, model: PolicyFile, source: str | None) -> Policy:
    problems: list[Problem] = []

    workspace = model.workspace
    if workspace is not None and not workspace.startswith("/"):
        if source is None:
            problems.append(
                Problem(
                    ("workspace",),
                    f"{show(workspace)} is relative, and this policy was not read from a file; "
                    "write an absolute path",
                )
            )
        else:
            workspace = os.path.normpath(os.path.join(os.path.dirname(source), workspace))
    if workspace is not None and workspace.startswith("/"):
        # The one check of cell/_cell's Cell(workspace=...) and exec --workspace too.
        why = workspace_problem(workspace)
        if why is not None:
            problems.append(Problem(("workspace",), f"{show(workspace)} {why}"))

    if model.llm is not None and model.llm.api_key_env is not None:
        key = model.llm.api_key_env
        for index, name in enumerate(model.env.pass_):
            if name == key:
                problems.append(
                    Problem(
                        ("env", "pass", index),
                        f"{show(name)} is the LLM key named in llm.api_key_env, and a secret never "
                        "enters a cell (the LLM endpoint adds it on the way out); remove it from env.pass",
                    )
                )

    problems.extend(_secret_problems(model))

    fs = model.filesystem
    problems.extend(_mount_problems(model, workspace))
    system = fs.base == "system"
    read = _unique([*(SYSTEM_READ if system else ()), *fs.read])
    write = _unique(fs.write)
    deny = _unique([*(SECRETS_DENY if system else ()), *fs.deny])
    protect = _unique([*(PROTECT if system else ()), *fs.protect])

    for index, path in enumerate(fs.read):
        if path in write:
            problems.append(
                Problem(
                    ("filesystem", "read", index),
                    f"{show(path)} is also in filesystem.write, which lets it be read too; "
                    "remove it from read",
                )
            )
    for section, entries in (("read", fs.read), ("write", fs.write)):
        for index, path in enumerate(entries):
            hidden = covered_by(path, deny)
            if hidden is not None:
                whose = (
                    "the secrets that base: system hides"
                    if hidden in SECRETS_DENY and hidden not in fs.deny
                    else "filesystem.deny"
                )
                problems.append(
                    Problem(
                        ("filesystem", section, index),
                        f"{show(path)} is inside {show(hidden)}, one of {whose}, so it would stay "
                        "hidden; remove it"
                        + (", or set filesystem.base: none and list what you need" if system else ""),
                    )
                )

    grants = [*read, *write, *([workspace] if workspace and workspace.startswith("/") else [])]
    for index, program in enumerate(model.exec_.allow):
        if covered_by(program, grants) is None:
            problems.append(
                Problem(
                    ("exec", "allow", index),
                    f"{show(program)} is outside every readable path, so it could not run; "
                    "add its directory to filesystem.read",
                )
            )
        elif covered_by(program, deny) is not None:
            problems.append(
                Problem(
                    ("exec", "allow", index),
                    f"{show(program)} is hidden by filesystem.deny; remove it",
                )
            )
    # A mount's target is a grant of the cell's view too, and on an image the
    # whole of the image's / is there to enter (the harnesses' task workdirs).
    entered = [*grants, *(str(m.target) for m in fs.mounts)]
    if model.workdir is not None and model.image is None and covered_by(model.workdir, entered) is None:
        problems.append(
            Problem(
                ("workdir",),
                f"{show(model.workdir)} is outside the workspace and every filesystem.read or "
                "write path, so the cell could not enter it; add it to filesystem.write, "
                "or remove workdir",
            )
        )

    env = model.env
    for name in env.set_:
        if name in env.pass_:
            problems.append(
                Problem(
                    ("env", "set", name),
                    f"{show(name)} is also in env.pass; keep it in one of them",
                    at_key=True,
                )
            )

    first_use: dict[str, int] = {}
    for index, rule in enumerate(model.tools):
        if rule.id in first_use:
            other = first_use[rule.id]
            line = doc.position(("tools", other, "id"))[0]
            problems.append(
                Problem(
                    ("tools", index, "id"),
                    f"{show(rule.id)} is already the id of tools[{other}] (line {line}); give each "
                    "rule its own id",
                )
            )
        else:
            first_use[rule.id] = index

    if problems:
        raise doc.error(problems)

    limits = model.limits
    given = limits.model_fields_set

    def limit(name: str) -> Any:
        return getattr(limits, name) if name in given else getattr(DEFAULT_LIMITS, name)

    llm = None
    if model.llm is not None:
        llm = LlmPolicy(
            provider=model.llm.provider,
            base_url=model.llm.base_url or LLM_BASE_URLS[model.llm.provider],
            model=model.llm.model,
            api_key_env=model.llm.api_key_env,
            max_requests=model.llm.max_requests,
            max_tokens=model.llm.max_tokens,
            remote_images=model.llm.remote_images,
        )
    return Policy(
        name=model.name,
        command=tuple(model.command or ()),
        mode=model.mode,
        workspace=workspace,
        workdir=model.workdir,
        filesystem=FilesystemPolicy(
            read=read,
            write=write,
            deny=deny,
            protect=protect,
            mounts=tuple(MountRule(m.source, m.target, m.mode) for m in fs.mounts),
        ),
        exec=ExecPolicy(allow=_unique(model.exec_.allow)),
        env=default_env(base=env.base, passthrough=env.pass_, values=dict(env.set_)),
        limits=Limits(
            memory=limit("memory"),
            pids=limit("pids"),
            cpu=limit("cpu"),
            timeout=limit("timeout"),
            output=limit("output"),
            denials=limit("denials"),
            disk=_disk(limits.disk) if "disk" in given else DEFAULT_LIMITS.disk,
        ),
        network=NetworkPolicy(
            allow=tuple(
                HostRule(
                    host=rule.host,
                    ports=tuple(rule.ports),
                    methods=_unique(rule.methods),
                    paths=_unique(rule.paths),
                )
                for rule in model.network.allow
            ),
            loopback_ports=_unique(model.network.loopback_ports),
            fetch_plain_http=model.network.fetch_plain_http,
        ),
        tools=tuple(
            ToolRule(
                id=rule.id,
                intent=rule.intent,
                verdict=rule.verdict,
                match=tuple(rule.match.items()),
            )
            for rule in model.tools
        ),
        llm=llm,
        secrets=tuple(
            SecretPolicy(
                name=secret.name,
                env=secret.env,
                file=secret.file,
                hosts=_unique(secret.hosts),
                headers=_unique(secret.headers),
                body=secret.body,
                url=secret.url,
            )
            for secret in model.secrets
        ),
        source=source,
        image=model.image,
        user=model.user,
    )


CELL_MACHINERY = ("/", "/proc", "/dev", "/sys", "/tmp", "/run/stockade")
"""Places of the cell's own making that a ``filesystem.mounts`` target may not
be or lie in (``/tmp`` itself is the cell's tmpfs, but a target inside it is
fine): the kernel's views, the cell's devices, the broker's socket and CA."""


def _mount_problems(model: PolicyFile, workspace: str | None) -> list[Problem]:
    """``filesystem.mounts``: a source that exists and is not hidden, a target
    that is not the cell's own machinery, the workspace, or another's target."""
    problems: list[Problem] = []
    fs = model.filesystem
    targets: dict[str, int] = {}
    deny = [*SECRETS_DENY, *fs.deny] if fs.base == "system" else list(fs.deny)
    for index, mount in enumerate(fs.mounts):
        where: PathKey = ("filesystem", "mounts", index)
        source, target = mount.source, mount.target
        if not os.path.lexists(source):
            problems.append(
                Problem((*where, "source"), f"{show(source)} does not exist; create it, or fix the path")
            )
        elif covered_by(source, deny) is not None:
            problems.append(
                Problem(
                    (*where, "source"),
                    f"{show(source)} is inside {show(covered_by(source, deny))} of filesystem.deny, "
                    "which stays hidden; mount something else",
                )
            )
        machinery = next(
            (
                m
                for m in CELL_MACHINERY
                if target == m or (m not in ("/", "/tmp") and target.startswith(m + "/"))
            ),
            None,
        )
        if machinery is not None:
            problems.append(
                Problem(
                    (*where, "target"),
                    f"{show(target)} is "
                    + ("" if target == machinery else f"inside {show(machinery)}, ")
                    + "part of the cell's own view (its root, /proc, /dev, /sys, /tmp, /run/stockade); "
                    "choose another target, such as '/mnt/data'",
                )
            )
        if workspace is not None and target == workspace:
            problems.append(
                Problem(
                    (*where, "target"),
                    f"{show(target)} is the workspace, which is mounted there already; "
                    "choose another target",
                )
            )
        if target in targets:
            problems.append(
                Problem(
                    (*where, "target"),
                    f"{show(target)} is already the target of filesystem.mounts[{targets[target]}]; "
                    "give each mount its own target",
                )
            )
        else:
            targets[target] = index
    return problems


def _secret_problems(model: PolicyFile) -> list[Problem]:
    """A secret needs one source, a name of its own, and must never enter the cell."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for index, secret in enumerate(model.secrets):
        where = ("secrets", index)
        if (secret.env is None) == (secret.file is None):
            problems.append(
                Problem(where, "needs exactly one source: 'env' (the daemon's variable) or 'file'")
            )
        if secret.name in seen:
            problems.append(Problem((*where, "name"), f"{show(secret.name)} is named twice in secrets"))
        seen.add(secret.name)
        if secret.name in model.env.set_ or secret.name in model.env.pass_:
            problems.append(
                Problem(
                    (*where, "name"),
                    f"{show(secret.name)} is also in env; the secret's placeholder fills that variable, "
                    "so remove it from env",
                )
            )
        if secret.env is not None and secret.env in model.env.pass_:
            problems.append(
                Problem(
                    (*where, "env"),
                    f"{show(secret.env)} holds a secret's value and is also in env.pass, which would copy "
                    "it into the cell; remove it from env.pass",
                )
            )
    return problems


def _disk(section: DiskSection | None) -> DiskLimit | None:
    """``limits.disk``; null, or both kinds unlimited, is no limit."""
    if section is None or (section.bytes is None and section.files is None):
        return None
    return DiskLimit(bytes=section.bytes, files=section.files)


def _unique(items: Any) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(items))


__all__ = [
    "Format",
    "LoadedPolicy",
    "load_policy",
    "load_policy_file",
    "loads_policy",
    "loads_policy_text",
    "policy_json_schema",
]
