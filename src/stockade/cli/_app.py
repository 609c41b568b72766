"""The click application behind every command except ``exec`` (see ``main``).

Exit codes are stable, come from the one table in ``stockade.exit_codes`` and
are documented in docs/CLI.md; a contained command's own exit code is passed
through. Every error line is printed in the one style of ``_style``.
"""

from __future__ import annotations

import click

from stockade import __version__
from stockade.cli._style import click_error_line, echo_error
from stockade.errors import StockadeError
from stockade.exit_codes import ExitCode

EXIT_OK = ExitCode.OK
EXIT_USAGE = ExitCode.USAGE
EXIT_POLICY = ExitCode.POLICY
EXIT_DAEMON_UNREACHABLE = ExitCode.DAEMON_UNREACHABLE
EXIT_HOST = ExitCode.HOST
EXIT_NOT_FOUND = ExitCode.NOT_FOUND
EXIT_DENIED = ExitCode.DENIED
EXIT_INTERRUPTED = ExitCode.INTERRUPTED


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
    from stockade.cli._bench_cmds import bench
    from stockade.cli._daemon_cmds import COMMANDS as DAEMON_COMMANDS
    from stockade.cli._dashboard_cmd import dashboard
    from stockade.cli._demo import demo
    from stockade.cli._doctor import doctor
    from stockade.cli._exec_cmd import exec_help
    from stockade.cli._house_cmds import COMMANDS as HOUSE_COMMANDS
    from stockade.cli._image_cmds import image
    from stockade.cli._mock_cmd import mock_llm
    from stockade.cli._policy_cmds import schema, validate
    from stockade.cli._record_cmds import export_cmd, verify
    from stockade.cli._revert_cmd import revert_cmd
    from stockade.cli._scenario_cmds import scenario
    from stockade.cli._session_cmds import session

    for command in (
        bench,
        dashboard,
        demo,
        doctor,
        exec_help,
        export_cmd,
        image,
        mock_llm,
        revert_cmd,
        scenario,
        schema,
        session,
        validate,
        verify,
        *DAEMON_COMMANDS,
        *HOUSE_COMMANDS,
    ):
        cli.add_command(command)


def run_app(args: list[str]) -> int:
    _register()
    try:
        code = cli.main(args=args, prog_name="stockade", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        click.echo(click_error_line(exc), err=True)
        return EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code
    except click.exceptions.Abort:
        return EXIT_INTERRUPTED
    except StockadeError as exc:
        echo_error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    # With standalone_mode=False, click returns what the command returned (or
    # the code given to ctx.exit): commands return their exit code.
    return code if isinstance(code, int) else EXIT_OK
