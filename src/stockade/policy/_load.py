"""Loading a policy file: YAML with a mark on every key and value, precise errors.

The steps, each of which can fail with a ``PolicyError`` that names
``file:line:col``, the offending value and the fix:

1. read the file (UTF-8, at most 1 MiB);
2. compose the YAML and walk it into plain data (``_yaml``, shared with
   scenario files), recording where every key and value is, refusing
   duplicate keys, unknown tags and alias bombs;
3. tell the format by its keys: stockade, or an AgentOS manifest (``_agentos``);
4. expand ``${VAR}`` (``$${`` stays a literal ``${``);
5. validate with the pydantic models of ``_schema``, mapping each error's
   location back to the file (``_locate``);
6. check what only makes sense as a whole (a rule id used twice, a grant
   inside a hidden path…) and build the frozen ``Policy`` (``_build``).

The first problem is the error; every other one is attached as a note
(``exc.__notes__``), so a user can fix them all in one go.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from stockade.errors import PolicyError
from stockade.policy import _agentos
from stockade.policy._build import to_policy
from stockade.policy._locate import PolicyDocument, flatten, problem_of
from stockade.policy._model import Policy
from stockade.policy._schema import STOCKADE_KEYS, PathKey, PolicyFile, Problem, Problems
from stockade.policy._units import show
from stockade.policy._yaml import read_text

MAX_BYTES = 1024 * 1024
"""A policy file is a few kilobytes; a larger one is a mistake (or an attack)."""

Format = Literal["stockade", "agentos"]

_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    doc = PolicyDocument(source)
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
    return LoadedPolicy(to_policy(doc, model, path), "stockade")


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


# ---------------------------------------------------------------------------- format


def _detect_format(doc: PolicyDocument, data: dict[str, Any]) -> Format:
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
    doc: PolicyDocument,
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
            found = [problem_of(doc, model, error) for error in errors]
            if flat:
                found = [flatten(doc, problem) for problem in found]
            # A value whose ${VAR} could not be expanded has said what is wrong with it.
            unexpanded = {problem.path for problem in earlier}
            found = [problem for problem in found if problem.path not in unexpanded]
            raise doc.error([*earlier, *found])
    raise AssertionError("unreachable: each round replaces at least one value")


def _replace(data: Any, path: PathKey, value: str) -> None:
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


__all__ = [
    "Format",
    "LoadedPolicy",
    "load_policy",
    "load_policy_file",
    "loads_policy",
    "loads_policy_text",
    "policy_json_schema",
]
