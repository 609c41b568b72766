"""``stockade exec``: run one command in a cell, from the shell.

This is the hot path of every contained command, so its flags are parsed here
by hand (click alone costs ~25 ms to import) and nothing heavy is imported
unless asked for: no pydantic or YAML without ``--policy``, no JSON without
``--json`` or ``--events``. ``stockade exec --help`` prints the usage below.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING

from stockade.exit_codes import ExitCode

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
  --image REF            run in a workbench: the image's root filesystem as /
                         (name:tag or sha256:..., see `stockade image ls`)
  --user USER            who the command runs as inside: root (the cell's own
                         root, never the host's), a user of the image, a uid
  -e, --env NAME[=VALUE] set NAME in the cell: to VALUE, or without one to its
                         value here (repeatable)
  --events FILE          write the cell's events as JSON lines (mode 0600)
                         when it ends
  -t, --timeout DURATION wall-clock limit, such as 90, 30s, 5m or 1h30m
                         (default: the policy's limits.timeout)
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
126 the command may not be executed, 127 the command was not found,
130 interrupted (docs/CLI.md).
"""

EXIT_USAGE = ExitCode.USAGE
EXIT_INTERRUPTED = ExitCode.INTERRUPTED
_HELP = "stockade exec"


class _Usage(Exception):
    pass


