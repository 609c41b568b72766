"""``stockade doctor``: what this host offers the cell, and what a policy needs of it.

Thin: the facts come from ``stockade.cell._host.probe(deep=True)``, the verdicts
from ``assess``; this module only renders them (a rich table, or JSON). Exit 0
when the host has everything the policy (the default one, or ``--policy``)
needs, 5 (``HostError.exit_code``) otherwise. docs/DOCTOR.md explains every
check and every fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from stockade.errors import HostError

if TYPE_CHECKING:
    from stockade.cell._host import Finding, HostFacts
    from stockade.cell._selftest import SelfTest
    from stockade.gateway._host import GatewayCheck
    from stockade.policy import Policy
    from stockade.record._host import RecordCheck


@click.command("doctor")
@click.option(
    "--policy",
    "policy_file",
    # No exists=True: a missing policy file is exit 3 with load_policy's message, as under validate and exec.
    metavar="FILE",
    default=None,
    help="Check what this policy file needs (default: the built-in default policy).",
)
@click.option(
    "--state",
    "state",
    metavar="DIR",
    default=None,
    help="The daemon's state directory to check (default: $STOCKADE_STATE, else the daemon's default).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the facts and verdicts as JSON.")
def doctor(policy_file: str | None, state: str | None, as_json: bool) -> None:
    """Show which containment layers this host offers and what a policy needs.

    Exits 0 when every layer the policy needs is here, 5 when one is missing,
    3 when the policy file is wrong.
    """
    from stockade.cell._host import assess, probe

    # A PolicyError propagates: the application prints it and exits 3.
    policy = _load(policy_file)
    facts = probe(deep=True)
    findings = assess(policy, facts)
    from stockade.gateway._host import probe_gateway

    gateway = probe_gateway()
    from stockade.daemon._paths import state_dir
    from stockade.record._host import probe_record

    record = probe_record(state_dir(state))
    from stockade.cell._selftest import kernel_refusals

    # Last: it needs a cell, and says more when the facts above are all there.
    self_test = kernel_refusals()
    if as_json:
        _print_json(facts, policy, findings, gateway, record, self_test)
    else:
        _print_tables(facts, policy, findings)
        _print_gateway(policy, gateway)
        _print_record(record)
        _print_self_test(self_test)
    missing = [f.requirement.feature for f in findings if not f.met]
    if not self_test.ok:
        missing.append("kernel refusals reaching the record")
    missing += [f"record: {c.name}" for c in record if not c.ok]
    if _wants_network(policy):
        missing += [f"gateway: {c.name}" for c in gateway if c.needed and not c.ok]
    if missing:
        # Raised, not ctx.exit(5): the application maps StockadeError to its exit
        # code, and the report above is already on stdout (JSON stays clean).
        raise HostError(
            f"this host lacks {', '.join(missing)}, which policy {policy.name!r} needs; "
            "see the report above and docs/DOCTOR.md",
            feature=",".join(missing),
        )


def _load(policy_file: str | None) -> Policy:
    if policy_file is None:
        from stockade.policy import default_policy

        return default_policy()
    from stockade.policy import load_policy

    policy: Policy = load_policy(policy_file)
    return policy


# --------------------------------------------------------------------------- JSON


def report(facts: HostFacts, policy: Policy, findings: list[Finding]) -> dict[str, Any]:
    """The doctor's report as plain data (what ``--json`` prints)."""
    return {
        "facts": {
            name: _plain(getattr(facts, name)) for name in facts._fields if getattr(facts, name) is not None
        },
        "policy": {"name": policy.name, "source": policy.source, "mode": policy.mode},
        "requirements": [
            {
                "feature": f.requirement.feature,
                "needs": f.requirement.needs,
                "why": f.requirement.why,
                "met": f.met,
                "have": f.have,
                "fix": f.fix,
            }
            for f in findings
        ],
        "ok": all(f.met for f in findings),
    }


def _plain(fact: Any) -> dict[str, Any]:
    value = fact.value
    return {
        "value": list(value) if isinstance(value, tuple) else value,
        "how": fact.how,
        "fix": fact.fix,
    }


