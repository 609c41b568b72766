"""``stockade exec``: run one command in a cell, from the shell.

This is the hot path of every contained command, so its flags are parsed here
by hand (click alone costs ~25 ms to import) and nothing heavy is imported
unless asked for: no pydantic or YAML without ``--policy``, no JSON without
``--json`` or ``--events``. ``stockade exec --help`` prints the usage below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stockade.record import Event

USAGE = """\
Usage: stockade exec [OPTIONS] [--] COMMAND [ARGS]...

  Run COMMAND in a cell and exit with its exit code.

  Without --policy the default policy applies: system directories read-only,
  the workspace read-write, a private /tmp, nothing of the host's home,
  secrets or sockets, no network, limits on memory, processes and time.

Options:
  -p, --policy FILE      the policy file (YAML; see `stockade validate`)
  -w, --workspace DIR    the workspace, shown at the same path inside the cell
                         (default: the policy's, else a fresh directory)
  --keep-workspace       keep a fresh workspace after the run and print its path
  -e, --events FILE      write the cell's events as JSON lines when it ends
  -t, --timeout SECONDS  wall-clock limit (default: the policy's limits.timeout)
  --json                 print one JSON object (exit code, output, events)
                         instead of the command's output
  -q, --quiet            do not summarise refusals on stderr
  --without-kernel-records
                         run even where the kernel audit log cannot be read
                         (stockade inside a network namespace it cannot leave):
                         Landlock and seccomp still refuse, but their refusals
                         are not recorded; the cell's events and stderr say so
  -h, --help             show this message and exit

Exit codes: the command's own; 2 usage, 3 bad policy, 5 host or cell error,
126 the command may not be executed, 127 the command was not found.
"""

EXIT_USAGE = 2


class _Usage(Exception):
    pass


def _parse(args: list[str]) -> dict[str, object]:
    opts: dict[str, object] = {
        "policy": None,
        "workspace": None,
        "events": None,
        "timeout": None,
        "json": False,
        "keep": False,
        "quiet": False,
        "without_kernel_records": False,
        "help": False,
        "command": [],
    }
    with_value = {
        "-p": "policy",
        "--policy": "policy",
        "-w": "workspace",
        "--workspace": "workspace",
        "-e": "events",
        "--events": "events",
        "-t": "timeout",
        "--timeout": "timeout",
    }
    flags = {
        "--json": "json",
        "--keep-workspace": "keep",
        "-q": "quiet",
        "--quiet": "quiet",
        "--without-kernel-records": "without_kernel_records",
    }
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            opts["command"] = args[i + 1 :]
            break
        if arg in ("-h", "--help"):
            opts["help"] = True
            return opts
        name, eq, value = arg.partition("=")
        if name in with_value:
            if not eq:
                i += 1
                if i >= len(args):
                    raise _Usage(f"option {arg} needs a value")
                value = args[i]
            opts[with_value[name]] = value
        elif arg in flags:
            opts[flags[arg]] = True
        elif arg.startswith("-"):
            raise _Usage(f"no such option: {arg}")
        else:
            opts["command"] = args[i:]
            break
        i += 1
    timeout = opts["timeout"]
    if timeout is not None:
        try:
            seconds = float(str(timeout))
        except ValueError:
            raise _Usage(
                f"--timeout {timeout!r} is not a number of seconds; write e.g. --timeout 30"
            ) from None
        if not seconds > 0:
            raise _Usage(f"--timeout {timeout!r} must be more than 0 seconds")
        opts["timeout"] = seconds
    return opts


def exec_main(args: list[str]) -> int:
    try:
        opts = _parse(args)
    except _Usage as exc:
        sys.stderr.write(f"stockade exec: {exc}\nTry 'stockade exec --help'.\n")
        return EXIT_USAGE
    if opts["help"]:
        sys.stdout.write(USAGE)
        return 0
    command = opts["command"]
    assert isinstance(command, list)
    from stockade.errors import StockadeError

    try:
        return _run(opts, command)
    except StockadeError as exc:
        sys.stderr.write(f"stockade: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _run(opts: dict[str, object], command: list[str]) -> int:
    from stockade.cell._cell import Cell
    from stockade.policy import Policy, default_policy

    policy: Policy
    if opts["policy"] is not None:
        from stockade.policy import load_policy

        policy = load_policy(str(opts["policy"]))
    else:
        policy = default_policy()
    if not command and not policy.command:
        sys.stderr.write(
            "stockade exec: no command given and the policy has none\nTry 'stockade exec --help'.\n"
        )
        return EXIT_USAGE
    as_json = bool(opts["json"])
    workspace = opts["workspace"]
    if workspace is not None:
        workspace = os.path.abspath(str(workspace))

    def forward(stream: int, data: bytes) -> None:
        try:
            os.write(stream, data)
        except BrokenPipeError:
            pass

    with contextlib.ExitStack() as stack:
        network = None
        from stockade.cli._exec_gateway import wants_gateway

        if wants_gateway(policy):
            from stockade.cli._exec_gateway import exec_gateway

            network, hooks = stack.enter_context(exec_gateway(policy))
        unrecorded = bool(opts["without_kernel_records"])
        cell = stack.enter_context(
            Cell(
                policy,
                workspace=workspace,
                keep_workspace=bool(opts["keep"]) or None,
                network=network,
                audit="off" if unrecorded else "auto",
            )
        )
        if unrecorded and not as_json:
            # Said on screen, whatever --quiet says: the summary below cannot list them.
            sys.stderr.write(
                "stockade: --without-kernel-records: Landlock and seccomp refusals in this cell "
                "are not recorded (see `stockade doctor`)\n"
            )
        timeout = opts["timeout"]
        result = cell.run(
            command or None,
            stdin=0,
            on_output=None if as_json else forward,
            timeout=float(timeout) if isinstance(timeout, float) else None,
        )
        if network is not None:
            # The gateway's events join the kernel's, in the order they happened.
            events = sorted((*result.events, *(_in_cell(e, result.cell_id) for e in hooks.events)), key=_when)
            result = dataclasses.replace(result, events=tuple(events))
        if opts["keep"] and not as_json:
            sys.stderr.write(f"stockade: workspace kept at {cell.workspace}\n")
    if opts["events"] is not None:
        from stockade.record._jsonl import write_jsonl

        write_jsonl(str(opts["events"]), result.events)
    if as_json:
        import json

        sys.stdout.write(
            json.dumps(
                {
                    "cell": result.cell_id,
                    "exit_code": result.exit_code,
                    "duration": round(result.duration, 6),
                    "timed_out": result.timed_out,
                    "limits_hit": list(result.limits_hit),
                    "workspace": result.workspace,
                    "stdout": result.stdout.decode(errors="replace"),
                    "stderr": result.stderr.decode(errors="replace"),
                    "events": [event.to_dict() for event in result.events],
                }
            )
            + "\n"
        )
    else:
        if not opts["quiet"]:
            _summarise(result.denials, result.limits_hit)
        # Shown even with --quiet: what the operator's next git or shell would run.
        _persistence(result.events)
    return result.exit_code


def _when(event: Event) -> float:
    return event.time


def _in_cell(event: Event, cell_id: str) -> Event:
    return event if event.cell else dataclasses.replace(event, cell=cell_id)


def _persistence(events: tuple[Event, ...]) -> None:
    from stockade.cell._persist import report_lines

    for event in events:
        if event.kind == "cell.persistence":
            lines = report_lines(event.detail)
            if lines:
                sys.stderr.write("stockade: " + "\n".join(lines) + "\n")


def _summarise(denials: tuple[object, ...], limits_hit: tuple[str, ...]) -> None:
    if not denials and not limits_hit:
        return
    lines = [f"stockade: {len(denials)} refusal(s) in this cell"]
    for event in denials[:10]:
        lines.append(f"  - {getattr(event, 'summary', '')} [{getattr(event, 'layer', '')}]")
    if len(denials) > 10:
        lines.append(f"  … and {len(denials) - 10} more (see --events FILE)")
    if limits_hit:
        lines.append(f"  limits hit: {', '.join(limits_hit)}")
    sys.stderr.write("\n".join(lines) + "\n")
