"""A Dockerfile parser: the subset ``stockade image build`` carries out.

Pure: text in, instructions out. It follows Docker's reference
(docs.docker.com/reference/dockerfile): parser directives at the top
(``# syntax=``, ``# escape=``), comments, line continuations with the escape
character (comment lines inside a continuation dropped), instructions in any
case, the exec (JSON) and shell forms, ``$VAR``/``${VAR}``/``${VAR:-x}``/
``${VAR:+x}`` substitution with quotes and escapes. Anything it does not carry
out is an error naming ``file:line`` — never an instruction skipped quietly:
an image built without a step it asked for is a different image.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from stockade.errors import ImageError

SUPPORTED = (
    "FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE",
)  # fmt: skip
"""What a build carries out, in one table (docs/IMAGES.md lists the same)."""
KNOWN_UNSUPPORTED = {
    "VOLUME": "a cell's mounts come from its policy (filesystem.mounts)",
    "HEALTHCHECK": "a cell runs no health checks",
    "STOPSIGNAL": "a cell's processes all end with it",
    "SHELL": 'RUN\'s shell is /bin/sh -c; write the shell into the command (RUN ["bash", "-c", "…"])',
    "ONBUILD": "there are no child builds to trigger",
    "MAINTAINER": 'it is deprecated; write LABEL maintainer="…"',
}
FLAGS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "COPY": ("chown", "chmod", "link"),
    "ADD": ("chown", "chmod", "link"),
    "FROM": ("platform",),
})  # fmt: skip
"""The ``--flag=value`` options each instruction takes; others are errors."""
DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(.*?)\s*$")
VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction, continuation lines joined."""

    keyword: str
    """Upper case: ``RUN``, ``COPY``…"""
    line: int
    """The line it starts on, from 1."""
    rest: str
    """Its text after the keyword and the flags, as written (not substituted)."""
    flags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    exec_form: tuple[str, ...] | None = None
    """The JSON list of the exec form (``RUN ["a", "b"]``), else None."""
    escape: str = "\\"


@dataclass(frozen=True, slots=True)
class Dockerfile:
    source: str
    instructions: tuple[Instruction, ...]
    directives: Mapping[str, str]

    def where(self, ins: Instruction) -> str:
        return f"{self.source}:{ins.line}"


def parse_dockerfile(text: str, *, source: str = "Dockerfile") -> Dockerfile:
    """Parse a Dockerfile.

    Raises:
        ImageError: an instruction is unknown or not supported, malformed, or
            needs what a local build has not (a second stage, a URL); the
            message starts with ``source:line``.
    """
    lines = text.splitlines()
    directives: dict[str, str] = {}
    escape = "\\"
    i = 0
    # Parser directives: only at the very top, before any comment, blank or instruction.
    while i < len(lines):
        m = DIRECTIVE.match(lines[i])
        if not m:
            break
        key = m.group(1).lower()
        if key in directives:
            raise ImageError(
                f"parser directive {key!r} is given twice; keep one", location=f"{source}:{i + 1}"
            )
        directives[key] = m.group(2)
        i += 1
    if "escape" in directives:
        escape = directives["escape"]
        if escape not in ("\\", "`"):
            raise ImageError(
                f"parser directive escape={escape!r} is not '\\' or '`'; write '# escape=`' or leave it out",
                location=f"{source}:1",
            )
    out: list[Instruction] = []
    while i < len(lines):
        start = i
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = [line]
        while _continues(parts[-1], escape):
            parts[-1] = parts[-1].rstrip()[:-1]
            # Comment lines (and, as Docker allows, blank ones) inside a continuation are dropped.
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                i += 1
            if i >= len(lines):
                break
            parts.append(lines[i])
            i += 1
        out.append(_instruction(" ".join(p.strip() for p in parts if p.strip()), start + 1, source, escape))
    if not out:
        raise ImageError(
            f"{source} holds no instructions; it needs at least a FROM line", location=f"{source}:1"
        )
    dockerfile = Dockerfile(source, tuple(out), MappingProxyType(dict(directives)))
    _check_stages(dockerfile)
    return dockerfile


