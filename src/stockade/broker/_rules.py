"""The broker's ``tools`` rules: which intent, with which arguments, gets which verdict.

Pure: no I/O. ``Rules(policy.tools).decide(intent, args)`` walks the rules in
order; the first whose intent is the intent and whose every ``match`` pattern
matches the named argument gives the verdict. No rule matching is a denial,
whose reason names the rule that would allow it.

Patterns are globs matched against the whole string form of the argument:

=========  =====================================================================
``*``      any run of characters; in a path argument (``path``, ``cwd``) not ``/``
``**``     any run of characters, ``/`` included; ``/**/`` also matches ``/``,
           and a final ``/**`` also matches the directory itself
``?``      one character (in a path argument, not ``/``)
``[abc]``  one of the characters; ``[!abc]`` one not among them; ``[a-z]`` a range
=========  =====================================================================

Unlike a shell, ``*`` matches a leading dot (``/data/*`` matches ``/data/.env``).
Path arguments are normalised first (``//``, ``/./`` and ``..`` resolved
lexically, a trailing ``/`` dropped), so ``/data/../etc/passwd`` is
``/etc/passwd`` and never matches ``/data/*``; the fs intents then act on that
same normalised path. ``argv`` is matched as its words joined by single spaces.
A missing argument never matches.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from stockade.policy._model import ToolRule

PATH_ARGS = frozenset({"path", "cwd"})
"""Arguments holding a path: normalised before matching, and ``*`` stays in one component."""

_SUGGESTED_ARG = {
    "fs.read": "path",
    "fs.write": "path",
    "fs.list": "path",
    "exec": "argv",
    "http.fetch": "url",
    "agent.send": "to",
}
"""The argument a suggested rule names for each intent."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one intent and the rule that gave it (``None``: no rule matched)."""

    verdict: Literal["allow", "deny", "ask"]
    rule: str | None
    reason: str


def normalize_path(value: str) -> str:
    """``value`` with ``//``, ``/./``, ``..`` and a trailing ``/`` resolved lexically.

    A relative path stays relative (``a/../../x`` is ``../x``) and so never
    matches an absolute pattern.
    """
    if not value:
        return value
    norm = posixpath.normpath(value)
    if norm.startswith("//"):  # POSIX lets normpath keep exactly two; Linux gives them no meaning
        norm = "/" + norm.lstrip("/")
    return norm


def arg_text(name: str, value: object) -> str | None:
    """The string a pattern for argument ``name`` is matched against; ``None``: nothing to match."""
    if value is None:
        return None
    if isinstance(value, str):
        return normalize_path(value) if name in PATH_ARGS else value
    if name == "argv" and isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


def _class(body: str, *, path: bool) -> str:
    """A regular-expression class for the glob class ``[body]`` (brackets removed)."""
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    items: list[str] = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            lo, hi = body[i], body[i + 2]
            if lo <= hi:  # a reversed range matches nothing, as in fnmatch
                items.append(f"{re.escape(lo)}-{re.escape(hi)}")
            i += 3
        else:
            items.append(re.escape(body[i]))
            i += 1
    if not items:
        return "(?!)" if not negate else ("[^/]" if path else ".")
    cls = "".join(items)
    if negate:
        return f"[^{cls}/]" if path else f"[^{cls}]"
    return f"(?!/)[{cls}]" if path else f"[{cls}]"


@lru_cache(maxsize=4096)
def compile_glob(pattern: str, *, path: bool) -> re.Pattern[str]:
    """The regular expression (whole string, ``re.DOTALL``) for a glob.

    A precise translation rather than ``fnmatch.translate``, whose ``*``
    crosses ``/``.
    """
    one = "[^/]" if path else "."
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            if path and j - i >= 2:
                at_start = i == 0 or pattern[i - 1] == "/"
                if at_start and j < n and pattern[j] == "/":
                    out.append("(?:.*/)?")  # "**/": zero or more whole components
                    j += 1
                elif at_start and j == n and out and out[-1] == "/":
                    out.pop()  # the "/" before a final "**": the directory itself matches too
                    out.append("(?:/.*)?")
                else:
                    out.append(".*")
            elif path and (i == 0 or pattern[i - 1] == "/") and (j == n or pattern[j] == "/"):
                out.append(f"{one}+")  # a whole component is never empty ("/*" does not match "/")
            else:
                out.append(f"{one}*")
            i = j
        elif c == "?":
            out.append(one)
            i += 1
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1  # a "]" first in a class is one of its characters
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape(c))  # no closing "]": a literal "["
                i += 1
            else:
                out.append(_class(pattern[i + 1 : j], path=path))
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_matches(pattern: str, name: str, value: object) -> bool:
    """Whether the ``match`` pattern for argument ``name`` matches ``value``."""
    text = arg_text(name, value)
    if text is None:
        return False
    return compile_glob(pattern, path=name in PATH_ARGS).fullmatch(text) is not None


def _yaml_quote(text: str) -> str:
    text = "".join(f"\\x{ord(c):02x}" if c < " " or c == "\x7f" else c for c in text)
    if len(text) > 120:
        text = text[:100] + "…" + text[-15:]
    return "'" + text.replace("'", "''") + "'"


def _suggestion(intent: str, args: Mapping[str, object]) -> str:
    """The message for an intent no rule allows: the rule to add, in YAML flow form."""
    rule_id = "allow-" + re.sub(r"[^A-Za-z0-9]+", "-", intent).strip("-")
    name = _SUGGESTED_ARG.get(intent)
    text = arg_text(name, args.get(name)) if name is not None else None
    if name is None or text is None:
        return f"no tools rule allows {intent}; add {{id: {rule_id}, intent: {intent}, verdict: allow}}"
    if name in PATH_ARGS:
        # Escape glob characters so that the suggestion allows this path only.
        text = re.sub(r"([*?\[])", r"[\1]", text)
    return (
        f"no tools rule allows {intent} of {_yaml_quote(text)}; add {{id: {rule_id}, intent: {intent}, "
        f"verdict: allow, match: {{{name}: {_yaml_quote(text)}}}}}"
    )


class Rules:
    """The ``tools`` rules of one policy, ready to decide."""

    __slots__ = ("_rules",)

    def __init__(self, rules: tuple[ToolRule, ...]) -> None:
        self._rules = rules
        for rule in rules:  # compile now: a bad pattern shows at load, not mid-run
            for name, pattern in rule.match:
                compile_glob(pattern, path=name in PATH_ARGS)

    def decide(self, intent: str, args: Mapping[str, object]) -> Decision:
        """The verdict of the first rule that matches; a denial naming the rule to add if none does."""
        for rule in self._rules:
            if rule.intent != intent:
                continue
            if all(glob_matches(pattern, name, args.get(name)) for name, pattern in rule.match):
                return Decision(rule.verdict, rule.id, _reason(rule, intent))
        return Decision("deny", None, _suggestion(intent, args))

    def has_intent(self, intent: str) -> bool:
        """Whether any rule is about ``intent``."""
        return any(rule.intent == intent for rule in self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"Rules({[rule.id for rule in self._rules]!r})"


def _reason(rule: ToolRule, intent: str) -> str:
    if rule.verdict == "allow":
        return f"{intent} allowed by tools rule {rule.id!r}"
    if rule.verdict == "deny":
        return f"{intent} denied by tools rule {rule.id!r}"
    return f"{intent} needs an operator's approval by tools rule {rule.id!r}"


__all__ = ["PATH_ARGS", "Decision", "Rules", "arg_text", "compile_glob", "glob_matches", "normalize_path"]
