"""``stockade exec`` as click sees it: only so that ``stockade --help`` lists it.

The real command is parsed by ``_exec`` before click is imported; this stub is
reached only through ``stockade --help`` listings and forwards to it.
"""

from __future__ import annotations

import sys

import click


@click.command(
    "exec",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def exec_help(args: tuple[str, ...]) -> None:
    """Run a command in a cell (see `stockade exec --help`)."""
    from stockade.cli._exec import exec_main

    sys.exit(exec_main(list(args)))