def _continues(line: str, escape: str) -> bool:
    return line.rstrip().endswith(escape)


def _instruction(text: str, line: int, source: str, escape: str) -> Instruction:
    where = f"{source}:{line}"
    keyword, _, rest = text.partition(" ")
    keyword = keyword.upper()
    rest = rest.strip()
    if keyword not in SUPPORTED:
        why = KNOWN_UNSUPPORTED.get(keyword)
        if why:
            raise ImageError(
                f"instruction {keyword} is not supported by `stockade image build` ({why}); remove it",
                location=where,
            )
        raise ImageError(
            f"unknown instruction {keyword!r}; a Dockerfile here may use {', '.join(SUPPORTED)}",
            location=where,
        )
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        rest = rest.strip()
        name, eq, value = flag[2:].partition("=")
        if name not in FLAGS.get(keyword, ()):
            if keyword == "RUN" and name in ("mount", "network", "security"):
                why = "a build cell's network is the gateway and its mounts are its own"
                raise ImageError(f"RUN --{name} is not supported ({why}); remove the flag", location=where)
            if name == "from":
                raise ImageError(
                    f"{keyword} --from needs a multi-stage build, which is not supported; "
                    "build the other stage as an image of its own and COPY from the context",
                    location=where,
                )
            allowed = ", ".join(f"--{f}" for f in FLAGS.get(keyword, ())) or "none"
            raise ImageError(f"{keyword} has no flag --{name} here (it takes: {allowed})", location=where)
        flags[name] = value if eq else "true"
    if not rest:
        raise ImageError(f"{keyword} needs arguments; see the Dockerfile reference", location=where)
    if (
        "<<" in rest
        and re.search(r"<<-?\s*['\"]?[A-Za-z_]+['\"]?\s*$", rest.split("\n")[0])
        and keyword
        in (
            "RUN",
            "COPY",
            "ADD",
        )
    ):
        raise ImageError(
            f"{keyword} with a here-document (<<EOF) is not supported; put the text in a file "
            "of the context and COPY it",
            location=where,
        )
    exec_form: tuple[str, ...] | None = None
    if rest.startswith("[") and keyword in ("RUN", "CMD", "ENTRYPOINT", "COPY", "ADD"):
        try:
            parsed = json.loads(rest)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            exec_form = tuple(parsed)
        # Docker reads a line that looks like JSON but is not as the shell form; so do we.
    return Instruction(keyword, line, rest, MappingProxyType(flags), exec_form, escape)


def _check_stages(dockerfile: Dockerfile) -> None:
    first = dockerfile.instructions[0]
    if first.keyword not in ("FROM", "ARG"):
        raise ImageError(
            f"the first instruction is {first.keyword}, not FROM; start with e.g. 'FROM debian:bookworm'",
            location=dockerfile.where(first),
        )
    froms = [ins for ins in dockerfile.instructions if ins.keyword == "FROM"]
    if not froms:
        raise ImageError(
            "there is no FROM; add e.g. 'FROM debian:bookworm'", location=dockerfile.where(first)
        )
    if len(froms) > 1:
        raise ImageError(
            "a second FROM starts a multi-stage build, which is not supported; build each "
            "stage as an image of its own",
            location=dockerfile.where(froms[1]),
        )
    for ins in dockerfile.instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword != "ARG":
            raise ImageError(f"{ins.keyword} comes before FROM; only ARG may", location=dockerfile.where(ins))
    for ins in dockerfile.instructions:
        if ins.keyword == "ADD":
            for src in (ins.exec_form or tuple(ins.rest.split()))[:-1]:
                if re.match(r"^(https?|ftp|git)://|^git@", src):
                    raise ImageError(
                        f"ADD {src} fetches a URL, and a build reads only its context; "
                        "download it into the context first, or fetch it in a RUN step "
                        "(through the gateway, recorded)",
                        location=dockerfile.where(ins),
                    )


# ----------------------------------------------------------------- words


