"""Decoy directories as copies of templates made once per process
(``_native.decoy_template``): the same names, owner and refusals as the
decoys a cell makes itself, and never where the cell may write."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.policy import Policy, default_policy

_SCRIPT = (
    # The decoy's device and its mount's options (a template's copy keeps its
    # template's; a template is a tmpfs of 64 KiB), the owner and type of
    # every name it shows, then a write into it.
    "stat -c 'dev %d' {dst}; "
    'awk \'$5 == "{dst}" {{print "options", $NF}}\' /proc/self/mountinfo; '
    "cd {dst} && for n in {names}; do stat -c 'name %n %u %F' \"$n\"; done; "
    "echo x > {dst}/planted"
)


def _names(cell: Cell, dst: str) -> tuple[str, ...]:
    plan = cell._prepared_plan()[0]
    op = next(op for op in plan.mounts if op.kind == "decoy_dir" and op.dst == dst)
    return tuple(name.rstrip("/") for name in op.names)


def _look(cell: Cell, dst: str, names: tuple[str, ...]) -> tuple[str, dict[str, str], list[str]]:
    r = cell.run(["/bin/sh", "-c", _SCRIPT.format(dst=dst, names=" ".join(f"'{n}'" for n in names))])
    lines = r.stdout.decode().splitlines()
    options = [line.split()[1] for line in lines if line.startswith("options ")]
    template = bool(options) and "size=64k" in options[-1].split(",")
    dev = next(line.split()[1] for line in lines if line.startswith("dev ")) + (
        " template" if template else ""
    )
    shown = {line.split()[1]: " ".join(line.split()[2:]) for line in lines if line.startswith("name ")}
    return dev, shown, [e.summary for e in r.denials]


def test_a_cells_later_starts_show_its_decoys_from_a_template() -> None:
    # A decoy of this test's own (a hidden directory in a read grant), whose
    # names no other cell of this process asked for before.
    shown = Path(tempfile.mkdtemp(prefix="stockade-template-", dir="/var/tmp"))
    try:
        shown.chmod(0o755)
        (shown / "hidden/sub").mkdir(parents=True)
        for name in ("key", "sub/inner"):
            (shown / "hidden" / name).write_text("secret\n")
        dst = str(shown / "hidden")
        fs = default_policy().filesystem
        policy = dataclasses.replace(
            default_policy(),
            filesystem=dataclasses.replace(fs, read=(*fs.read, str(shown)), deny=(*fs.deny, dst)),
        )
        with Cell(policy) as cell:
            names = _names(cell, dst)
            assert set(names) == {"key", "sub", "sub/inner"}, names
            runs = [_look(cell, dst, names) for _ in range(3)]
    finally:
        shutil.rmtree(shown)
    (dev1, shown1, denied1), (dev2, shown2, denied2), (dev3, shown3, denied3) = runs
    # The first start made its own tmpfs; the second made the template and
    # showed a copy of it, the third another copy of the same one.
    assert not dev1.endswith(" template"), dev1
    assert dev2 == dev3 and dev3.endswith(" template"), (dev2, dev3)
    # The same names, each owned by the cell's own uid, of the same types.
    assert shown1 == shown2 == shown3
    assert shown3 == {
        "key": "1000 regular empty file",
        "sub": "1000 directory",
        "sub/inner": "1000 regular empty file",
    }
    # The write was refused by Landlock and recorded, every time alike.
    assert denied1 == denied2 == denied3 == [f"creation of a file in {dst} refused by landlock (fs.make_reg)"]


def test_the_hosts_sysfs_decoys_are_templates_where_no_decoy_of_permissions_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # /sys/block (the host's disks), on a host without DIR_DECOY (a bind of
    # it is the decoy where there is one: tests/escapes/test_sysfs.py): the
    # same template for every cell of the process, from its second launch on.
    from stockade.cell import _plan

    monkeypatch.setattr(_plan, "_dir_decoy", lambda: None)
    dst = "/sys/block"
    with Cell(default_policy()) as cell:
        names = _names(cell, dst)
        assert names, "the decoy mirrors the host's disks"
        runs = [_look(cell, dst, names) for _ in range(2)]
    assert runs[1][0].endswith(" template"), runs[1][0]
    assert runs[0][1] == runs[1][1] and len(runs[1][1]) == len(names)
    assert {shown.split()[0] for shown in runs[1][1].values()} == {"1000"}


def test_a_decoy_with_the_workspace_beneath_it() -> None:
    # /var/lib/stockade/workspaces holds the cell's own workspace, a bind
    # made beneath the decoy: the template holds its mount point, and the
    # workspace is the cell's own, writable, at every start.
    with Cell(default_policy()) as cell:
        ws = str(cell.workspace)
        assert ws.startswith("/var/lib/stockade/workspaces/")
        for i in range(3):
            r = cell.run(["/bin/sh", "-c", f"echo {i} >> {ws}/mine && cat {ws}/mine && touch ../planted"])
            assert r.stdout.decode().split() == [str(n) for n in range(i + 1)], r.stderr
            assert [e.summary for e in r.denials] == [
                "creation of a file in /var/lib/stockade/workspaces refused by landlock (fs.make_reg)"
            ]


def test_no_template_where_the_cell_may_write(tmp_path: Path) -> None:
    # A decoy inside the workspace (a write grant): a copy of a shared
    # template there would let one cell write what the next one sees.
    ws = tmp_path / "ws"
    (ws / "hidden").mkdir(parents=True)
    (ws / "hidden/inner").write_text("secret\n")
    os.chown(ws, 65534, 65534)
    fs = default_policy().filesystem
    policy: Policy = dataclasses.replace(
        default_policy(), filesystem=dataclasses.replace(fs, deny=(*fs.deny, str(ws / "hidden")))
    )
    dst = str(ws / "hidden")
    with Cell(policy, workspace=ws) as cell:
        names = _names(cell, dst)
        assert names == ("inner",)
        runs = [_look(cell, dst, (*names, "planted")) for _ in range(3)]
    # A tmpfs of its own every time, never a template's copy, and nothing
    # planted there (were the write allowed) is seen by the next run.
    for dev, shown, _denials in runs:
        assert not dev.endswith(" template"), runs
        assert set(shown) == {"inner"}, shown
    assert (ws / "hidden/inner").read_text() == "secret\n"
    assert not (ws / "hidden/planted").exists()


def test_workspaces_made_between_starts_are_shown_in_full() -> None:
    # A class of defect: /var/lib/stockade is a template from the second
    # start on, and /var/lib/stockade/workspaces beneath it a decoy of its
    # own. When workspaces are made between two cells of one workspace (a
    # trial's agent and its grader, while other trials run), the inner
    # decoy's names change, so that start cannot copy its template; it must
    # not make its names in the outer template's copy, which has room for
    # the template's own only (this failed the launch with ENOSPC once some
    # dozens of workspaces were made).
    root = Path("/var/lib/stockade/workspaces")
    ws = Path(tempfile.mkdtemp(prefix="ws-test-many-", dir=root))
    os.chown(ws, 65534, 65534)
    made: list[Path] = []
    try:
        for start in range(5):
            if start >= 2:
                prefix = f"stockade-test-many-{start}-"
                made += [Path(tempfile.mkdtemp(prefix=prefix, dir=root)) for _ in range(60)]
            # (Landlock refuses a listing here: each name is looked at.)
            names = " ".join(p.name for p in made)
            look = f"cd {root} && for n in {ws.name} {names}; do test -d $n && echo $n; done; touch planted"
            with Cell(default_policy(), workspace=ws) as cell:
                r = cell.run(["/bin/sh", "-c", look])
            assert r.exit_code == 1, r.stderr
            shown = r.stdout.decode().split()
            # The decoy shows the workspaces as the host has them, up to its
            # bound on names, and the reach is refused and recorded.
            assert shown[0] == ws.name
            assert len(shown) > min(len(made), 100), (start, len(shown))
            assert [e.summary for e in r.denials] == [
                f"creation of a file in {root} refused by landlock (fs.make_reg)"
            ]
    finally:
        for path in made:
            path.rmdir()
        shutil.rmtree(ws)
