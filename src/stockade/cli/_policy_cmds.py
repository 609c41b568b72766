"""``stockade validate`` and ``stockade schema``: the policy file from the command line.

``validate FILE`` loads a policy (stockade's format or an AgentOS manifest)
and prints what it grants, or every problem with its ``file:line:col``; it
exits 0 when the file is valid and 3 when it is not. ``schema`` prints the
JSON Schema of the format, for editors (``# yaml-language-server: $schema=…``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
from typing import Any

import click

from stockade.errors import PolicyError
from stockade.exit_codes import ExitCode
from stockade.policy._model import Policy

EXIT_POLICY = ExitCode.POLICY
_LOCATED = re.compile(r"^(.*:\d+:\d+): (.*)$", re.DOTALL)


@click.command("validate")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "--show-env",
    is_flag=True,
    help="Show the values of env.set (hidden by default: they may be secrets).",
)
@click.pass_context
def validate(ctx: click.Context, file: str, as_json: bool, show_env: bool) -> None:
    """Check the policy FILE and summarise what it grants ('-' reads stdin).

    Exits 0 when the policy is valid, 3 when it is not; every problem is
    printed with its file:line:col.
    """
    from stockade.policy._load import load_policy_file, loads_policy_text

    name = "<stdin>" if file == "-" else file
    try:
        if file == "-":
            loaded = loads_policy_text(sys.stdin.read(), source="<stdin>")
        else:
            loaded = load_policy_file(file)
    except PolicyError as exc:
        problems = _problems(exc)
        if as_json:
            click.echo(json.dumps({"valid": False, "file": name, "errors": problems}, indent=2))
        else:
            for problem in problems:
                where = f"{problem['location']}: " if problem["location"] else ""
                click.echo(f"stockade: {where}{problem['message']}", err=True)
        ctx.exit(EXIT_POLICY)
    policy, fmt = loaded.policy, loaded.format
    warnings = grant_warnings(policy, fmt=fmt)
    if as_json:
        body = {
            "valid": True,
            "file": name,
            "format": fmt,
            "policy": policy_as_json(policy, show_env=show_env),
            "warnings": warnings,
        }
        click.echo(json.dumps(body, indent=2))
        return
    click.echo(summary(policy, fmt=fmt, file=name, show_env=show_env))
    for warning in warnings:
        click.echo(f"warning: {warning}")


@click.command("schema")
@click.option("--agentos", is_flag=True, help="The schema of AgentOS manifests instead.")
def schema(agentos: bool) -> None:
    """Print the JSON Schema of a policy file, for editors."""
    from stockade.policy._load import policy_json_schema

    click.echo(json.dumps(policy_json_schema(agentos=agentos), indent=2))


# ------------------------------------------------------------------------ rendering


def _problems(exc: PolicyError) -> list[dict[str, str | None]]:
    out: list[dict[str, str | None]] = [{"location": exc.location, "message": exc.message}]
    for note in getattr(exc, "__notes__", ()):
        match = _LOCATED.match(note)
        if match:
            out.append({"location": match.group(1), "message": match.group(2)})
        else:
            out.append({"location": None, "message": note})
    return out


def policy_as_json(policy: Policy, *, show_env: bool = False) -> dict[str, Any]:
    """The policy as plain JSON data; env.set values hidden unless ``show_env``."""
    data = dataclasses.asdict(policy)
    data["env"]["set"] = {name: (value if show_env else "<hidden>") for name, value in policy.env.set}
    data["tools"] = [{**rule, "match": dict(rule["match"])} for rule in data["tools"]]
    return data


def _q(path: str) -> str:
    return shlex.quote(path)


def _paths(paths: tuple[str, ...]) -> str:
    return " ".join(_q(p) for p in paths) if paths else "none"


def _host(rule: Any) -> str:
    host = f"[{rule.host}]" if ":" in rule.host else rule.host
    text = f"{host}:{','.join(str(p) for p in rule.ports)}"
    extra = [*rule.methods, *rule.paths]
    return f"{text} ({' '.join(extra)})" if extra else text


def summary(policy: Policy, *, fmt: str, file: str, show_env: bool = False) -> str:
    """What ``policy`` grants, in a few aligned lines."""
    from stockade.policy._units import format_duration, format_size

    kind = "AgentOS manifest" if fmt == "agentos" else "stockade policy"
    lines = [f"{file}: valid {kind} {policy.name!r}, mode {policy.mode}"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<12} {text}")

    command = shlex.join(policy.command).replace("\n", "\\n")
    if len(command) > 160:
        command = command[:159] + "…"
    row("command", command or "given on the command line")
    row(
        "workspace",
        f"{_q(policy.workspace)} (read-write)"
        if policy.workspace
        else "a fresh temporary directory (read-write)",
    )
    if policy.workdir:
        row("workdir", _q(policy.workdir))
    fs = policy.filesystem
    row("read-only", _paths(fs.read))
    row("read-write", _paths(fs.write))
    row("hidden", f"{_paths(fs.deny)}, and always the host's homes and sockets (docs/CELL.md)")
    protected = _paths(fs.protect)
    if policy.source:
        protected += " and this file, when it is inside the workspace"
    row("protected", protected)
    row(
        "programs",
        f"{_paths(policy.exec.allow)} (against mistakes, not a boundary: the ELF loader and "
        "programs run from memory get around it; docs/POLICY.md)"
        if policy.exec.allow
        else "any readable file",
    )
    env = policy.env
    set_text = (
        " ".join(f"{k}={shlex.quote(v)}" for k, v in env.set)
        if show_env
        else " ".join(k for k, _ in env.set) + (" (values hidden)" if env.set else "")
    )
    row(
        "environment",
        f"passes {' '.join(env.passthrough) or 'nothing'}; sets {set_text or 'nothing'}",
    )
    lim = policy.limits
    row(
        "limits",
        ", ".join(
            [
                f"memory {format_size(lim.memory) if lim.memory is not None else 'unlimited'}",
                f"processes {lim.pids if lim.pids is not None else 'unlimited'}",
                f"cpu {f'{lim.cpu:g} cores' if lim.cpu is not None else 'unlimited'}",
                "timeout " + (format_duration(lim.timeout) if lim.timeout is not None else "unlimited"),
                f"output {format_size(lim.output) if lim.output is not None else 'unlimited'}",
            ]
        ),
    )
    loopback = policy.network.loopback_ports
    row(
        "network",
        "loopback and the gateway" + (f", ports {' '.join(str(p) for p in loopback)}" if loopback else ""),
    )
    if policy.network.allow:
        hosts = ", ".join(_host(rule) for rule in policy.network.allow)
        row("egress", f"{hosts} through the gateway; everything else refused")
    else:
        row("egress", "none: the gateway refuses every host")
    if policy.secrets:
        row(
            "secrets",
            ", ".join(f"{s.name} (for {' '.join(s.hosts)})" for s in policy.secrets)
            + "; the cell holds placeholders",
        )
    if policy.tools:
        rules = ", ".join(f"{r.id}: {r.intent} → {r.verdict}" for r in policy.tools)
        row("tools", f"{rules} (the broker; no match is a deny)")
    if policy.llm:
        llm = policy.llm
        model = f" model {llm.model}" if llm.model else ""
        row("llm", f"{llm.provider} at {llm.base_url}{model}, through the cell's LLM endpoint")
    return "\n".join(lines)


def grant_warnings(policy: Policy, *, fmt: str = "stockade") -> list[str]:
    """What a valid policy grants that its author may not have meant, and
    values that are valid but cannot work as written on this host."""
    from stockade.policy._schema import covered_by

    out: list[str] = []
    fs = policy.filesystem
    if policy.mode == "audit":
        out.append("mode is audit: what the policy does not allow is recorded but not refused")
    if "/" in fs.write:
        out.append(
            "filesystem.write '/' makes the whole host filesystem writable, except hidden paths; "
            "grant the directories the agent needs instead"
        )
    elif "/" in fs.read:
        out.append("filesystem.read '/' shows the whole host filesystem, except hidden paths")
    for path in (*fs.read, *fs.write, *((policy.workspace,) if policy.workspace else ())):
        if re.fullmatch(r"/home(/[^/]+)?|/root", path):
            out.append(
                f"{path!r} holds a home directory (~/.ssh, ~/.aws, shell history…); "
                "grant a project directory instead"
            )
    if "/tmp" in (*fs.read, *fs.write):
        out.append("'/tmp' in the cell is its own private /tmp, not the host's; grant a directory under it")
    grants = [*fs.read, *fs.write, *((policy.workspace,) if policy.workspace else ())]
    if policy.workdir and not covered_by(policy.workdir, grants):
        out.append(f"workdir {policy.workdir!r} is outside every granted path, so the cell cannot enter it")
    if policy.limits.memory is None:
        out.append("there is no memory limit: one process can exhaust the host's memory")
    if policy.limits.pids is None:
        out.append("there is no process limit: a fork bomb can exhaust the host")
    out.extend(_implausible(policy, fmt))
    return out


def _implausible(policy: Policy, fmt: str) -> list[str]:
    """Values the schema accepts that cannot do what they say here."""
    from stockade.cell._layers import GATEWAY_PORT, LLM_PORT
    from stockade.policy._schema import covered_by
    from stockade.policy._units import format_size

    out: list[str] = []
    limits = policy.limits
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if limits.memory is not None and limits.memory > memory:
        out.append(
            f"limits.memory {format_size(limits.memory)} is more than this host's {memory >> 30} GiB, "
            "so it limits nothing; give what the agent needs, such as 2G"
        )
    cores = os.cpu_count() or 1
    if limits.cpu is not None and limits.cpu > cores:
        out.append(
            f"limits.cpu {limits.cpu:g} is more cores than this host has ({cores}), so it limits nothing; "
            f"give at most {cores}"
        )
    if limits.pids is not None and limits.pids < 3:
        out.append(
            f"limits.pids {limits.pids} fails every start: the cell's init and the command are two "
            "processes already; give at least 16"
        )
    elif limits.pids is not None and limits.pids < 8:
        out.append(
            f"limits.pids {limits.pids} leaves a shell no room to run a pipeline or a build; give at least 16"
        )
    for port in policy.network.loopback_ports:
        if port in (GATEWAY_PORT, LLM_PORT):
            what = "proxy" if port == GATEWAY_PORT else "LLM endpoint"
            out.append(
                f"network.loopback_ports {port} is the gateway's {what} in the cell; "
                "the cell's own server cannot listen there; choose another port"
            )
    if fmt == "agentos" and policy.network.allow:
        out.append(
            "allowed_hosts are reached through the gateway only (HTTP(S)_PROXY in the cell); "
            "a direct connect to them is refused, so a client that ignores the proxy cannot reach them"
        )
    # The broker's grants: filesystem.write and rw mounts, not the workspace
    # (the agent writes there itself; the broker refuses it, docs/BROKER.md).
    writable = [*policy.filesystem.write, *(m.source for m in policy.filesystem.mounts if m.mode == "rw")]
    for rule in policy.tools:
        path = dict(rule.match).get("path")
        if rule.intent != "fs.write" or rule.verdict == "deny" or not path or not path.startswith("/"):
            continue
        fixed = re.split(r"[*?\[]", path, maxsplit=1)[0].rstrip("/") or "/"
        if not covered_by(fixed, writable):
            out.append(
                f"tools rule {rule.id!r} lets fs.write reach {path!r}, which is outside every writable grant "
                f"(filesystem.write; the broker's grants leave out the workspace), so the broker refuses it "
                "whatever the rule says; "
                f"add {fixed!r} to filesystem.write"
            )
    return out


__all__ = ["grant_warnings", "policy_as_json", "schema", "summary", "validate"]