def words(text: str, env: Mapping[str, str], *, escape: str = "\\", where: str = "") -> list[str]:
    """``text`` split into words as Docker reads ENV, LABEL, COPY… arguments:
    whitespace separates, quotes group, ``$VAR`` is substituted except in
    single quotes, the escape character takes the next one literally.

    Raises:
        ImageError: an unterminated quote or ``${``.
    """
    out: list[str] = []
    cur: list[str] = []
    have = False
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            if have:
                out.append("".join(cur))
                cur, have = [], False
            i += 1
            continue
        have = True
        if c == escape and i + 1 < n:
            cur.append(text[i + 1])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ImageError(f"unterminated ' in {text!r}; close the quote", location=where or None)
            cur.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == escape and i + 1 < n and text[i + 1] in ('"', escape, "$"):
                    cur.append(text[i + 1])
                    i += 2
                elif text[i] == "$":
                    value, i = _variable(text, i, env, escape, where)
                    cur.append(value)
                else:
                    cur.append(text[i])
                    i += 1
            if i >= n:
                raise ImageError(f'unterminated " in {text!r}; close the quote', location=where or None)
            i += 1
        elif c == "$":
            value, i = _variable(text, i, env, escape, where)
            cur.append(value)
        else:
            cur.append(c)
            i += 1
    if have:
        out.append("".join(cur))
    return out


def substitute(text: str, env: Mapping[str, str], *, escape: str = "\\", where: str = "") -> str:
    """``text`` with variables substituted, quotes and spacing kept (for a
    single-valued argument such as WORKDIR's or USER's)."""
    got = words(text, env, escape=escape, where=where)
    return " ".join(got)


def _variable(text: str, i: int, env: Mapping[str, str], escape: str, where: str) -> tuple[str, int]:
    # text[i] == "$"
    if i + 1 < len(text) and text[i + 1] == "{":
        end = text.find("}", i + 2)
        if end < 0:
            raise ImageError(f"unterminated ${{ in {text!r}; close it with }}", location=where or None)
        body = text[i + 2 : end]
        for op in (":-", ":+", "-", "+"):
            name, found, word = body.partition(op)
            if found and VAR.fullmatch(name):
                value = env.get(name)
                word = " ".join(words(word, env, escape=escape, where=where)) if word else ""
                if op == ":-":
                    return (value if value else word), end + 1
                if op == ":+":
                    return (word if value else ""), end + 1
                if op == "-":
                    return (value if value is not None else word), end + 1
                return (word if value is not None else ""), end + 1
        if not VAR.fullmatch(body):
            raise ImageError(
                f"${{{body}}} is not a variable this build substitutes; write ${{NAME}}, "
                "${NAME:-default} or ${NAME:+alternative}",
                location=where or None,
            )
        return env.get(body, ""), end + 1
    m = VAR.match(text, i + 1)
    if not m:
        return "$", i + 1
    return env.get(m.group(0), ""), m.end()


def key_values(
    text: str, env: Mapping[str, str], *, keyword: str, escape: str, where: str
) -> list[tuple[str, str]]:
    """ENV's and LABEL's ``k=v k2="v 2"`` (and ENV's older ``k v w``) pairs."""
    first = text.split(None, 1)
    if keyword == "ENV" and first and "=" not in first[0]:
        value = first[1] if len(first) > 1 else ""
        if not value:
            raise ImageError(f"ENV {first[0]} has no value; write ENV {first[0]}=VALUE", location=where)
        return [(first[0], " ".join(words(value, env, escape=escape, where=where)))]
    pairs: list[tuple[str, str]] = []
    for word in words(text, env, escape=escape, where=where):
        name, eq, value = word.partition("=")
        if not eq or not name:
            raise ImageError(
                f'{keyword} {word!r} is not NAME=VALUE; write {keyword} NAME="VALUE"', location=where
            )
        pairs.append((name, value))
    return pairs


__all__ = ["SUPPORTED", "Dockerfile", "Instruction", "key_values", "parse_dockerfile", "substitute", "words"]