def _print_json(
    facts: HostFacts,
    policy: Policy,
    findings: list[Finding],
    gateway: list[GatewayCheck],
    record: list[RecordCheck],
    self_test: SelfTest,
) -> None:
    import dataclasses
    import json

    data = report(facts, policy, findings)
    data["gateway"] = [dataclasses.asdict(check) for check in gateway]
    data["record"] = [dataclasses.asdict(check) for check in record]
    data["self_test"] = dataclasses.asdict(self_test)
    data["ok"] = data["ok"] and all(c.ok for c in record) and self_test.ok
    if _wants_network(policy):
        data["ok"] = data["ok"] and all(c.ok for c in gateway if c.needed)
    click.echo(json.dumps(data, indent=2))


def _wants_network(policy: Policy) -> bool:
    """The gateway serves every daemon run; a policy with a way out depends on it."""
    return bool(policy.network.allow or policy.secrets or policy.llm)


def _print_gateway(policy: Policy, gateway: list[GatewayCheck]) -> None:
    from stockade.cli._style import console as wide_console

    console = wide_console(highlight=False)
    rows = [(c.ok, c.needed, c.name, c.here, c.fix) for c in gateway]
    console.print(_checks_table("What the gateway needs (docs/GATEWAY.md)", rows))
    if _wants_network(policy) and any(c.needed and not c.ok for c in gateway):
        console.print(
            f"[red]Policy {policy.name!r} gives its agent a way out, which this host cannot serve.[/red]"
        )


def _print_record(record: list[RecordCheck]) -> None:
    from stockade.cli._style import console as wide_console

    console = wide_console(highlight=False)
    rows = [(c.ok, True, c.name, c.here, c.fix) for c in record]
    console.print(_checks_table("What the record needs (docs/RECORD.md)", rows))
    if any(not c.ok for c in record):
        console.print(
            "[red]The daemon cannot record here, so it would not start: every run needs the record.[/red]"
        )


def _print_self_test(self_test: SelfTest) -> None:
    from stockade.cli._style import console as wide_console

    console = wide_console(highlight=False)
    row = (self_test.ok, True, "kernel refusals reach the record", self_test.here, self_test.fix)
    console.print(_checks_table("Self-test: a refusal that must come back (docs/DOCTOR.md)", [row]))
    if not self_test.ok:
        console.print(
            "[red]Cells would refuse to start here (or run unrecorded with --without-kernel-records).[/red]"
        )


