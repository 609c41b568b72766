"""Decoy directories as copies of a template made once per process
(``_native.decoy_template``): the same names, owner and refusals as the
decoys a cell makes itself, and never where the cell may write."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from stockade.cell import Cell
from stockade.cell._plan import CellPlan
from stockade.policy import Policy, default_policy

_SCRIPT = (
    # The mounts at the decoy (mount point and root of each), the owner and
    # type of every name it shows, then a write into it.
    'awk \'$5 == "{dst}" {{print "mount", $4}}\' /proc/self/mountinfo; '
    "cd {dst} && for n in {names}; do stat -c 'name %n %u %F' \"$n\"; done; "
    "echo x > {dst}/planted"
)


def _decoy(cell: Cell, dst: str) -> tuple[CellPlan, tuple[str, ...]]:
    plan = cell._prepared_plan()[0]
    op = next(op for op in plan.mounts if op.kind == "decoy_dir" and op.dst == dst)
    return plan, tuple(name.rstrip("/") for name in op.names)


def _look(cell: Cell, dst: str, names: tuple[str, ...]) -> tuple[list[str], dict[str, str], list[str]]:
    r = cell.run(["/bin/sh", "-c", _SCRIPT.format(dst=dst, names=" ".join(f"'{n}'" for n in names))])
    lines = r.stdout.decode().splitlines()
    mounts = [line.split()[1] for line in lines if line.startswith("mount ")]
    shown = {line.split()[1]: " ".join(line.split()[2:]) for line in lines if line.startswith("name ")}
    return mounts, shown, [e.summary for e in r.denials]


def test_a_cells_second_start_shows_its_decoys_from_the_template() -> None:
    # /var/lib/stockade: a decoy in the cell's root, with nested decoys and
    # the workspace beneath it; names on every host that runs stockade.
    dst = "/var/lib/stockade"
    with Cell(default_policy()) as cell:
        plan, names = _decoy(cell, dst)
        assert names, "the decoy mirrors the host's names"
        first = _look(cell, dst, names)
        second = _look(cell, dst, names)
    # The first start made them in place (no mount of their own); the second
    # mounted a copy of the template's entry (its root is the entry, "/<n>").
    assert first[0] == [], first[0]
    assert len(second[0]) == 1 and second[0][0] != "/", second[0]
    # The same names, each owned by the cell's own uid, of the same types.
    assert len(first[1]) == len(names), (names, first[1])
    assert second[1] == first[1]
    assert {shown.split()[0] for shown in second[1].values()} == {"1000"}
    # The write was refused by Landlock and recorded, both times, alike.
    assert first[2] == second[2] == [f"creation of a file in {dst} refused by landlock (fs.make_reg)"]
    assert not os.path.exists(f"{dst}/planted")
    assert plan.host_uid != 0


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
        _, names = _decoy(cell, dst)
        assert names == ("inner",)
        runs = [_look(cell, dst, (*names, "planted")) for _ in range(3)]
    for mounts, shown, _denials in runs:
        # A tmpfs of its own every time (root "/"), never a template's entry;
        # within it the cell may write (the workspace's grant covers it), and
        # what one run planted there is gone at the next.
        assert mounts == ["/"], mounts
        assert set(shown) == {"inner"}, shown
    assert (ws / "hidden/inner").read_text() == "secret\n"
    assert not (ws / "hidden/planted").exists()
