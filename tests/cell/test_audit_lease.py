"""The audit rules' lease handed at close to a detached remover (``_audit_lease``).

The remover's own tests use a lease, a mark and a rule of their own (a rule
that matches nothing: key ``stockade-vfs``, an inode no file has), so that
they never take stockade's rules from under another process of the host.
No test waits for a time: each polls for the thing itself, with a bound.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade._netns import inside_path
from stockade.cell import _audit_mount
from stockade.cell._audit import RULES_LEASE, _list_rules
from stockade.cell._audit_lease import REMOVER_MARK, hand_over, remover_pid
from tests._netns import TestNetns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="audit rules are the kernel's: needs root")

GRACE = 0.2
BOUND = 60.0
"""Seconds any poll below may take before the test fails (never reached when it works)."""


def _until(what: Callable[[], object], message: str) -> None:
    deadline = time.monotonic() + BOUND
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


class Control:
    """A NETLINK_AUDIT control socket of the test's own."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)
        self.sock.bind((0, 0))
        self.seq = 0

    def ask(self, kind: int, payload: bytes) -> int:
        """Send one rule request; the kernel's answer (0 or an errno)."""
        self.seq += 1
        self.sock.send(struct.pack("=IHHII", 16 + len(payload), kind, 0x5, self.seq, 0) + payload)
        while True:
            data = self.sock.recv(65536)
            _length, kind_, _flags, seq, _pid = struct.unpack_from("=IHHII", data)
            if kind_ == 2 and seq == self.seq:
                return -int(struct.unpack_from("=i", data, 16)[0])

    def present(self, payload: bytes) -> bool:
        """Whether the kernel has the rule (adding it again answers EEXIST;
        if it was absent, the probe removes what it added)."""
        answer = self.ask(_audit_mount.AUDIT_ADD_RULE, payload)
        if answer == 0:
            self.ask(_audit_mount.AUDIT_DEL_RULE, payload)
        return answer == errno.EEXIST


@pytest.fixture
def control() -> Iterator[Control]:
    c = Control()
    try:
        yield c
    finally:
        c.sock.close()


@pytest.fixture
def rule(control: Control) -> Iterator[bytes]:
    """A rule of this test's alone, loaded."""
    inode = 0x7FFF0000 + os.getpid() % 0xFFFF
    payload = _audit_mount._rule(_audit_mount.ECONNREFUSED, ("connect",), extra=((102, inode),))
    assert control.ask(_audit_mount.AUDIT_ADD_RULE, payload) == 0
    try:
        yield payload
    finally:
        control.ask(_audit_mount.AUDIT_DEL_RULE, payload)