def _checks_table(title: str, rows: list[tuple[bool, bool, str, str, str | None]]) -> Any:
    """A table of (ok, needed, name, what is here, fix) checks: ✓, ✗ or ! (not needed)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("", width=1)
    table.add_column("check", style="bold")
    table.add_column("here")
    for ok, needed, name, here, fix in rows:
        mark = "[green]✓[/green]" if ok else ("[red]✗[/red]" if needed else "[yellow]![/yellow]")
        table.add_row(mark, name, here + (f" — {fix}" if fix else ""))
    return table


# --------------------------------------------------------------------------- tables


def layers(facts: HostFacts) -> list[tuple[str, str, str, str | None]]:
    """(layer, what is here, how it was seen, fix) rows for the host table."""
    from stockade.cell._host import LANDLOCK_ABI_BRINGS

    abi = facts.landlock_abi.value
    rows: list[tuple[str, str, str, str | None]] = [
        ("kernel", facts.kernel.value, facts.kernel.how, None),
        (
            "Landlock",
            f"ABI {abi}: " + ", ".join(LANDLOCK_ABI_BRINGS[n] for n in range(1, abi + 1))
            if abi
            else "absent",
            facts.landlock_abi.how,
            facts.landlock_abi.fix,
        ),
        (
            "seccomp",
            ("filters; actions " + " ".join(facts.seccomp_actions.value))
            if facts.seccomp.value
            else "no filters",
            facts.seccomp_actions.how,
            facts.seccomp.fix or facts.seccomp_actions.fix,
        ),
        (
            "seccomp logging",
            " ".join(facts.seccomp_actions_logged.value or ()) or "none",
            facts.seccomp_actions_logged.how,
            facts.seccomp_actions_logged.fix,
        ),
        (
            "namespaces",
            " ".join(facts.namespaces.value),
            facts.namespaces.how,
            facts.namespaces.fix,
        ),
        (
            "user namespaces",
            "can create" if facts.userns.value else "cannot create",
            facts.userns.how,
            facts.userns.fix,
        ),
        (
            "AppArmor userns restriction",
            "in force" if facts.userns_apparmor.value else "not in force",
            "kernel.apparmor_restrict_unprivileged_userns",
            facts.userns_apparmor.fix,
        ),
    ]
    if facts.userns_tested is not None:
        rows.append(
            (
                "user namespace test",
                "passed" if facts.userns_tested.value else "failed",
                facts.userns_tested.how,
                facts.userns_tested.fix,
            )
        )
    rows += [
        (
            "cgroup v2",
            f"{facts.cgroup_v2.value}; controllers: "
            + (" ".join(facts.cgroup_v2_controllers.value) or "none")
            if facts.cgroup_v2.value
            else "not mounted",
            facts.cgroup_v2_controllers.how,
            facts.cgroup_v2.fix,
        ),
        (
            "cgroup v1",
            " ".join(facts.cgroup_v1.value) or "none",
            facts.cgroup_v1.how,
            None,
        ),
    ]
    for name, fact in (
        ("memory", facts.cgroup_memory),
        ("pids", facts.cgroup_pids),
        ("cpu", facts.cgroup_cpu),
    ):
        rows.append(
            (
                f"cgroup {name} limit",
                f"via {fact.value}" if fact.value else "none",
                fact.how,
                fact.fix,
            )
        )
    rows.append(("cell kill", facts.cgroup_kill.value, facts.cgroup_kill.how, facts.cgroup_kill.fix))
    audit = "readable" if facts.audit.value else "not readable"
    audit_how = facts.audit.how
    audit_fix = facts.audit.fix
    if facts.audit_enabled is not None:
        audit += f"; enabled={facts.audit_enabled.value}"
        audit_how += "; " + facts.audit_enabled.how
        audit_fix = audit_fix or facts.audit_enabled.fix
    rows.append(("kernel audit", audit, audit_how, audit_fix))
    version = facts.bwrap_version.value if facts.bwrap_version is not None else None
    rows.append(
        (
            "bubblewrap (benchmarks only)",
            f"{version or '?'} at {facts.bwrap.value}" if facts.bwrap.value else "absent",
            facts.bwrap.how,
            facts.bwrap.fix,
        )
    )
    rows.append(("root", "yes" if facts.root.value else "no", facts.root.how, None))
    if facts.workbench is not None:
        rows.append(("workbench layers", facts.workbench.value, facts.workbench.how, facts.workbench.fix))
    return rows


def _print_tables(facts: HostFacts, policy: Policy, findings: list[Finding]) -> None:
    from rich.table import Table

    from stockade.cli._style import console as wide_console

    console = wide_console(highlight=False)
    host = Table(title="What this host offers", title_justify="left", show_lines=False)
    host.add_column("layer", style="bold")
    host.add_column("here")
    host.add_column("how it was seen", style="dim")
    for layer, here, how, fix in layers(facts):
        host.add_row(layer, here if fix is None else f"[yellow]{here}[/yellow]", how)
    console.print(host)

    source = f" ({policy.source})" if policy.source else ""
    needs = Table(title=f"What policy {policy.name!r}{source} needs", title_justify="left", show_lines=False)
    needs.add_column("", width=1)
    needs.add_column("feature", style="bold")
    needs.add_column("needs")
    needs.add_column("here")
    for f in findings:
        mark = "[green]✓[/green]" if f.met else "[red]✗[/red]"
        needs.add_row(mark, f.requirement.feature, f.requirement.needs, f.have)
    console.print(needs)

    missing = [f for f in findings if not f.met]
    if missing:
        console.print("[bold red]Missing[/bold red] (see docs/DOCTOR.md):")
        for f in missing:
            why = f"[dim]— for {f.requirement.why}[/dim]"
            console.print(f"  [bold]{f.requirement.feature}[/bold]: {f.fix} {why}")
        console.print(
            f"[red]stockade will refuse to run policy {policy.name!r} here: "
            f"{len(missing)} feature(s) missing.[/red]"
        )
    else:
        console.print(f"[green]This host has every layer policy {policy.name!r} needs.[/green]")
    notes = [(layer, fix) for layer, _, _, fix in layers(facts) if fix]
    needed = {f.fix for f in missing}
    notes = [(layer, fix) for layer, fix in notes if fix not in needed]
    if notes:
        console.print("Notes:")
        for layer, fix in notes:
            console.print(f"  [bold]{layer}[/bold]: {fix}")


__all__ = ["doctor", "layers", "report"]
