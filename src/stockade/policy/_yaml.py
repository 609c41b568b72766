"""The YAML reader of policy and scenario files: plain data with a mark on every
key and value, and the file's own mistakes as ``file:line:col`` errors.

One reader for both kinds of file (``stockade.policy._load`` and
``stockade.scenario._model``), so that what it refuses is refused in both:

* a file larger than its bound, or not UTF-8 (the byte's line and column);
* text that is not YAML (with the fix for tabs and undefined aliases), more
  than one document, or a top level that is not a mapping;
* any tag, on a scalar, a list or a mapping (``!!python/object/apply:…``
  would otherwise be dropped without a word);
* a key used twice in one mapping, and a key that is empty or not a scalar:
  collected, so that every one is reported at once (first as the error, the
  others as notes);
* aliases that expand past a bound ("billion laughs") or loop, and nesting
  deeper than Python's recursion limit.

Keys are taken as written (``on:`` is the key ``"on"``, never a boolean);
``<<`` merges mappings, explicit keys winning over merged ones. What a value
means is the caller's business: this module knows no field of either file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from stockade.errors import PolicyError
from stockade.policy._units import show

PathKey = tuple[str | int, ...]
"""Where a value is in the document: mapping keys and list indexes from the top."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_PLAIN_TAGS = frozenset(("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"))
"""The tags a list or mapping has when none is written (or ``!!seq``/``!!map``)."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a key or value starts (line and column from 1) and how it is written."""

    line: int
    col: int
    style: str | None = None
    one_line: bool = False