def _lease(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _started(mark: Path) -> int:
    """The pid of the remover once it has started."""
    found: list[int] = []

    def started() -> bool:
        pid = remover_pid(str(mark))
        if pid:
            found.append(pid)
        return bool(pid)

    _until(started, "the remover never started")
    return found[0]


def _gone(pid: int) -> bool:
    """Whether nothing of ``pid`` is left (not even a zombie)."""
    return not os.path.exists(f"/proc/{pid}")


def _zombie_children() -> list[int]:
    """This process's children that ended and were not waited for."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry))
    return found


def _hand_over(control: Control, lease_path: Path, mark: Path, rule: bytes, grace: float = GRACE) -> int:
    """A closer: its lease handed to a remover; the remover's pid."""
    lease = _lease(lease_path)
    try:
        assert hand_over(lease, [rule], control.sock.fileno(), grace=grace, mark_path=str(mark))
    finally:
        os.close(lease)
    return _started(mark)


def test_the_last_closers_rule_goes_after_the_grace_and_the_remover_holds_nothing_else(
    tmp_path: Path, control: Control, rule: bytes
) -> None:
    lease_path, mark = tmp_path / "lease", tmp_path / "mark"
    pid = _hand_over(control, lease_path, mark, rule)
    # Detached: another session, not this process's child, nothing of this
    # process held (its pipes, its working directory), only what it needs.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ppid, sid = int(fields[1]), int(fields[3])
    held = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    cwd = os.readlink(f"/proc/{pid}/cwd")
    assert control.present(rule), "the control: the remover waits the grace with the lease"
    _until(lambda: _gone(pid), "the remover never ended")
    assert not control.present(rule)
    assert ppid != os.getpid() and sid == pid
    assert not _zombie_children(), "setsid, the remover's parent, was waited for"
    assert cwd == "/"
    assert held[0] == held[1] == held[2] == os.devnull
    assert (held[3], held[4]) == (str(lease_path), str(mark))
    assert held[5].startswith("socket:") and len(held) == 6, held


def test_a_reader_starting_during_the_grace_keeps_the_rule(
    tmp_path: Path, control: Control, rule: bytes
) -> None:
    lease_path, mark = tmp_path / "lease", tmp_path / "mark"
    pid = _hand_over(control, lease_path, mark, rule)
    reader = _lease(lease_path)  # a new reader: takes the lease at once, no wait
    try:
        # The remover asked for the lease exclusively after the grace and now
        # waits for this reader (its request is in /proc/locks, blocked).
        inode = os.stat(lease_path).st_ino

        def waiting() -> bool:
            locks = Path("/proc/locks").read_text().splitlines()
            return any("->" in line and f" {pid} " in line and f":{inode} " in line for line in locks)

        _until(waiting, "the remover never asked for the lease")
        assert control.present(rule), "a reader holds the lease: the rule stays"
        assert remover_pid(str(mark)) == pid
    finally:
        os.close(reader)
    _until(lambda: _gone(pid), "the remover never ended after the reader went")
    assert not control.present(rule)


def test_a_killed_remover_leaves_the_rule_to_the_next_closer(
    tmp_path: Path, control: Control, rule: bytes
) -> None:
    lease_path, mark = tmp_path / "lease", tmp_path / "mark"
    first = _hand_over(control, lease_path, mark, rule)
    os.kill(first, signal.SIGKILL)
    _until(lambda: _gone(first), "the killed remover is still there")
    assert remover_pid(str(mark)) is None
    assert control.present(rule), "left to the next closer"
    second = _hand_over(control, lease_path, mark, rule)
    assert second != first
    _until(lambda: _gone(second), "the second remover never ended")
    assert not control.present(rule)


def test_a_remover_told_to_stop_removes_the_rule_at_once_when_nobody_needs_it(
    tmp_path: Path, control: Control, rule: bytes
) -> None:
    """SIGTERM (``systemctl stop`` of a daemon's unit ends the remover with
    it): the grace is cut short rather than the rule left behind."""
    lease_path, mark = tmp_path / "lease", tmp_path / "mark"
    pid = _hand_over(control, lease_path, mark, rule, grace=3600.0)
    assert control.present(rule), "the control: an hour's grace"
    os.kill(pid, signal.SIGTERM)
    _until(lambda: _gone(pid), "the remover did not end on SIGTERM")
    assert not control.present(rule)


def test_a_closer_leaves_its_lease_to_a_remover_that_lingers(
    tmp_path: Path, control: Control, rule: bytes
) -> None:
    lease_path, mark = tmp_path / "lease", tmp_path / "mark"
    reader = _lease(lease_path)  # keeps the first remover waiting
    try:
        first = _hand_over(control, lease_path, mark, rule)
        lease = _lease(lease_path)
        try:
            assert hand_over(lease, [rule], control.sock.fileno(), grace=GRACE, mark_path=str(mark))
        finally:
            os.close(lease)
        assert remover_pid(str(mark)) == first, "no second remover"
    finally:
        os.close(reader)
    _until(lambda: _gone(first), "the remover never ended")
    assert not control.present(rule)


def test_the_kernel_takes_rule_requests_from_another_network_namespace(rule: bytes, control: Control) -> None:
    """Why a control socket anywhere serves the remover: the kernel checks
    only the user and pid namespaces of a rule request (audit_netlink_ok),
    and the rules are the host's whatever namespace asked."""
    netns = TestNetns()
    try:
        with inside_path(netns.path):
            elsewhere = Control()
        try:
            assert os.stat("/proc/thread-self/ns/net").st_ino != os.stat(netns.path).st_ino
            assert elsewhere.ask(_audit_mount.AUDIT_DEL_RULE, rule) == 0
            assert not control.present(rule)
            assert elsewhere.ask(_audit_mount.AUDIT_ADD_RULE, rule) == 0
            assert control.present(rule)
            assert any(r.endswith(_audit_mount.RULE_KEY.encode()) for r in _list_rules(elsewhere.sock, 5.0))
        finally:
            elsewhere.sock.close()
    finally:
        netns.close()


def test_exec_returns_at_once_and_leaves_the_rules_to_a_remover() -> None:
    """``stockade exec`` does not wait for the rules' removal: its output
    pipes close when it ends, while a remover that holds nothing of it
    keeps the rules (this test holds a lease, so that it must)."""
    os.makedirs(os.path.dirname(RULES_LEASE), exist_ok=True)
    reader = _lease(Path(RULES_LEASE))
    try:
        done = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "stockade"), "exec", "-q", "--", "/bin/true"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert remover_pid() is not None, "a remover holds the rules' lease when exec has returned"
        pid = _started(Path(REMOVER_MARK))
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not [link for link in links if link.startswith("pipe:")], links
    finally:
        os.close(reader)
