"""docs/CLI.md lists every command, flag and exit code as the code has them."""

from __future__ import annotations

import re
from pathlib import Path

from stockade.cli._reference import commands
from stockade.exit_codes import MEANINGS, ExitCode

DOC = Path(__file__).resolve().parents[2] / "docs" / "CLI.md"


def documented() -> dict[str, set[str]]:
    """Each ``### `stockade …``` section of the reference: the flags it lists."""
    text = DOC.read_text()
    body = text.split("<!-- reference -->", 1)[1].split("<!-- /reference -->", 1)[0]
    sections: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in body.splitlines():
        heading = re.match(r"^### `(stockade[^`]*)`\s*$", line)
        if heading:
            current = sections.setdefault(heading.group(1), set())
        elif current is not None and line.startswith("- "):
            names = line[2:].split(":", 1)[0]
            current.update(re.findall(r"`(--?[\w][\w-]*)`", names))
    return sections


def test_every_command_of_the_code_has_its_section_with_exactly_its_flags() -> None:
    doc = documented()
    missing, wrong = [], []
    for command in commands():
        if command.path not in doc:
            missing.append(command.path)
            continue
        flags = {name for flag in command.flags for name in flag.names}
        if doc[command.path] != flags:
            wrong.append(
                f"{command.path}: code has {sorted(flags - doc[command.path])} undocumented, "
                f"doc lists {sorted(doc[command.path] - flags)} the code lacks"
            )
    assert not missing, (
        f"commands without a section in docs/CLI.md (python -m stockade.cli._reference): {missing}"
    )
    assert not wrong, wrong


def test_documented_commands_are_tolerated_before_the_code_has_them() -> None:
    # A section may come first (another engineer's command on its way); it must
    # still be well-formed: a `stockade …` heading, and flags only as `--name`.
    for path, flags in documented().items():
        assert path.startswith("stockade ") and path == path.strip()
        assert all(flag.startswith("-") for flag in flags)


def test_the_exit_code_table_of_the_doc_is_the_codes() -> None:
    text = DOC.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", text, re.MULTILINE)}
    assert codes == {int(code) for code in ExitCode}
    assert set(MEANINGS) == set(ExitCode)


def test_the_errors_take_their_codes_from_the_table() -> None:
    import stockade.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.StockadeError):
            assert cls.exit_code in set(ExitCode), (name, cls.exit_code)
            assert cls.__module__ == "stockade.errors"