def dotted(path: PathKey) -> str:
    """``agents[0].policy``: a path as a user would name the field."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def read_text(name: str, *, kind: str, max_bytes: int) -> str:
    """The text of the ``kind`` file (``"policy"``, ``"scenario"``) at ``name``.

    Raises:
        PolicyError: it cannot be read, is larger than ``max_bytes`` or is not UTF-8.
    """
    what = f"cannot read the {kind} file {show(name)}"
    try:
        with open(name, "rb") as file:
            data = file.read(max_bytes + 1)
    except FileNotFoundError:
        raise PolicyError(f"{what}: it does not exist; check the path") from None
    except IsADirectoryError:
        raise PolicyError(f"{what}: it is a directory; name the {kind} file inside it") from None
    except PermissionError:
        raise PolicyError(f"{what}: permission denied; make it readable by this user") from None
    except OSError as exc:
        raise PolicyError(f"{what}: {exc.strerror or exc}; check the path") from None
    if len(data) > max_bytes:
        raise PolicyError(
            f"the {kind} file {show(name)} is larger than {max_bytes // (1024 * 1024)} MiB; "
            f"a {kind} is a few kilobytes, so check that this is the right file"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        raise PolicyError(
            f"byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8",
            location=f"{name}:{line}:{col}",
        ) from None


def located_error(source: str, problems: list[tuple[tuple[int, int], str]]) -> PolicyError:
    """One ``PolicyError`` for several ``((line, col), message)``: the first in the
    file is the error, the others (in file order, each once) its notes."""
    ordered: list[tuple[tuple[int, int], str]] = []
    for position, message in problems:
        if (position, message) not in ordered:
            ordered.append((position, message))
    ordered.sort(key=lambda item: item[0])
    (line, col), message = ordered[0]
    exc = PolicyError(message, location=f"{source}:{line}:{col}")
    for (line, col), message in ordered[1:]:
        exc.add_note(f"{source}:{line}:{col}: {message}")
    return exc


class YamlDocument:
    """The data of one file and where each of its keys and values is.

    ``kind`` names the file in messages (``"policy"`` → "not supported in a
    policy"); ``example`` is the line a file of that kind starts with
    (``'name: my-agent'``); ``max_nodes`` bounds what aliases expand to.
    """

    def __init__(self, source: str, *, kind: str, example: str, max_nodes: int) -> None:
        self.source = source
        self.values: dict[PathKey, Mark] = {}
        self.keys: dict[PathKey, Mark] = {}
        self.raw: dict[PathKey, str] = {}
        """The text of each scalar as written (``yes``, ``0o755``)."""
        self._kind = kind
        self._example = example
        self._max_nodes = max_nodes
        self._nodes = 0
        self._loader: yaml.SafeLoader | None = None
        self._problems: list[tuple[tuple[int, int], str]] = []

    # -- locating

    def position(self, path: PathKey, *, at_key: bool = False, offset: int = 0) -> tuple[int, int]:
        """Line and column of ``path`` (its key with ``at_key``), or of its nearest
        ancestor the file has; ``offset`` characters into a one-line scalar."""
        if at_key and path in self.keys:
            mark = self.keys[path]
            return mark.line, mark.col
        for cut in range(len(path), -1, -1):
            found = self.values.get(path[:cut])
            if found is not None:
                if cut == len(path) and offset and found.one_line:
                    return found.line, found.col + offset + (1 if found.style in ("'", '"') else 0)
                return found.line, found.col
        return 1, 1

    def location(self, path: PathKey = (), *, at_key: bool = False, offset: int = 0) -> str:
        line, col = self.position(path, at_key=at_key, offset=offset)
        return f"{self.source}:{line}:{col}"

    def fatal(self, message: str, mark: yaml.Mark | None) -> PolicyError:
        if mark is None:
            return PolicyError(message, location=f"{self.source}:1:1")
        return PolicyError(message, location=f"{self.source}:{mark.line + 1}:{mark.column + 1}")

    # -- composing

    def compose(self, text: str) -> dict[str, Any]:
        """The file's top-level mapping as plain data.

        Raises:
            PolicyError: one of the mistakes of the module's docstring.
        """
        if text.startswith("\ufeff"):
            text = text[1:]
        if self.source.endswith(".json") or text.lstrip().startswith("{"):
            # JSON allows tabs between tokens; YAML does not. Outside strings a
            # tab is whitespace either way, and inside a JSON string it is invalid.
            text = text.replace("\t", " ")
        too_deep = f"the file is nested too deeply to be a {self._kind}; check it is the right file"
        try:
            loader = yaml.SafeLoader(text)
        except yaml.reader.ReaderError as exc:
            raise self._reader_error(exc, text) from None
        self._loader = loader
        try:
            try:
                node = loader.get_single_node()
            except yaml.MarkedYAMLError as exc:
                raise self._syntax_error(exc) from None
            except yaml.reader.ReaderError as exc:
                raise self._reader_error(exc, text) from None
            except RecursionError:
                raise PolicyError(too_deep, location=f"{self.source}:1:1") from None
            if node is None:
                raise PolicyError(
                    f"the file is empty; a {self._kind} needs at least a line such as {self._example}",
                    location=f"{self.source}:1:1",
                )
            if not isinstance(node, yaml.MappingNode):
                shape = "a list" if isinstance(node, yaml.SequenceNode) else f"the value {show(node.value)}"
                raise self.fatal(
                    f"the top level is {shape}, but a {self._kind} is a mapping of keys; "
                    f"start with a line such as {self._example}",
                    node.start_mark,
                )
            try:
                data = self._walk(node, (), set())
            except RecursionError:
                raise PolicyError(too_deep, location=f"{self.source}:1:1") from None
        finally:
            loader.dispose()
            self._loader = None
        if self._problems:
            raise located_error(self.source, self._problems)
        assert isinstance(data, dict)
        return data

    def _reader_error(self, exc: yaml.reader.ReaderError, text: str) -> PolicyError:
        before = text[: exc.position]
        line = before.count("\n") + 1
        col = exc.position - (before.rfind("\n") + 1) + 1
        return PolicyError(
            f"the character #x{exc.character:04x} is not allowed in YAML; remove it",
            location=f"{self.source}:{line}:{col}",
        )

    def _syntax_error(self, exc: yaml.MarkedYAMLError) -> PolicyError:
        problem = exc.problem or "unexpected text"
        if "another document" in problem:
            return self.fatal(
                f"the file holds more than one YAML document ('---'); keep one {self._kind} per file",
                exc.problem_mark,
            )
        if "\\t" in problem or "\t" in problem:
            fix = "indent with spaces, not tabs"
        elif "found undefined alias" in problem:
            fix = "define the anchor ('&name') before using it"
        else:
            fix = "check the indentation, colons and quotes here"
        context = f" ({exc.context})" if exc.context else ""
        return self.fatal(
            f"this is not valid YAML: {problem}{context}; {fix}",
            exc.problem_mark or exc.context_mark,
        )

    def _tag_error(self, node: yaml.Node) -> PolicyError:
        return self.fatal(
            f"the YAML tag {show(node.tag)} is not supported in a {self._kind}; remove it", node.start_mark
        )

    def _walk(self, node: yaml.Node, path: PathKey, stack: set[int]) -> Any:
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise self.fatal(
                f"the file expands to more than {self._max_nodes} values (through aliases); "
                "write the values out instead",
                node.start_mark,
            )
        one_line = node.start_mark.line == node.end_mark.line
        style = node.style if isinstance(node, yaml.ScalarNode) else None
        self.values[path] = Mark(node.start_mark.line + 1, node.start_mark.column + 1, style, one_line)
        if id(node) in stack:
            raise self.fatal("an alias refers to a node that contains it; remove the loop", node.start_mark)
        if isinstance(node, yaml.ScalarNode):
            self.raw[path] = node.value
            assert self._loader is not None
            try:
                return self._loader.construct_object(node)
            except yaml.constructor.ConstructorError:
                raise self._tag_error(node) from None
        stack = stack | {id(node)}
        if node.tag not in _PLAIN_TAGS:
            raise self._tag_error(node)
        if isinstance(node, yaml.SequenceNode):
            return [self._walk(item, (*path, i), stack) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.MappingNode)
        result: dict[str, Any] = {}
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        seen: dict[str, yaml.Mark] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.extend(self._merge_sources(value_node, stack))
                continue
            key = self._key(key_node, path)
            if key is None:
                continue
            at = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in seen:
                self._problems.append(
                    (
                        at,
                        f"{dotted((*path, key))} appears twice, at lines {seen[key].line + 1} and "
                        f"{at[0]}; keep one of them",
                    )
                )
                continue
            seen[key] = key_node.start_mark
            self.keys[(*path, key)] = Mark(*at)
            result[key] = self._walk(value_node, (*path, key), stack)
        for key_node, value_node in merged:  # explicit keys win over merged ones
            key = self._key(key_node, path)
            if key is not None and key not in result:
                self.keys[(*path, key)] = Mark(key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                result[key] = self._walk(value_node, (*path, key), stack)
        return result

    def _merge_sources(self, node: yaml.Node, stack: set[int]) -> list[tuple[yaml.Node, yaml.Node]]:
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        pairs: list[tuple[yaml.Node, yaml.Node]] = []
        for source in sources:
            if not isinstance(source, yaml.MappingNode) or id(source) in stack:
                raise self.fatal(
                    "'<<' merges only mappings; give it an alias such as '*defaults'",
                    source.start_mark,
                )
            pairs.extend(source.value)
        return pairs

    def _key(self, node: yaml.Node, path: PathKey) -> str | None:
        # A key is taken as written: 'on:' is the key "on", never the boolean.
        if isinstance(node, yaml.ScalarNode) and node.value != "":
            return str(node.value)
        where = dotted(path) or "the top level"
        what = "empty" if isinstance(node, yaml.ScalarNode) else "a list or a mapping"
        self._problems.append(
            (
                (node.start_mark.line + 1, node.start_mark.column + 1),
                f"{where} has a key that is {what}; a key is a name such as 'name'",
            )
        )
        return None
