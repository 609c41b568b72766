"""Which mount-layer refusals are attempts (``cell._attempts``): one judgement
for the cell and for the daemon's audit relay, from the cell's places, which
travel to the relay as JSON, bounded. No kernel: events and places by hand."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stockade.cell._attempts import MAX_PLACES_BYTES, VIEW_STAGE, Places, not_an_attempt
from stockade.cell._audit_relay import AuditRelay
from stockade.record import Event

PLACES = Places(
    writable=("/work", "/tmp"),
    protected=("/work/.git/hooks", "/work/.bashrc"),
    pinned=("/work/.git",),
    decoys=("/tests", "/proc/cmdline"),
)


def _refusal(errno: str, *paths: str, layer: str = "mount", reach: bool = False) -> Event:
    detail: dict[str, object] = {"errno": errno, "paths": list(paths)}
    if reach:
        detail["reach"] = True
    return Event(kind="cell.denied", cell="c1", layer=layer, outcome="denied", summary="", detail=detail)


@pytest.mark.parametrize(
    ("event", "attempt"),
    [
        # An mv from /tmp into the workspace: both writable, no attempt.
        (_refusal("EXDEV", "/work", "/tmp"), False),
        # Into a protected directory, or a pinned one: an attempt.
        (_refusal("EXDEV", "/work/.git/hooks", "/tmp"), True),
        (_refusal("EXDEV", "/work/.git", "/tmp"), True),
        # Out of the cell's writable places (either side): an attempt.
        (_refusal("EXDEV", "/etc", "/tmp"), True),
        # The launcher building the view: never the agent's.
        (_refusal("EROFS", f"{VIEW_STAGE}/etc/passwd"), False),
        (_refusal("EACCES", f"{VIEW_STAGE}/root", layer="dac"), False),
        # A write under a read-only mount, by the agent.
        (_refusal("EROFS", "/work/.bashrc"), True),
        (_refusal("EACCES", "/etc/shadow", layer="dac"), True),
        # A refused reach (a lookup, an open for reading): inside a decoy an
        # attempt, elsewhere file permissions doing their ordinary work.
        (_refusal("EACCES", "/tests/test_outputs.py", layer="dac", reach=True), True),
        (_refusal("EACCES", "/tests", layer="dac", reach=True), True),
        (_refusal("EACCES", "/proc/cmdline", layer="dac", reach=True), True),
        (_refusal("EACCES", "/testsuite/a", layer="dac", reach=True), False),
        (_refusal("EACCES", "/root/.profile", layer="dac", reach=True), False),
        (_refusal("EACCES", layer="dac", reach=True), False),
        # Other layers are not this judgement's.
        (_refusal("EXDEV", "/work", "/tmp", layer="landlock"), True),
    ],
)
def test_not_an_attempt(event: Event, attempt: bool) -> None:
    assert not_an_attempt(event, PLACES) is (not attempt)


def test_places_go_over_json_and_back() -> None:
    sent = json.loads(json.dumps(PLACES.to_dict()))
    assert Places.from_dict(sent) == PLACES
    with pytest.raises(ValueError, match=r"places\.pinned must be a list of paths"):
        Places.from_dict({**sent, "pinned": "/work/.git"})
    # A sender without decoys (an older daemon's) is read as having none.
    older = {k: v for k, v in sent.items() if k != "decoys"}
    assert Places.from_dict(older).decoys == ()


def _told(tmp_path: Path, places: Places) -> dict[str, object]:
    """What ``AuditRelay.watch`` writes on the relay's pipe (a ``cat`` stands in for the relay)."""
    out = tmp_path / "pipe.jsonl"
    with out.open("wb") as sink:
        proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=sink)
        relay = AuditRelay(proc)
        assert relay.watch(
            run="r-1", cell="c1", session=7, pid=1, spool="/s", places=places, uncovered_since=2.5
        )
        relay.stop()
    told: dict[str, object] = json.loads(out.read_text().splitlines()[0])
    return told


def test_the_relay_is_told_a_cells_places_within_the_bound(tmp_path: Path) -> None:
    told = _told(tmp_path, PLACES)
    assert told["places"] == PLACES.to_dict() and told["uncovered_since"] == 2.5
    # Past the bound (thousands of nested repositories): not sent, and the
    # relay then keeps none of the cell's EXDEV refusals (counted as unjudged).
    many = Places(
        writable=("/work",), protected=tuple(f"/work/r{i}/.git/hooks" for i in range(5000)), pinned=()
    )
    assert len(json.dumps(many.to_dict())) > MAX_PLACES_BYTES
    assert "places" not in _told(tmp_path, many)
