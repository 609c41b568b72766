"""The click application behind every command except ``exec`` (see ``main``).

Exit codes are stable and documented in docs/CLI.md:
0 ok, 2 usage, 3 bad policy, 4 daemon unreachable, 5 daemon or host error,
6 not found, 126 denied by policy, 130 interrupted; a contained command's own
exit code is passed through.
"""

from __future__ import annotations

import click

from stockade import __version__
from stockade.errors import StockadeError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_POLICY = 3
EXIT_DAEMON_UNREACHABLE = 4
EXIT_HOST = 5
EXIT_NOT_FOUND = 6
EXIT_DENIED = 126
EXIT_INTERRUPTED = 130


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stockade")
def cli() -> None:
    """stockade: contain AI agents on Linux.

    Every agent runs in a cell (namespaces, Landlock, seccomp, cgroups, no
    network); every refusal of every layer is an event.
    """


def _register() -> None:
    # Each command lives in its own module; importing them here keeps the
    # list of commands in one place.
    from stockade.cli._daemon_cmds import COMMANDS as DAEMON_COMMANDS
    from stockade.cli._dashboard_cmd import dashboard
    from stockade.cli._demo import demo
    from stockade.cli._doctor import doctor
    from stockade.cli._exec_cmd import exec_help
    from stockade.cli._mock_cmd import mock_llm
    from stockade.cli._policy_cmds import schema, validate
    from stockade.cli._record_cmds import export_cmd, verify
    from stockade.cli._revert_cmd import revert_cmd
    from stockade.cli._scenario_cmds import scenario

    for command in (
        dashboard,
        demo,
        doctor,
        exec_help,
        export_cmd,
        mock_llm,
        revert_cmd,
        scenario,
        schema,
        validate,
        verify,
        *DAEMON_COMMANDS,
    ):
        cli.add_command(command)


def run_app(args: list[str]) -> int:
    _register()
    try:
        code = cli.main(args=args, prog_name="stockade", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except click.exceptions.Abort:
        return EXIT_INTERRUPTED
    except StockadeError as exc:
        click.echo(f"stockade: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    # With standalone_mode=False, click returns what the command returned (or
    # the code given to ctx.exit): commands return their exit code.
    return code if isinstance(code, int) else EXIT_OK
