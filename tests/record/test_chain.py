"""The hash chain, without a store: the formula, the verifier, stored events as JSON."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stockade.record import GENESIS, Event, StoredEvent, canonical_json, chain_hash
from stockade.record._chain import ChainVerifier, hash_payload


def make_event(i: int, **kw: Any) -> Event:
    fields: dict[str, Any] = {
        "kind": "cell.denied",
        "cell": "c-3f9a1c2e4b5d",
        "layer": "landlock",
        "outcome": "denied",
        "summary": f"write to /etc/f{i} refused by landlock (fs.write_file)",
        "detail": {"path": f"/etc/f{i}", "blockers": ["fs.write_file"], "ino": i},
        "time": 1795959063.412 + i,
        "run": "r-0123456789ab",
    }
    fields.update(kw)
    return Event(**fields)


def build_chain(events: list[Event]) -> list[StoredEvent]:
    prev, out = GENESIS, []
    for seq, event in enumerate(events, 1):
        digest = chain_hash(prev, seq, event)
        out.append(StoredEvent(seq, digest, prev, event, canonical_json(event.to_dict())))
        prev = digest
    return out


def _feed(verifier: ChainVerifier, stored: StoredEvent) -> str | None:
    return verifier.check(stored.seq, stored.prev, stored.hash, stored.event_json().encode())


def test_genesis_is_64_zeros() -> None:
    assert GENESIS == "0" * 64


def test_hash_is_the_documented_formula() -> None:
    event = make_event(1, detail={"path": "/tmp/café", "n": 1.5, "none": None, "z": [1, "é"]})
    prev = "ab" * 32
    text = json.dumps(
        {"seq": 7, "event": event.to_dict()}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    expected = hashlib.sha256(prev.encode() + b"\n" + text.encode("utf-8")).hexdigest()
    assert chain_hash(prev, 7, event) == expected
    assert chain_hash(prev, 7, event.to_dict()) == expected
    assert hash_payload(prev, 7, canonical_json(event.to_dict()).encode()) == expected


def test_canonical_json_is_sorted_compact_and_not_ascii_escaped() -> None:
    assert canonical_json({"b": 1, "a": ["é", 2.5]}) == '{"a":["é",2.5],"b":1}'


def test_an_intact_chain_verifies_and_reports_its_last_hash() -> None:
    stored = build_chain([make_event(i) for i in range(5)])
    verifier = ChainVerifier()
    assert all(_feed(verifier, s) is None for s in stored)
    result = verifier.result()
    assert (result.ok, result.checked, result.first_bad_seq) == (True, 5, None)
    assert result.last_hash == stored[-1].hash
    assert "5 events" in result.reason


def test_an_empty_chain_is_intact() -> None:
    result = ChainVerifier().result()
    assert (result.ok, result.checked, result.first_bad_seq, result.last_hash) == (True, 0, None, GENESIS)


def test_altered_content_names_the_event() -> None:
    stored = build_chain([make_event(i) for i in range(5)])
    verifier = ChainVerifier()
    for s in stored[:2]:
        assert _feed(verifier, s) is None
    reason = verifier.check(
        3, stored[2].prev, stored[2].hash, stored[2].event_json().replace("f2", "f9").encode()
    )
    assert reason is not None and "event 3 was altered" in reason
    result = verifier.result()
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
    assert result.last_hash == stored[1].hash


def test_a_missing_first_event_is_named() -> None:
    stored = build_chain([make_event(i) for i in range(3)])
    verifier = ChainVerifier()
    assert _feed(verifier, stored[1]) == "event 1 is missing (the next stored event is 2)"
    assert verifier.result().first_bad_seq == 1


def test_several_missing_events_are_named_by_the_first() -> None:
    stored = build_chain([make_event(i) for i in range(6)])
    verifier = ChainVerifier()
    _feed(verifier, stored[0])
    assert _feed(verifier, stored[4]) == "events 2 to 4 are missing (the next stored event is 5)"
    result = verifier.result()
    assert (result.checked, result.first_bad_seq) == (1, 2)


def test_an_event_that_does_not_follow_is_named() -> None:
    a = build_chain([make_event(i) for i in range(3)])
    b = build_chain([make_event(i + 10) for i in range(3)])
    verifier = ChainVerifier()
    _feed(verifier, a[0])
    reason = _feed(verifier, b[1])  # seq 2 of another chain: its prev is not a[0].hash
    assert reason is not None and "event 2 does not follow" in reason
    assert verifier.result().first_bad_seq == 2


def test_first_event_must_follow_genesis() -> None:
    stored = build_chain([make_event(0)])[0]
    verifier = ChainVerifier()
    reason = verifier.check(1, "1" * 64, stored.hash, stored.event_json().encode())
    assert reason is not None and "genesis" in reason


def test_an_event_stored_before_its_place_is_named() -> None:
    stored = build_chain([make_event(i) for i in range(3)])
    verifier = ChainVerifier()
    _feed(verifier, stored[0])
    _feed(verifier, stored[1])
    reason = _feed(verifier, stored[0])
    assert reason is not None and "out of order" in reason
    assert verifier.result().first_bad_seq == 3


def test_fail_after_check_uncounts_the_event() -> None:
    stored = build_chain([make_event(i) for i in range(3)])
    verifier = ChainVerifier()
    for s in stored:
        _feed(verifier, s)
    verifier.fail(3, "event 3 was altered: its run column does not match its stored event")
    result = verifier.result()
    assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
    assert result.last_hash == stored[1].hash
    assert verifier.broken


def test_a_verifier_stays_broken() -> None:
    stored = build_chain([make_event(i) for i in range(3)])
    verifier = ChainVerifier()
    first = _feed(verifier, stored[1])
    assert _feed(verifier, stored[0]) == first
    assert verifier.result().first_bad_seq == 1


def test_a_jsonl_line_carries_what_is_needed_to_check_it() -> None:
    stored = build_chain([make_event(i, detail={"path": "/tmp/é\n"}) for i in range(4)])
    lines = [s.to_json() for s in stored]
    verifier = ChainVerifier()
    for line in lines:
        assert "\n" not in line
        obj = json.loads(line)
        assert obj == stored[obj["seq"] - 1].to_dict()
        assert line == canonical_json(obj)
        payload = canonical_json(obj["event"]).encode()
        assert verifier.check(obj["seq"], obj["prev"], obj["hash"], payload) is None
    assert verifier.result().ok


def test_to_json_stays_json_when_a_hash_is_not_hex() -> None:
    event = make_event(0)
    stored = StoredEvent(1, 'x","seq":99,"y":"', GENESIS, event)
    assert json.loads(stored.to_json())["hash"] == 'x","seq":99,"y":"'
    assert json.loads(stored.to_json())["seq"] == 1


_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
)
detail_strategy = st.dictionaries(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=8),
    st.recursive(
        _json_scalars,
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)
event_strategy = st.builds(
    Event,
    kind=st.sampled_from(["cell.start", "cell.denied", "intent", "run.end"]),
    cell=st.text(max_size=12),
    layer=st.sampled_from(["cell", "landlock", "seccomp", "broker", "gateway"]),
    outcome=st.sampled_from(["allowed", "denied", "audited", "info"]),
    detail=detail_strategy,
    time=st.floats(min_value=0, max_value=4e9),
    summary=st.text(st.characters(exclude_categories=["Cs"]), max_size=30),
    run=st.text(max_size=14),
)


@given(st.lists(event_strategy, min_size=1, max_size=8), st.data())
def test_any_single_byte_change_is_detected(events: list[Event], data: st.DataObject) -> None:
    stored = build_chain(events)
    index = data.draw(st.integers(0, len(stored) - 1))
    payload = bytearray(stored[index].event_json().encode())
    position = data.draw(st.integers(0, len(payload) - 1))
    payload[position] = data.draw(st.integers(0, 255).filter(lambda b: b != payload[position]))
    verifier = ChainVerifier()
    for i, s in enumerate(stored):
        body = bytes(payload) if i == index else s.event_json().encode()
        if verifier.check(s.seq, s.prev, s.hash, body) is not None:
            break
    result = verifier.result()
    assert (result.ok, result.first_bad_seq, result.checked) == (False, index + 1, index)