def _parse(args: list[str]) -> dict[str, object]:
    opts: dict[str, object] = {
        "policy": None,
        "workspace": None,
        "image": None,
        "user": None,
        "events": None,
        "timeout": None,
        "json": False,
        "keep": False,
        "quiet": False,
        "without_kernel_records": False,
        "help": False,
        "env": [],
        "command": [],
    }
    with_value = {
        "-p": "policy",
        "--policy": "policy",
        "-w": "workspace",
        "--workspace": "workspace",
        "--events": "events",
        "--image": "image",
        "--user": "user",
        "-e": "env",
        "--env": "env",
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
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in with_value and len(arg) > 2 and arg[:2] in with_value and arg[1] != "-":
            name, eq, value = arg[:2], "=", arg[2:]  # -tVALUE, -eNAME=VALUE
        if name in with_value:
            if not eq:
                i += 1
                if i >= len(args):
                    raise _Usage(f"the option {arg} needs a value")
                value = args[i]
            if with_value[name] == "env":
                env = opts["env"]
                assert isinstance(env, list)
                env.append(_env_item(value))
            else:
                opts[with_value[name]] = value
        elif arg in flags:
            opts[flags[arg]] = True
        elif arg.startswith("-"):
            raise _Usage(f"there is no option {arg}")
        else:
            opts["command"] = args[i:]
            break
        i += 1
    timeout = opts["timeout"]
    if timeout is not None:
        # The policy's grammar of durations (90, 30s, 1h30m), without pydantic.
        from stockade.policy._units import parse_duration, show

        try:
            seconds = parse_duration(str(timeout))
        except ValueError as exc:
            raise _Usage(f"--timeout {exc}") from None
        if not seconds > 0:
            raise _Usage(f"--timeout {show(timeout)} is not more than 0 seconds; give a duration such as 30s")
        opts["timeout"] = seconds
    user = opts["user"]
    if user is not None and (not str(user) or (str(user).isdigit() and int(str(user)) > 65534)):
        raise _Usage(f"--user {str(user)!r} is not root, a user name or a uid from 0 to 65534")
    events = opts["events"]
    if events is not None:
        # Checked before the command runs: its events would be lost after it.
        directory = os.path.dirname(os.path.abspath(str(events)))
        if not os.path.isdir(directory):
            raise _Usage(
                f"--events {str(events)!r}: the directory {directory!r} does not exist; create it first"
            )
        if os.path.isdir(str(events)):
            raise _Usage(f"--events {str(events)!r} is a directory; name a file in it")
    return opts


def _env_item(value: str) -> tuple[str, str | None]:
    name, eq, text = value.partition("=")
    if not name or name[0].isdigit() or not all(c.isascii() and (c.isalnum() or c == "_") for c in name):
        raise _Usage(f"--env {value!r} does not start with a variable's name; write NAME=VALUE or NAME")
    return name, (text if eq else None)


def exec_main(args: list[str]) -> int:
    try:
        opts = _parse(args)
    except _Usage as exc:
        sys.stderr.write(f"stockade: {exc}; see `{_HELP} --help`\n")
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
        return EXIT_INTERRUPTED


def _run(opts: dict[str, object], command: list[str]) -> int:
    from stockade.cell._cell import Cell
    from stockade.policy import Policy, default_policy

    policy: Policy
    if opts["policy"] is not None:
        from stockade.policy import load_policy

        policy = load_policy(str(opts["policy"]))
    else:
        policy = default_policy()
    if opts["image"] is not None or opts["user"] is not None:
        # A workbench: the policy's own image and user give way to the flags'.
        policy = policy._replace(
            image=str(opts["image"]) if opts["image"] is not None else policy.image,
            user=str(opts["user"]) if opts["user"] is not None else policy.user,
        )
    if not command and not policy.command:
        sys.stderr.write(
            f"stockade: no command given and the policy has none; give one after `--`; see `{_HELP} --help`\n"
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
                extra_env=_sdk_env(policy, _extra_env(opts["env"])),
                files=_sdk_files(),
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
            result = result._replace(events=tuple(events))
        if opts["keep"] and not as_json:
            sys.stderr.write(f"stockade: workspace kept at {cell.workspace}\n")
    if opts["events"] is not None:
        from stockade.record._jsonl import write_jsonl

        try:
            write_jsonl(str(opts["events"]), result.events)
        except OSError as exc:
            sys.stderr.write(
                f"stockade: cannot write the events to {str(opts['events'])!r}: {exc.strerror}; "
                f"the command ran (exit code {result.exit_code}) but its events are lost\n"
            )
            return 5
    if as_json:
        import json

        text = (
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
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (`| head`, `| true`): said once, no
            # traceback, and the interpreter's own flush must not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            sys.stderr.write(
                f"stockade: the JSON result could not be written (its reader closed standard output); "
                f"the command ran and exited with {result.exit_code}\n"
            )
    else:
        if not opts["quiet"]:
            _summarise(result.denials, result.limits_hit)
            _failures(result.events)
        # Shown even with --quiet: what the operator's next git or shell would run.
        _persistence(result.events)
    return result.exit_code


SDK_IN_CELL = "/run/stockade/lib"
"""Where the agent SDK is shown in a cell (``stockade.sdk.IN_CELL_DIR``, which
costs ~200 ms to import here; a test keeps the two equal)."""


def _sdk_files() -> dict[str, bytes] | None:
    # `import stockade_agent` works in an exec cell as under the daemon; it has
    # no broker here, and says so (NotInCell) when asked to connect.
    import stockade

    try:
        with open(os.path.join(os.path.dirname(stockade.__file__), "sdk", "stockade_agent.py"), "rb") as f:
            return {f"{SDK_IN_CELL}/stockade_agent.py": f.read()}
    except OSError:
        return None


def _sdk_env(policy: object, env: dict[str, str] | None) -> dict[str, str] | None:
    chosen = dict(env or {})
    set_by_policy = dict(getattr(getattr(policy, "env", None), "set", ()) or ())
    if "PYTHONPATH" not in chosen and "PYTHONPATH" not in set_by_policy:
        chosen["PYTHONPATH"] = SDK_IN_CELL
    return chosen or None


def _extra_env(items: object) -> dict[str, str] | None:
    """``--env`` as the cell's variables: ``NAME`` alone takes its value here
    (Docker's ``-e NAME``), and is left out when it is unset here."""
    assert isinstance(items, list)
    env: dict[str, str] = {}
    for name, value in items:
        if value is None:
            if name in os.environ:
                env[name] = os.environ[name]
        else:
            env[name] = value
    return env or None


def _when(event: Event) -> float:
    return event.time


def _in_cell(event: Event, cell_id: str) -> Event:
    return event if event.cell else event._replace(cell=cell_id)


def _persistence(events: tuple[Event, ...]) -> None:
    from stockade.cell._persist import report_lines

    for event in events:
        if event.kind == "cell.persistence":
            lines = report_lines(event.detail)
            if lines:
                sys.stderr.write("stockade: " + "\n".join(lines) + "\n")


def gateway_failures(events: tuple[Event, ...] | list[Event]) -> list[Event]:
    """Requests the gateway allowed whose upstream then failed (DNS, TLS
    verification, a refused connection, a 5xx): not refusals, but the reason
    pip says only "No matching distribution"."""
    out = []
    for event in events:
        if event.kind != "http.request" or event.outcome != "allowed":
            continue
        status = event.detail.get("status")
        if status is None or (isinstance(status, int) and status >= 500):
            out.append(event)
    return out


def _failures(events: tuple[Event, ...]) -> None:
    failed = gateway_failures(events)
    if not failed:
        return
    lines = [f"stockade: {len(failed)} request(s) allowed by the gateway failed upstream"]
    for event in failed[:10]:
        detail = event.detail
        where = f"{detail.get('method')} {detail.get('host')}:{detail.get('port')}"
        status = detail.get("status")
        why = detail.get("reason") or "no answer"
        lines.append(f"  - {where}: {why} ({status or 'no answer'}) [gateway]")
    if len(failed) > 10:
        lines.append(f"  … and {len(failed) - 10} more (see --events FILE)")
    sys.stderr.write("\n".join(lines) + "\n")


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
