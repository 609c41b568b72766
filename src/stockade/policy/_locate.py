"""Locating a policy file's problems: where each is (``file:line:col``) and
what to say about it.

``PolicyDocument`` is the YAML reader's document (``_yaml``) of a policy file,
which places a ``Problem`` by its path in the file and turns several into one
``PolicyError`` (the first the error, the others notes); ``problem_of`` says
what a pydantic validation error of ``_schema``'s models means for the user,
with the offending value as the file has it and the fix (a close key, the
valid ones, an example).
"""

from __future__ import annotations

import difflib
import re
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from stockade.errors import PolicyError
from stockade.policy._schema import PathKey, PolicyFile, Problem
from stockade.policy._units import show
from stockade.policy._yaml import YamlDocument, located_error
from stockade.policy._yaml import dotted as _dotted

MAX_NODES = 100_000
"""YAML aliases can make a small file expand exponentially ("billion laughs")."""

_EXAMPLES = {
    "name": "'name: my-agent'",
    "host": "'host: api.example.com'",
    "id": "'id: read-docs'",
    "intent": "'intent: fs.read'",
    "verdict": "'verdict: ask'",
}


class PolicyDocument(YamlDocument):
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


def flatten(doc: PolicyDocument, problem: Problem) -> Problem:
    for cut in range(len(problem.path) - 1, 0, -1):
        if problem.path[:cut] in doc.raw:
            return Problem(problem.path[:cut], problem.detail)
    return problem


def kind_of(value: object) -> str:
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


def problem_of(doc: PolicyDocument, model: type[BaseModel], error: Any) -> Problem:
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
        return Problem(path, unknown_key(model, path), at_key=True)
    if kind == "string_type":
        if value is None:
            return Problem(path, "is empty; give it a value")
        return Problem(path, f"must be text, not {kind_of(value)}; write one value, such as 'example'")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        fix = (
            f"write it without quotes: {value.strip()}"
            if isinstance(value, str) and value.strip().isdigit()
            else "write a whole number, such as 10"
        )
        return Problem(path, f"{shown} is {kind_of(value)}, not a whole number; {fix}")
    if kind in ("bool_type", "bool_parsing"):
        return Problem(
            path, f"{shown} is {kind_of(value)}, not true or false; write true or false, without quotes"
        )
    if kind in ("list_type", "tuple_type"):
        return Problem(
            path,
            f"must be a list, not {kind_of(value)}; write each item on its own '- ' line, or as [a, b]",
        )
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        keys = fields_at(model, path)
        example = f" (such as {', '.join(repr(k) for k in keys[:3])})" if keys else ""
        return Problem(
            path,
            f"must be a mapping, not {kind_of(value)}; write its keys{example} on the lines below, indented",
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


def fields_at(model: type[BaseModel], path: PathKey) -> list[str]:
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


def unknown_key(model: type[BaseModel], path: PathKey) -> str:
    key = str(path[-1])
    valid = fields_at(model, path[:-1])
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


__all__ = ["MAX_NODES", "PolicyDocument", "fields_at", "flatten", "kind_of", "problem_of", "unknown_key"]
