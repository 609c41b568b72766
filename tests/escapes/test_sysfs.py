"""What a cell sees of the host through /sys and /proc.

The cell's /sys is its own sysfs, mounted from its network namespace: it shows
that namespace's interfaces (lo), not the host's names, MAC addresses or
traffic counters. What sysfs shows of the host beyond that (disks and their
I/O counters, from which one agent could watch another's work; filesystem
write counters; firmware and machine identity) is behind decoys of file
permissions (the host's ``DIR_DECOY`` bound there), refused and recorded by
the audit rule on reaches. The host-wide /proc files that identify the
host or count its disk and network activity are a root-only decoy file of
the host, refused by file permissions and recorded by an audit rule on its
inode (cell/_audit_mount.decoy_rule)."""

from __future__ import annotations

import os
from pathlib import Path

from stockade.cell import Cell
from tests.escapes._probes import Attempt, assert_refused, assert_works, run_probe

EACCES = 13


def _host_interfaces() -> dict[str, str]:
    found = {}
    for name in os.listdir("/sys/class/net"):
        if name != "lo":
            found[name] = Path(f"/sys/class/net/{name}/address").read_text().strip()
    return found


def test_sys_shows_the_cells_own_interfaces_only(cell: Cell) -> None:
    host = _host_interfaces()
    assert host, "inconclusive: the host has no interface but lo"
    probe = run_probe(
        cell,
        [
            Attempt("names", "return sorted(os.listdir('/sys/class/net'))"),
            Attempt(
                "virtual",
                "return sorted(os.listdir('/sys/devices/virtual/net'))",
            ),
            Attempt(
                "addresses",
                "import glob\n"
                "return sorted(open(p).read().strip() for p in glob.glob('/sys/class/net/*/address'))",
            ),
            Attempt(
                "proc",
                "return sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])",
            ),
            Attempt("control", "return open('/sys/class/net/lo/operstate').read().strip() != ''"),
        ],
    )
    assert assert_works(probe["names"]) == ["lo"]
    assert assert_works(probe["virtual"]) == ["lo"]
    assert assert_works(probe["addresses"]) == ["00:00:00:00:00:00"]
    assert assert_works(probe["proc"]) == ["lo"]  # /sys and /proc now agree
    assert assert_works(probe["control"]) is True
    out = probe.result.stdout.decode()
    for name, mac in host.items():
        assert name not in out and mac not in out, f"the host's {name} ({mac}) shows in the cell"


def _a_disk() -> tuple[str, str]:
    """A disk of the host, by its class link and by its place in the device tree."""
    for name in sorted(os.listdir("/sys/block")):
        real = os.path.realpath(f"/sys/block/{name}")
        if os.path.exists(f"{real}/stat"):
            return name, real
    raise AssertionError("inconclusive: the host shows no disk in /sys/block")


def test_disk_counters_in_sys_are_decoys_that_record_the_attempt(cell: Cell) -> None:
    """Each way to a disk's counters (its class links, its place in the device
    tree) meets a decoy: the read, a listing and a write are refused by file
    permissions (EACCES) and each is on record as layer ``dac`` under the
    path the agent asked for, a reach into a decoy; the rest of /sys reads
    (the control), and none of the host's counters reaches the cell."""
    name, real = _a_disk()
    probe = run_probe(
        cell,
        [
            Attempt("by-class", f"return open('/sys/block/{name}/stat').read()"),
            Attempt("by-device", f"return open({real + '/stat'!r}).read()"),
            Attempt("by-class-block", f"return open('/sys/class/block/{name}/stat').read()"),
            Attempt("list", "return os.listdir('/sys/block')"),
            Attempt("write", "open('/sys/block/planted', 'w')"),
            Attempt("control", "return open('/sys/devices/system/cpu/online').read().strip() != ''"),
        ],
    )
    for attempt, path in (
        ("by-class", f"/sys/block/{name}/stat"),
        ("by-device", f"{real}/stat"),
        ("by-class-block", f"/sys/class/block/{name}/stat"),
        ("list", "/sys/block"),
        ("write", "/sys/block/planted"),
    ):
        assert_refused(probe[attempt], EACCES)
        assert [
            e
            for e in probe.denials()
            if e.layer == "dac" and e.detail.get("errno") == "EACCES" and e.detail.get("path") == path
        ], f"no record of {attempt} ({path}):\n{probe.transcript()}"
    assert assert_works(probe["control"]) is True
    host_stat = Path(f"{real}/stat").read_text()
    assert host_stat not in probe.result.stdout.decode()


HOST_PROC = ("/proc/cmdline", "/proc/sys/kernel/random/boot_id", "/proc/diskstats", "/proc/interrupts")


def test_host_identifying_proc_files_are_decoys_that_record_the_attempt(cell: Cell) -> None:
    """Each is the host's root-only decoy file: the read is refused by file
    permissions (EACCES) and on record as layer ``dac`` under the path the
    agent asked for; nothing of the host's value reaches the cell; the cell's
    own /proc still reads (the control)."""
    host = {path: Path(path).read_text() for path in HOST_PROC}
    assert all(host.values()), "inconclusive: a host file is empty"
    probe = run_probe(
        cell,
        [
            *(Attempt(f"read-{i}", f"return open({path!r}).read()") for i, path in enumerate(HOST_PROC)),
            Attempt("control", "return open('/proc/self/status').read().startswith('Name:')"),
        ],
    )
    for i, path in enumerate(HOST_PROC):
        assert_refused(probe[f"read-{i}"], EACCES)
        assert [e for e in probe.denials() if e.layer == "dac" and e.detail.get("path") == path], (
            f"no record of the read of {path}:\n{probe.transcript()}"
        )
    assert assert_works(probe["control"]) is True
    out = probe.result.stdout.decode()
    assert host["/proc/sys/kernel/random/boot_id"].strip() not in out
    assert host["/proc/cmdline"].strip() not in out


def test_the_cells_own_interface_attributes_are_not_writable(cell: Cell) -> None:
    """In its own sysfs the cell's lo belongs to its user namespace's root,
    which the agent is not: a write to its MTU is refused by file permissions
    (EACCES) and on record as layer ``dac``; the value reads as before (the control)."""
    probe = run_probe(
        cell,
        [
            Attempt("before", "return open('/sys/class/net/lo/mtu').read()"),
            Attempt("write", "fd = os.open('/sys/class/net/lo/mtu', os.O_WRONLY)\nos.write(fd, b'1280')"),
            Attempt("after", "return open('/sys/class/net/lo/mtu').read()"),
        ],
    )
    assert_refused(probe["write"], EACCES)
    assert assert_works(probe["after"]) == assert_works(probe["before"])
    assert [
        e for e in probe.denials() if e.layer == "dac" and e.detail.get("path") == "/sys/class/net/lo/mtu"
    ], probe.transcript()
