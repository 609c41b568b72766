"""The audit reader's start under load: its rules are never silently missing.

Seen before (issue 18): a hundred ``Cell`` objects run at once from one
process each opened an audit reader of their own, and forty of them started
with "cannot add the kernel audit rules that record refusals of read-only
mounts (Connection timed out)": their protected-file refusals would have gone
unrecorded. Now the process has one reader whoever asks first, and a rule
whose ack does not come is sent again.

Needs root and kernel audit; a host without them skips, naming what it lacks.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import time

import pytest

from stockade.cell._audit import AUDIT_ADD_RULE, RULE_ATTEMPTS, RULES_LEASE, AuditReader, _Waiter
from stockade.cell._audit_lease import remover_pid
from stockade.cell._audit_mount import rule_payloads

_LACKS = (
    "root (CAP_AUDIT_READ, CAP_AUDIT_CONTROL)"
    if os.geteuid() != 0
    else None
    if os.path.exists("/proc/self/loginuid")
    else "kernel audit (CONFIG_AUDIT, /proc/self/loginuid)"
)
pytestmark = pytest.mark.skipif(_LACKS is not None, reason=f"host lacks {_LACKS}")


class _LosesAcks(AuditReader):
    """A reader whose first ``lose`` rule requests never reach the kernel, as
    an ack lost in an overrun or one that comes too late looks to the reader."""

    lose = 0
    lost = 0

    def _send(
        self, msg_type: int, payload: bytes, *, reply: bool = False, linked: _Waiter | None = None
    ) -> _Waiter:
        if msg_type == AUDIT_ADD_RULE and type(self).lost < type(self).lose:
            type(self).lost += 1
            with self._lock:
                self._seq += 1
                waiter = self._waiters[self._seq] = _Waiter(reply=reply, linked=linked)
            return waiter  # never sent: its ack never comes
        return super()._send(msg_type, payload, reply=reply, linked=linked)


def test_a_rule_whose_ack_does_not_come_is_sent_again() -> None:
    rules = len(rule_payloads())
    _LosesAcks.lose, _LosesAcks.lost = rules, 0
    reader = _LosesAcks(timeout=0.3)
    try:
        assert _LosesAcks.lost == rules  # the first round was lost, all of it
        assert reader.rule_retries >= rules
        assert reader.mount_rules_error is None, reader.mount_rules_error
    finally:
        reader.close()


def test_a_rule_lost_every_time_is_said_not_hidden() -> None:
    """The control: when no attempt gets through, the reader says so (and
    every cell's record then carries ``cell.audit_lost``, reason "rules")."""
    _LosesAcks.lose, _LosesAcks.lost = 10_000, 0
    reader = _LosesAcks(timeout=0.05)
    try:
        assert reader.mount_rules_error is not None
        assert f"{RULE_ATTEMPTS} times" in reader.mount_rules_error
        assert reader._core.mount_rules_missing == reader.mount_rules_error
    finally:
        _LosesAcks.lose = 0
        reader.close()


_MANY_AT_ONCE = """
import threading
from stockade.cell._cell import shared_audit_reader
start = threading.Barrier(40)
got = []
def ask():
    start.wait()
    got.append(shared_audit_reader())
threads = [threading.Thread(target=ask) for _ in range(40)]
for t in threads: t.start()
for t in threads: t.join()
print(len(got), len({id(r) for r in got}), got[0].mount_rules_error)
"""


def test_cells_started_together_share_one_reader_with_its_rules() -> None:
    """Forty threads of a fresh process ask for the reader at the same moment
    (as forty ``Cell.run`` calls do): one reader is made, with its rules."""
    out = subprocess.run(
        [sys.executable, "-c", _MANY_AT_ONCE], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert out == ["40", "1", "None"], out


def _rules_present() -> bool:
    """Whether the kernel has stockade's first rule: adding it again answers
    EEXIST; if it was absent the probe removes what it added."""
    import socket
    import struct

    from stockade.cell._audit_mount import AUDIT_DEL_RULE

    payload = rule_payloads()[0]
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9) as sock:
        sock.bind((0, 0))

        def ask(kind: int) -> int:
            sock.send(struct.pack("=IHHII", 16 + len(payload), kind, 0x5, 1, 0) + payload)
            while True:
                data = sock.recv(65536)
                if struct.unpack_from("=H", data, 4)[0] == 2:  # NLMSG_ERROR: the ack
                    return -struct.unpack_from("=i", data, 16)[0]

        answer = ask(AUDIT_ADD_RULE)
        if answer == 0:
            ask(AUDIT_DEL_RULE)
        return answer == errno.EEXIST


def test_the_rules_stay_while_a_reader_needs_them_and_go_with_the_last() -> None:
    """Two readers: the first to close leaves the rules to the other; the
    last one of the host hands them to a remover, which removes them once no
    reader needs them (every process pays for them while they are loaded),
    and the next reader adds them again."""
    first, second = AuditReader(timeout=1.0), AuditReader(timeout=1.0)
    try:
        assert first.mount_rules_error is None and second.mount_rules_error is None
        first.close()
        assert first.rules_handed_over and not first.rules_removed
        assert _rules_present()  # the control: the other reader still needs them
    finally:
        first.close()
        second.close()
    assert second.rules_handed_over and not second.rules_removed
    # Another stockade process of this host may hold the lease too; while this
    # test holds the lock exclusively and no remover lingers, no reader can
    # add or need the rules.
    # The remover's grace (3 s) and its removal, with room for a busy host.
    deadline = time.monotonic() + 20.0
    while True:
        fd = os.open(RULES_LEASE, os.O_RDWR | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = remover_pid() is None
            except BlockingIOError:
                alone = False
            if alone:
                assert not _rules_present(), "the last reader's remover left them"
                break
            if time.monotonic() > deadline:
                assert _rules_present()  # another process's reader, all along
                break
        finally:
            os.close(fd)
        time.sleep(0.05)
    again = AuditReader(timeout=1.0)
    try:
        assert again.mount_rules_error is None
        assert _rules_present()
    finally:
        again.close()
