"""``limits.disk``: the cell's own /tmp is a tmpfs the kernel keeps to the
policy's bytes and files, and a run that filled it says so."""

from __future__ import annotations

import dataclasses
import errno

from stockade.cell import Cell
from stockade.policy import DiskLimit, Policy, default_policy, loads_policy

PY = "/usr/bin/python3"

FILL = r"""
import os, sys
kind = sys.argv[1]
open("/tmp/small", "wb").write(b"x" * 4096)  # the control: well under both limits
print("control", os.path.getsize("/tmp/small"))
try:
    if kind == "bytes":
        with open("/tmp/big", "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
    else:
        n = 0
        while True:
            open(f"/tmp/f{n}", "w").close()
            n += 1
except OSError as exc:
    print("refused", exc.errno)
"""


def _limited(disk: DiskLimit | None) -> Policy:
    policy = default_policy("test")
    return dataclasses.replace(policy, limits=dataclasses.replace(policy.limits, disk=disk))


def test_tmp_stops_at_its_byte_limit_and_the_run_says_so() -> None:
    with Cell(_limited(DiskLimit(bytes=8 << 20)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", FILL, "bytes"], timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["control", "4096", "refused", str(errno.ENOSPC)]
    assert "disk" in result.limits_hit
    limit = [e for e in result.events if e.kind == "cell.limit"]
    assert [e.summary for e in limit] == [
        f"disk limit of /tmp reached: {8 << 20} bytes, writes refused (ENOSPC)"
    ]


def test_tmp_stops_at_its_file_limit_and_the_run_says_so() -> None:
    with Cell(_limited(DiskLimit(files=200)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", FILL, "files"], timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["control", "4096", "refused", str(errno.ENOSPC)]
    assert [e.summary for e in result.events if e.kind == "cell.limit"] == [
        "file limit of /tmp reached: 200 files, creation refused (ENOSPC)"
    ]


def test_a_run_that_stays_under_the_limit_records_no_limit() -> None:
    with Cell(_limited(DiskLimit(bytes=8 << 20, files=200)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", "open('/tmp/a', 'w').write('a' * 4096)"])
    assert result.exit_code == 0, result.stderr
    assert result.limits_hit == ()
    assert not [e for e in result.events if e.kind == "cell.limit"]


def test_limits_disk_in_a_policy_file() -> None:
    policy = loads_policy("name: t\nlimits:\n  disk: {bytes: 1G, files: 100000}\n")
    assert policy.limits.disk == DiskLimit(bytes=1 << 30, files=100_000)
    assert loads_policy("name: t\nlimits:\n  disk: {bytes: unlimited}\n").limits.disk is None
    assert loads_policy("name: t\n").limits.disk is None
