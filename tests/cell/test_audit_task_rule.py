"""The rule that spares every task outside a cell the audit rules' cost
(``_audit_mount.task_rule``): loaded only while the host has no audit rule of
its own, and every layer of a cell's record still arrives with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.cell import _audit_mount as rules
from stockade.cell._audit import AuditReader
from stockade.policy import default_policy
from tests.cell.test_audit_lease import Control

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="audit rules are the kernel's: needs root")


def _foreign() -> bytes:
    """A rule of "the operator's" that matches nothing: another key, an inode no file has."""
    payload = rules._rule(rules.ECONNREFUSED, ("connect",), extra=((102, 0x7FFE0000 + os.getpid() % 0xFFFF),))
    assert payload.endswith(rules.RULE_KEY.encode())
    return payload[: -len(rules.RULE_KEY)] + b"operator-key"


def test_stockade_rules_are_told_from_the_operators() -> None:
    ours = [*rules.rule_payloads(), rules.task_rule()]
    assert all(rules.is_stockade_rule(r) for r in ours)
    assert not rules.is_stockade_rule(_foreign())
    assert not rules.is_stockade_rule(b"\0" * 16)  # too short to be a rule
    assert rules.foreign_rules([*ours, _foreign()]) == 1
    assert rules.foreign_rules(ours) == 0


def test_the_task_rule_stays_off_while_the_host_has_rules_of_its_own() -> None:
    control = Control()
    foreign = _foreign()
    try:
        assert control.ask(rules.AUDIT_ADD_RULE, foreign) == 0
        try:
            reader = AuditReader(timeout=1.0)
            try:
                assert reader.task_rule is False
                assert reader.mount_rules_error is None  # the other rules are there all the same
                assert not control.present(rules.task_rule())
            finally:
                reader.close()
        finally:
            control.ask(rules.AUDIT_DEL_RULE, foreign)
        reader = AuditReader(timeout=1.0)
        try:
            assert reader.task_rule is True
            assert control.present(rules.task_rule())
        finally:
            reader.close()
    finally:
        control.sock.close()


def test_with_the_task_rule_every_layer_of_a_cells_record_arrives(tmp_path: Path) -> None:
    """Cells' processes are forked after their login uid is a cell's, so the
    task filter leaves them their audit context: Landlock's, seccomp's and
    the mount layer's refusals all come (the rule is loaded meanwhile)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / ".bashrc").write_text("# the user's\n")  # protected: a read-only mount in the cell
    control = Control()
    try:
        with Cell(default_policy(), workspace=workspace) as cell:
            assert control.present(rules.task_rule()), "the control: the rule is loaded while the cell runs"
            result = cell.run(
                [
                    "/usr/bin/python3",
                    "-c",
                    "import ctypes\n"
                    "for path in ('/etc/passwd', '.bashrc'):\n"
                    "    try: open(path, 'a')\n"
                    "    except OSError: pass\n"
                    "ctypes.CDLL(None).ptrace(0, 0, 0, 0)\n",
                ]
            )
    finally:
        control.sock.close()
    layers = {(e.layer, str(e.detail.get("path", ""))) for e in result.denials}
    assert ("landlock", "/etc/passwd") in layers, result.denials
    assert ("mount", str(workspace / ".bashrc")) in layers, result.denials
    assert any(e.layer == "seccomp" for e in result.denials), result.denials
