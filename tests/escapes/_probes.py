"""Probes for the escape suite: try things inside a real cell, read back what happened.

A probe is a short Python program run by Debian's ``/usr/bin/python3`` inside a
cell (the venv's interpreter lives under ``/root``, which the cell sees only as
a decoy). It makes a list of *attempts*, each the body of a small function, and
prints one JSON object: for every attempt, whether it worked (and what it
returned) or the errno it failed with. The test then holds three things side by
side: the attempt's outcome, the events of the run (the kernel's refusals read
from the audit log) and a control attempt that must work.

Inside an attempt's body these names are available: ``os``, ``sys``, ``json``,
``errno``, ``ctypes``, ``socket``, ``stat``, ``libc`` (the C library, errno
kept) and ``sys_call(name_or_nr, *args)``, a raw ``syscall(2)`` that raises
``OSError`` on -1 and takes ints, bytes or ctypes objects.
"""

from __future__ import annotations

import errno
import json
import os
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stockade.cell import Cell, CellResult
from stockade.cell._syscall_table import SYSCALLS
from stockade.record import Event

PYTHON = "/usr/bin/python3"
"""Debian's interpreter: in every cell's view (``/usr``), stdlib only."""

RUN_TIMEOUT = 30.0
"""Wall-clock bound on one probe run: a hang fails the test, it never blocks CI."""

_PRELUDE = r"""
import ctypes, errno, json, os, socket, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
_NR = json.loads(sys.argv[1])

def _arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a

def sys_call(nr, *args):
    if isinstance(nr, str):
        nr = _NR[nr]
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r

_results = {}

def _attempt(name, fn):
    try:
        value = fn()
    except OSError as exc:
        _results[name] = {"ok": False, "errno": exc.errno, "error": str(exc)}
    except BaseException as exc:  # a bug in the probe, not a refusal
        _results[name] = {"ok": False, "errno": None, "error": repr(exc)}
    else:
        try:
            json.dumps(value)
        except TypeError:
            value = repr(value)
        _results[name] = {"ok": True, "value": value}
"""

_EPILOGUE = r"""
sys.stdout.write("\n" + _MARK + json.dumps(_results) + "\n")
sys.stdout.flush()
"""

_MARK = "@@probe@@"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One thing to try: ``body`` is the body of a function (it may ``return`` a
    JSON-able value); ``setup`` runs at module level before any attempt."""

    name: str
    body: str
    setup: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt did."""

    name: str
    ok: bool
    errno: int | None = None
    error: str = ""
    value: Any = None

    def __str__(self) -> str:
        if self.ok:
            return f"{self.name}: worked, returned {self.value!r}"
        return f"{self.name}: failed, errno {self.errno} ({self.error})"


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's run: the cell's result and each attempt's outcome."""

    result: CellResult
    outcomes: dict[str, Outcome]

    def __getitem__(self, name: str) -> Outcome:
        try:
            return self.outcomes[name]
        except KeyError:
            raise AssertionError(
                f"attempt {name!r} left no outcome; the probe printed:\n{self.transcript()}"
            ) from None

    @property
    def events(self) -> tuple[Event, ...]:
        return self.result.events

    def denials(self, layer: str | None = None) -> list[Event]:
        return [
            e for e in self.result.events if e.kind == "cell.denied" and (layer is None or e.layer == layer)
        ]

    def landlock(self, *, path: str | None = None, blocker: str | None = None) -> list[Event]:
        """Landlock refusals, those on ``path`` (exact) and naming ``blocker``."""
        return [
            e
            for e in self.denials("landlock")
            if (path is None or e.detail.get("path") == path)
            and (blocker is None or blocker in (e.detail.get("blockers") or ()))
        ]

    def seccomp(self, syscall: str) -> list[Event]:
        return [e for e in self.denials("seccomp") if e.detail.get("syscall") == syscall]

    def transcript(self) -> str:
        r = self.result
        lines = [
            f"exit {r.exit_code}, limits {r.limits_hit}",
            "stdout: " + r.stdout.decode(errors="replace")[-3000:],
            "stderr: " + r.stderr.decode(errors="replace")[-3000:],
            "events:",
            *(
                f"  {e.kind} {e.layer} {e.outcome}: {e.summary} {e.detail}"
                for e in r.events
                if e.kind != "cell.start"
            ),
        ]
        return "\n".join(lines)


