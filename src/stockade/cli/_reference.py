"""Every command and flag of ``stockade``, as the code has them, for docs/CLI.md.

``commands()`` walks the click application (and ``exec``'s own usage text,
which click never sees); ``markdown()`` renders the reference section of
docs/CLI.md from it. ``tests/cli/test_reference.py`` compares that document with
``commands()``, so a command or flag added without its line fails a test.

To refresh the section after adding a command or flag::

    .venv/bin/python -m stockade.cli._reference > /tmp/ref.md

and paste it between the ``<!-- reference -->`` marks of docs/CLI.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import click


@dataclass(frozen=True, slots=True)
class Flag:
    """One option: its names (``-f``, ``--follow``), its value's name, its help."""

    names: tuple[str, ...]
    metavar: str
    help: str


@dataclass(frozen=True, slots=True)
class Command:
    """One command (``stockade scenario run``): usage, a line of help, its flags."""

    path: str
    usage: str
    summary: str
    flags: tuple[Flag, ...]


def _exec_command() -> Command:
    from stockade.cli._exec import USAGE

    flags = []
    for line in USAGE.splitlines():
        found = re.match(r"^  ((?:-\w, )?--[\w-]+)(?: (\S+))?\s*(.*)$", line)
        if found:
            names = tuple(n.strip() for n in found.group(1).split(","))
            flags.append(Flag(names, found.group(2) or "", found.group(3).strip()))
    return Command(
        "stockade exec",
        "stockade exec [OPTIONS] [--] COMMAND [ARGS]...",
        "Run COMMAND in a cell and exit with its exit code.",
        tuple(f for f in flags if f.names != ("-h", "--help")),
    )


def _walk(command: click.Command, ctx: click.Context, path: str) -> list[Command]:
    if path == "stockade exec":
        return [_exec_command()]
    found: list[Command] = []
    if path != "stockade":
        flags = []
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                names = tuple(
                    sorted((*param.opts, *param.secondary_opts), key=lambda n: (n.startswith("--"), n))
                )
                metavar = (
                    "" if param.is_flag else (param.metavar or param.type.get_metavar(param, ctx) or "VALUE")
                )
                flags.append(Flag(names, metavar, " ".join((param.help or "").split())))
        pieces = command.collect_usage_pieces(ctx)
        summary = (command.help or "").strip().split("\n\n")[0]
        found.append(
            Command(path, f"{path} {' '.join(pieces)}".strip(), " ".join(summary.split()), tuple(flags))
        )
    if isinstance(command, click.Group):
        for name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found.extend(_walk(sub, click.Context(sub, info_name=name, parent=ctx), f"{path} {name}"))
    return found


def commands() -> list[Command]:
    """Every command of ``stockade``, subcommands included, sorted by path."""
    from stockade.cli._app import _register, cli

    if not cli.commands:
        _register()
    ctx = click.Context(cli, info_name="stockade")
    return _walk(cli, ctx, "stockade")


def markdown() -> str:
    """The reference section of docs/CLI.md."""
    out = []
    for command in commands():
        out.append(f"### `{command.path}`\n")
        out.append(f"`{command.usage}`: {command.summary}\n")
        for flag in command.flags:
            names = ", ".join(f"`{n}`" for n in flag.names)
            value = f" {flag.metavar}" if flag.metavar else ""
            out.append(f"- {names}{value}: {flag.help}" if flag.help else f"- {names}{value}")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")


__all__ = ["Command", "Flag", "commands", "markdown"]
