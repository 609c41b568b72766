"""The broker's table of intents (``_intents.TABLE``) is the one place intents
are written down: what knows their names elsewhere is read from it or checked
against it here (docs/BROKER.md's table, the policy schema, the rules'
suggestions, the daemon's agent intents), and the daemon places each by it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stockade.broker import _rules
from stockade.broker._intents import COMING, INTENTS, READ_ONLY, TABLE, parse_args
from stockade.daemon._agents import AGENT_INTENTS
from stockade.errors import IntentError
from stockade.policy import _schema

BROKER_MD = Path(__file__).resolve().parents[2] / "docs" / "BROKER.md"


def _doc_rows() -> dict[str, list[str]]:
    text = BROKER_MD.read_text()
    section = text[text.index("## Intents") :]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines()[2:]:
        if not line.startswith("| `"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def _top_level_names(cell: str) -> list[str]:
    """The backticked names of a cell outside parentheses (``mode`` of
    "`mode` (`create` default, …)")."""
    depth, kept = 0, ""
    for char in cell:
        depth += char == "("
        if depth == 0:
            kept += char
        depth -= char == ")"
    return re.findall(r"`([^`]+)`", kept)


def test_broker_md_lists_every_executed_intent_as_the_table_has_it() -> None:
    rows = _doc_rows()
    assert list(rows) == list(INTENTS)
    for name, (args, value, runs, read_only, deciders) in rows.items():
        spec = TABLE[name]
        assert spec.args is not None
        assert sorted(_top_level_names(args)) == sorted(spec.args.model_fields), name
        assert runs == spec.runs, name
        assert read_only == ("yes" if spec.read_only else "no"), name
        assert tuple(d.strip() for d in deciders.split(",")) == spec.decided_by, name
        shown = re.findall(r"`([^`:]+)[`:]", value)
        assert set(spec.value) <= set(shown), (name, set(spec.value) - set(shown))


def test_the_other_lists_of_intent_names_agree_with_the_table() -> None:
    assert set(_schema.INTENTS) == set(TABLE)
    assert set(INTENTS) | set(COMING) == set(TABLE) and not set(INTENTS) & set(COMING)
    assert {n: s.subject for n, s in TABLE.items() if s.subject} == _rules._SUGGESTED_ARG
    assert {n for n in TABLE if n.startswith("agent.")} == AGENT_INTENTS
    assert {n for n, s in TABLE.items() if s.runs == "daemon" and n != "ask"} == AGENT_INTENTS
    assert {"fs.read", "fs.list"} == READ_ONLY


def test_parse_args_validates_with_the_tables_model_and_refuses_what_is_not_in_it() -> None:
    for name, spec in TABLE.items():
        if spec.args is None:
            with pytest.raises(IntentError, match="coming in a later version") as info:
                parse_args(name, {})
            assert info.value.code == "bad_request"
            continue
        with pytest.raises(IntentError, match=f"^{re.escape(name)}: 'bogus' is not one of its arguments"):
            parse_args(name, {"bogus": 1, **_minimal(name)})
        assert isinstance(parse_args(name, _minimal(name)), spec.args)
    with pytest.raises(IntentError, match=re.escape("'fs.raed' is not an intent; did you mean 'fs.read'")):
        parse_args("fs.raed", {"path": "/x"})


def test_a_session_argument_moves_an_intent_off_the_loop() -> None:
    fs_read = TABLE["fs.read"]
    assert fs_read.runs_for({"path": "/x"}) == "loop"
    assert fs_read.runs_for({"path": "/x", "session": "s-0123456789ab"}) == "thread"
    assert TABLE["exec"].runs_for({"argv": ["true"]}) == "thread"
    assert TABLE["http.fetch"].runs_for({"url": "https://a.example"}) == "gateway"


def _minimal(name: str) -> dict[str, object]:
    minimal: dict[str, dict[str, object]] = {
        "fs.read": {"path": "/x"},
        "fs.write": {"path": "/x", "content": ""},
        "fs.list": {"path": "/x"},
        "exec": {"argv": ["true"]},
        "ask": {"question": "ok?"},
        "http.fetch": {"url": "https://a.example"},
        "agent.spawn": {"policy": "name: a\n"},
        "agent.send": {"to": "a", "message": "hi"},
        "agent.recv": {},
    }
    return minimal[name]


def test_grant_refusal_is_asked_only_of_the_intents_the_table_says_grants_decide(tmp_path: Path) -> None:
    from tests.broker.test_intents import executor

    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "ws").mkdir()
    ex = executor(tmp_path)
    outside = str(tmp_path / "elsewhere")
    for name in ("fs.read", "fs.list"):
        assert ex.grant_refusal(name, {"path": outside}) is not None, name
        assert ex.grant_refusal(name, {"path": str(tmp_path / "data")}) is None, name  # the control
    assert ex.grant_refusal("fs.write", {"path": outside, "content": ""}) is not None
    assert ex.grant_refusal("fs.write", {"path": str(tmp_path / "out" / "f"), "content": ""}) is None
    # exec's cwd is checked when it runs; a session's own view decides its files.
    assert ex.grant_refusal("exec", {"argv": ["true"], "cwd": outside}) is None
    assert ex.grant_refusal("fs.read", {"path": outside, "session": "s-0123456789ab"}) is None