def script(attempts: Sequence[Attempt]) -> str:
    """The probe program for ``attempts`` (run with the syscall table as argv[1])."""
    parts = [_PRELUDE, f"_MARK = {_MARK!r}"]
    for attempt in attempts:
        if attempt.setup:
            parts.append(textwrap.dedent(attempt.setup))
    for i, attempt in enumerate(attempts):
        body = textwrap.indent(textwrap.dedent(attempt.body).strip() or "pass", "    ")
        parts.append(f"def _a{i}():\n{body}\n_attempt({attempt.name!r}, _a{i})")
    parts.append(_EPILOGUE)
    return "\n".join(parts)


_SYS_CALL = re.compile(r"""sys_call\(\s*['"](\w+)['"]""")


def _syscall_numbers(attempts: Sequence[Attempt]) -> str:
    """The numbers of the syscalls the attempts name (``sys_call('ptrace', …)``)."""
    names = set()
    for attempt in attempts:
        names.update(_SYS_CALL.findall(attempt.body + attempt.setup))
    return json.dumps({name: SYSCALLS[name] for name in sorted(names)})


def run_probe(
    cell: Cell,
    attempts: Sequence[Attempt] | Attempt,
    *,
    stdin: int | None = None,
    timeout: float = RUN_TIMEOUT,
    expect_exit: int | None = 0,
) -> Probe:
    """Run ``attempts`` in one fresh cell of ``cell`` and parse what they did."""
    if isinstance(attempts, Attempt):
        attempts = [attempts]
    names = [a.name for a in attempts]
    assert len(set(names)) == len(names), f"attempt names repeat: {names}"
    argv = [PYTHON, "-I", "-c", script(attempts), _syscall_numbers(attempts)]
    result = cell.run(argv, stdin=stdin, timeout=timeout)
    probe = Probe(result, _parse(result))
    if expect_exit is not None:
        assert result.exit_code == expect_exit, f"the probe did not finish:\n{probe.transcript()}"
    for name in names:
        probe[name]  # every attempt reported
    return probe


def _parse(result: CellResult) -> dict[str, Outcome]:
    text = result.stdout.decode(errors="replace")
    _, mark, tail = text.rpartition(_MARK)
    if not mark:
        return {}
    raw = json.loads(tail.strip().splitlines()[0])
    return {
        name: Outcome(name, o["ok"], o.get("errno"), o.get("error", ""), o.get("value"))
        for name, o in raw.items()
    }


# --------------------------------------------------------------------- assertions


def assert_refused(outcome: Outcome, *errnos: int) -> None:
    """The attempt failed, with one of ``errnos`` (an OSError, not a probe bug)."""
    assert not outcome.ok, f"ESCAPE: {outcome}"
    assert outcome.errno is not None, f"the probe itself broke: {outcome}"
    assert outcome.errno in errnos, f"refused, but not as expected ({errnos}): {outcome}"


def assert_works(outcome: Outcome) -> Any:
    """The control attempt worked; returns what it returned."""
    assert outcome.ok, f"the legitimate neighbour failed: {outcome}"
    return outcome.value


def assert_landlock_denial(probe: Probe, path: str, *blockers: str) -> Event:
    """A Landlock refusal of ``path`` naming every one of ``blockers`` was recorded."""
    found = probe.landlock(path=path)
    matching = [e for e in found if set(blockers) <= set(e.detail.get("blockers") or ())]
    assert matching, (
        f"no landlock denial of {path} with blockers {blockers} was recorded:\n{probe.transcript()}"
    )
    event = matching[0]
    assert event.outcome == "denied"
    assert event.cell == probe.result.cell_id
    assert path in event.summary and "landlock" in event.summary, event.summary
    return event


def assert_seccomp_denial(probe: Probe, syscall: str) -> Event:
    """A seccomp refusal of ``syscall`` was recorded, as an EPERM (not a kill)."""
    found = probe.seccomp(syscall)
    assert found, f"no seccomp denial of {syscall} was recorded:\n{probe.transcript()}"
    event = found[0]
    assert event.outcome == "denied"
    assert event.cell == probe.result.cell_id
    assert event.detail.get("action") == "errno", event.detail
    assert event.detail.get("nr") == SYSCALLS[syscall]
    assert syscall in event.summary and "seccomp" in event.summary, event.summary
    return event


def assert_no_denials(probe: Probe, *, layers: Iterable[str] = ("landlock", "seccomp")) -> None:
    """Nothing of ``layers`` was refused in the run (a control ran clean)."""
    wanted = set(layers)
    extra = [e for e in probe.denials() if e.layer in wanted]
    assert not extra, f"unexpected refusals:\n{probe.transcript()}"


MOUNT_RECORDED = {
    errno.EROFS: "EROFS",
    errno.EBUSY: "EBUSY",
    errno.EXDEV: "EXDEV",
    errno.EACCES: "EACCES",
    errno.EPERM: "EPERM",
}
"""What the read-only mount layer (and file permissions: EACCES, EPERM,
layer ``dac``) refuses that the kernel audit rules of
``stockade.cell._audit_mount`` record (an EXDEV only into a protected or
pinned directory, or a place the cell may not write: see ``Cell``)."""


def mount_records(probe: Probe, outcome: Outcome, *paths: Path | str) -> list[Event]:
    """The records of a refused attempt by the mount layer or file
    permissions: events of layer ``mount`` or ``dac`` with the attempt's
    errno, naming one of ``paths`` (the file, or the directory it would have
    been made in)."""
    code = MOUNT_RECORDED.get(outcome.errno or 0)
    wanted = {os.path.normpath(str(p)) for p in paths}
    return [
        e
        for e in probe.denials()
        if e.layer in ("mount", "dac")
        and code is not None
        and e.detail.get("errno") == code
        and os.path.normpath(str(e.detail.get("path"))) in wanted
        and code in e.summary
    ]


def assert_mount_refusal(probe: Probe, outcome: Outcome, *paths: Path | str) -> Event:
    """The attempt failed with an errno of ``MOUNT_RECORDED`` and that is on record (``mount_records``)."""
    assert outcome.errno in MOUNT_RECORDED, f"{outcome}: not a refusal the mount layer records"
    found = mount_records(probe, outcome, *paths)
    assert found, f"no mount-layer record of {outcome} on {sorted(map(str, paths))}:\n{probe.transcript()}"
    assert found[0].outcome == "denied" and found[0].kind == "cell.denied" and found[0].detail.get("comm")
    return found[0]


def expect_record(probe: Probe, found: list[Event], what: str, *, gap: str | None) -> None:
    """The attempt left a record, or a *known* gap explains why it did not.

    ``gap`` names a stockade shortcoming that the kernel could record but the
    cell does not yet arrange (see the test's docstring): the test is then an
    expected failure. Once the record appears, the gap is closed and the test
    fails until ``gap`` is removed, so that a fix cannot go unnoticed.
    """
    if gap is None:
        assert found, f"no record of {what}:\n{probe.transcript()}"
    elif found:
        pytest.fail(f"known gap closed, {what} is now recorded: drop gap={gap!r}")
    else:
        pytest.xfail(f"GAP (no record of {what}): {gap}")


def leaked(probe: Probe, secret: str) -> bool:
    """Whether ``secret`` shows anywhere the agent or the record could carry it."""
    r = probe.result
    blob = r.stdout + r.stderr + repr([e.to_dict() for e in r.events]).encode()
    return secret.encode() in blob
