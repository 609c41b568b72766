"""Intents: strict arguments with errors that name the field, redaction, JSON
results, and the executor (fs intents on real files, exec in a workbench cell, ask)."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.broker._intents import (
    EXEC_OUTPUT_MAX,
    EXEC_TIMEOUT,
    Answer,
    ExecArgs,
    FetchArgs,
    FsWriteArgs,
    IntentError,
    IntentExecutor,
    RunWorkbench,
    _json_escaped_size,
    blob,
    parse_args,
    redact,
    refusal,
)
from stockade.cell import CellResult
from stockade.errors import CellError
from stockade.policy import FilesystemPolicy, Limits, NetworkPolicy, Policy, default_policy
from stockade.policy._model import HostRule


def as_json(value: object) -> object:
    """What the wire will carry: strict JSON, UTF-8."""
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8"))


# -------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("intent", "args", "field", "words"),
    [
        ("fs.read", {}, "path", "'path' is missing"),
        ("fs.read", {"path": 3}, "path", "'path' must be a string, not a number"),
        ("fs.read", {"path": "etc/passwd"}, "path", "'path' is not an absolute path"),
        ("fs.read", {"path": "/etc/pass\x00wd"}, "path", "NUL"),
        ("fs.read", {"path": "/" + "a" * 5000}, "path", "longer than 4096"),
        ("fs.read", {"path": "/x", "follow": True}, "follow", "'follow' is not one of its arguments"),
        (
            "fs.write",
            {"path": "/x", "content": "c", "mode": "delete"},
            "mode",
            "'mode' 'delete' is not valid",
        ),
        ("fs.write", {"path": "/x", "content": b"c"}, "content", "'content' must be a string"),
        ("fs.write", {"path": "/x"}, "content", "'content' is missing"),
        ("fs.write", {"path": "/x", "content": "c", "encoding": "latin-1"}, "encoding", "'encoding'"),
        ("fs.list", {"path": None}, "path", "not null"),
        ("exec", {"argv": []}, "argv", "'argv'"),
        ("exec", {"argv": "ls -l"}, "argv", "'argv' must be a list, not a string"),
        ("exec", {"argv": ["ls", 3]}, "argv[1]", "'argv[1]' must be a string"),
        ("exec", {"argv": ["ls", "a\x00b"]}, "argv[1]", "NUL"),
        ("exec", {"argv": ["x"] * 5000}, "argv", "'argv'"),
        ("exec", {"argv": ["x" * 300_000]}, "argv", "longer than 256 KiB"),
        ("exec", {"argv": ["ls"], "timeout": float("nan")}, "timeout", "'timeout'"),
        ("exec", {"argv": ["ls"], "timeout": 0}, "timeout", "'timeout'"),
        ("exec", {"argv": ["ls"], "timeout": "5"}, "timeout", "must be a number, not a string"),
        ("exec", {"argv": ["ls"], "timeout": True}, "timeout", "must be a number, not a boolean"),
        ("exec", {"argv": ["ls"], "cwd": "tmp"}, "cwd", "'cwd' is not an absolute path"),
        ("ask", {"question": ""}, "question", "'question'"),
        ("ask", {"question": "x" * 5000}, "question", "'question'"),
    ],
)
def test_bad_arguments_are_an_error_naming_the_field(
    intent: str, args: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(IntentError) as info:
        parse_args(intent, args)
    error = info.value
    assert error.code == "bad_params" and error.field == field
    assert str(error).startswith(f"{intent}: ") and words in str(error), str(error)
    assert "\n" not in str(error)


def test_several_problems_are_counted_in_the_one_sentence() -> None:
    with pytest.raises(IntentError, match=r"\(and 2 more problems\)"):
        parse_args("fs.write", {"path": 1, "content": 2, "mode": 3})


def test_arguments_must_be_an_object() -> None:
    with pytest.raises(IntentError, match="must be an object, not a list") as info:
        parse_args("fs.read", ["/x"])
    assert info.value.code == "bad_params"


@pytest.mark.parametrize(
    ("intent", "words"),
    [
        ("llm.chat", "coming in a later version"),
        ("fs.reed", "did you mean 'fs.read'?"),
        ("rm -rf", "is not an intent"),
    ],
)
def test_unknown_and_coming_intents_are_bad_requests(intent: str, words: str) -> None:
    with pytest.raises(IntentError, match=words) as info:
        parse_args(intent, {})
    assert info.value.code == "bad_request"


def test_http_fetch_arguments_are_checked() -> None:
    parsed = parse_args("http.fetch", {"url": "https://example.com/x", "headers": {"Accept": "text/plain"}})
    assert isinstance(parsed, FetchArgs) and parsed.method == "GET" and parsed.data() == b""
    with pytest.raises(IntentError, match="'url' is missing"):
        parse_args("http.fetch", {})
    with pytest.raises(IntentError, match="line break"):
        parse_args("http.fetch", {"url": "https://example.com/", "headers": {"X-A": "a\r\nHost: evil"}})
    with pytest.raises(IntentError, match="method"):
        parse_args("http.fetch", {"url": "https://example.com/", "method": "DELETE"})
    with pytest.raises(IntentError, match="not valid base64"):
        parse_args("http.fetch", {"url": "https://e.com/", "body": "%%", "encoding": "base64"}).data()  # type: ignore[union-attr]


def test_paths_are_normalised_and_defaults_filled() -> None:
    parsed = parse_args("fs.write", {"path": "/out/../out//f", "content": "x"})
    assert isinstance(parsed, FsWriteArgs)
    assert (parsed.path, parsed.mode, parsed.encoding) == ("/out/f", "create", "utf-8")
    exec_args = parse_args("exec", {"argv": ["ls"], "timeout": 5, "cwd": "/w/./x/"})
    assert isinstance(exec_args, ExecArgs) and exec_args.timeout == 5.0 and exec_args.cwd == "/w/x"


def test_bad_base64_content_is_an_error_naming_content() -> None:
    parsed = parse_args("fs.write", {"path": "/x", "content": "not base64!", "encoding": "base64"})
    assert isinstance(parsed, FsWriteArgs)
    with pytest.raises(IntentError) as info:
        parsed.data()
    assert info.value.field == "content"


# -------------------------------------------------------------------- redaction


def test_redact_replaces_secret_keys_at_any_depth() -> None:
    args = {
        "path": "/x",
        "token": "t",
        "Password": "p",
        "nested": {"api-key": "k", "API_KEY": "k2", "list": [{"secret": "s"}], "tokens": "kept"},
    }
    red = redact(args)
    assert red == {
        "path": "/x",
        "token": "[redacted]",
        "Password": "[redacted]",
        "nested": {
            "api-key": "[redacted]",
            "API_KEY": "[redacted]",
            "list": [{"secret": "[redacted]"}],
            "tokens": "kept",
        },
    }
    assert args["token"] == "t"  # a copy


def test_redact_shortens_long_strings_and_deep_or_wide_values() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(40):
        node["d"] = {}
        node = node["d"]  # type: ignore[assignment]
    red = redact({"content": "x" * 10_000, "deep": deep, "many": list(range(5000)), "n": float("nan")})
    assert red["content"] == "x" * 4096 + "… [5904 more characters]"
    assert "[nested too deep]" in json.dumps(red)
    many = red["many"]
    assert isinstance(many, list) and len(many) == 1001 and many[-1] == "[4000 more items]"
    as_json(red)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=30,
    )
)
def test_redact_always_gives_json_without_secret_values(value: object) -> None:
    red = redact({"value": value, "token": "SEKRET-VALUE"})
    assert "SEKRET-VALUE" not in json.dumps(as_json(red))


# ---------------------------------------------------------------------- results


def test_blob_is_text_when_it_can_be_and_base64_otherwise() -> None:
    assert blob("héllo".encode()) == {"content": "héllo", "encoding": "utf-8"}
    assert blob(b"\xff\x00") == {"content": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64"}
    assert blob(b"") == {"content": "", "encoding": "utf-8"}
    # valid UTF-8, but six bytes a character in JSON: base64 is shorter
    assert blob(b"\x01" * 300)["encoding"] == "base64"


@given(st.binary(max_size=2000))
def test_blob_round_trips_and_is_at_most_four_thirds_on_the_wire(data: bytes) -> None:
    value = blob(data)
    wire = json.dumps(value["content"], ensure_ascii=False).encode("utf-8")
    assert len(wire) - 2 <= len(base64.b64encode(data))
    content = str(value["content"])
    decoded = base64.b64decode(content) if value["encoding"] == "base64" else content.encode("utf-8")
    assert decoded == data


# --------------------------------------------------------------------- executor


def never(argv: list[str], policy: Policy) -> CellResult:
    raise AssertionError("no workbench expected")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("hello")
    (tmp_path / "data" / "bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "out").mkdir()
    (tmp_path / "ws").mkdir()
    return tmp_path


def executor(tree: Path, *, run: RunWorkbench = never, answer: Answer | None = None) -> IntentExecutor:
    policy = Policy(
        name="t",
        filesystem=FilesystemPolicy(read=(str(tree / "data"),), write=(str(tree / "out"),)),
        limits=Limits(timeout=60.0, output=10_000, memory=1 << 30, pids=64),
        network=NetworkPolicy(allow=(HostRule("example.com"),), loopback_ports=(8000,)),
    )
    return IntentExecutor(policy, workspace=str(tree / "ws"), run_workbench=run, answer=answer)


def test_fs_intents_give_json_values(tree: Path) -> None:
    ex = executor(tree)
    assert as_json(ex.execute("fs.read", {"path": f"{tree}/data/a.txt"})) == {
        "path": f"{tree}/data/a.txt",
        "size": 5,
        "content": "hello",
        "encoding": "utf-8",
    }
    binary = ex.execute("fs.read", {"path": f"{tree}/data/bin"})
    assert binary["encoding"] == "base64" and base64.b64decode(str(binary["content"])) == b"\xff\xfe\x00"
    written = ex.execute("fs.write", {"path": f"{tree}/out/new", "content": "AAEC", "encoding": "base64"})
    assert as_json(written) == {"path": f"{tree}/out/new", "bytes": 3, "created": True, "mode": "create"}
    assert (tree / "out" / "new").read_bytes() == b"\x00\x01\x02"
    listing = ex.execute("fs.list", {"path": f"{tree}/data"})
    assert as_json(listing) == {
        "path": f"{tree}/data",
        "entries": [{"name": "a.txt", "type": "file", "size": 5}, {"name": "bin", "type": "file", "size": 3}],
        "truncated": False,
    }


def test_a_name_that_is_not_utf8_is_listed_in_base64(tree: Path) -> None:
    raw = b"caf\xe9"
    os.close(os.open(os.fsencode(tree / "out") + b"/" + raw, os.O_CREAT | os.O_WRONLY, 0o644))
    entries = executor(tree).execute("fs.list", {"path": f"{tree}/out"})["entries"]
    assert isinstance(entries, list)
    assert as_json(entries) == [
        {"name": base64.b64encode(raw).decode(), "encoding": "base64", "type": "file", "size": 0}
    ]


def test_a_refused_or_failed_fs_intent_is_a_value_not_an_exception(tree: Path) -> None:
    ex = executor(tree)
    value = ex.execute("fs.read", {"path": "/etc/shadow"})
    assert set(value) == {"error"} and refusal(value) is not None
    assert "outside the policy's filesystem grants" in str(refusal(value))
    missing = ex.execute("fs.read", {"path": f"{tree}/data/nope"})
    assert as_json(missing) == {"error": {"code": "not_found", "message": f"{tree}/data/nope does not exist"}}
    assert refusal(missing) is None
    assert refusal({"path": "/x"}) is None


def test_the_executor_hands_a_refusal_over_as_a_typed_value(tree: Path) -> None:
    """Inside the broker a refusal is a ``Refusal`` (which check, and why), told
    by its type; a failure (not found) stays a plain value; the wire form the
    agent gets is unchanged."""
    from stockade.broker._intents import parse_args
    from stockade.broker._refusal import Refusal

    ex = executor(tree)
    outside = ex.outcome(parse_args("fs.read", {"path": "/etc/shadow"}))
    assert isinstance(outside, Refusal) and outside.reason == "grants", outside
    assert outside.value() == {"error": {"code": "refused", "message": outside.message}}
    read_only = ex.outcome(parse_args("fs.write", {"path": f"{tree}/data/a.txt", "content": "x"}))
    assert isinstance(read_only, Refusal) and read_only.reason == "read_only", read_only
    cwd = ex.outcome(parse_args("exec", {"argv": ["true"], "cwd": "/etc"}))
    assert isinstance(cwd, Refusal) and cwd.message.startswith("cwd: "), cwd
    missing = ex.outcome(parse_args("fs.read", {"path": f"{tree}/data/nope"}))
    assert not isinstance(missing, Refusal) and missing["error"] == {
        "code": "not_found",
        "message": f"{tree}/data/nope does not exist",
    }
    assert ex.outcome(parse_args("fs.read", {"path": f"{tree}/data/a.txt"})) == {  # the control
        "path": f"{tree}/data/a.txt",
        "size": 5,
        "content": "hello",
        "encoding": "utf-8",
    }


def test_bad_arguments_change_nothing(tree: Path) -> None:
    ex = executor(tree)
    with pytest.raises(IntentError):
        ex.execute("fs.write", {"path": f"{tree}/out/f", "content": "x", "mode": "truncate"})
    with pytest.raises(IntentError):
        ex.execute("fs.write", {"path": f"{tree}/out/f", "content": "%%%", "encoding": "base64"})
    assert list((tree / "out").iterdir()) == []


# ------------------------------------------------------------------------- exec


def fake_result(stdout: bytes = b"out", stderr: bytes = b"\xff") -> CellResult:
    return CellResult(
        cell_id="c-1",
        exit_code=3,
        stdout=stdout,
        stderr=stderr,
        events=(),
        duration=0.25,
        timed_out=False,
        limits_hit=("output",),
    )


def test_exec_runs_in_a_workbench_with_no_network_and_a_fresh_workspace(tree: Path) -> None:
    seen: list[tuple[list[str], Policy]] = []

    def run(argv: list[str], policy: Policy) -> CellResult:
        seen.append((argv, policy))
        return fake_result()

    ex = executor(tree, run=run)
    value = ex.execute("exec", {"argv": ["make", "test"], "cwd": f"{tree}/data"})
    assert as_json(value) == {
        "exit_code": 3,
        "stdout": {"content": "out", "encoding": "utf-8"},
        "stderr": {"content": "/w==", "encoding": "base64"},
        "timed_out": False,
        "limits_hit": ["output"],
        "denials": 0,
        "duration": 0.25,
        "cell": "c-1",
    }
    argv, policy = seen[0]
    assert argv == ["make", "test"]
    assert policy.network.allow == () and policy.network.loopback_ports == (8000,)
    assert policy.workspace is None and policy.workdir == f"{tree}/data"
    assert policy.command == () and policy.tools == () and policy.llm is None
    assert policy.filesystem == ex.policy.filesystem  # the run's grants
    assert (policy.limits.timeout, policy.limits.output) == (min(EXEC_TIMEOUT, 60.0), 10_000)
    assert policy.limits == dataclasses.replace(
        ex.policy.limits, timeout=min(EXEC_TIMEOUT, 60.0), output=10_000
    )


def test_exec_timeout_and_output_are_bounded(tree: Path) -> None:
    ex = executor(tree)
    assert ex.workbench_policy(ExecArgs(argv=["x"], timeout=5)).limits.timeout == 5
    assert ex.workbench_policy(ExecArgs(argv=["x"], timeout=3000)).limits.timeout == 60  # the run's limit
    unbounded = dataclasses.replace(ex.policy, limits=Limits())
    wide = IntentExecutor(unbounded, workspace=str(tree / "ws"), run_workbench=never)
    assert wide.workbench_policy(ExecArgs(argv=["x"])).limits.timeout == EXEC_TIMEOUT
    assert wide.workbench_policy(ExecArgs(argv=["x"])).limits.output == EXEC_OUTPUT_MAX


def test_exec_cwd_outside_the_grants_is_refused(tree: Path) -> None:
    value = executor(tree).execute("exec", {"argv": ["ls"], "cwd": "/root"})
    assert refusal(value) is not None and "cwd:" in str(refusal(value))


def test_a_workbench_that_cannot_start_is_a_failure_value(tree: Path) -> None:
    def broken(argv: list[str], policy: Policy) -> CellResult:
        raise CellError("no cgroup here")

    value = executor(tree, run=broken).execute("exec", {"argv": ["ls"]})
    assert as_json(value) == {
        "error": {"code": "failed", "message": "the workbench cell could not run: no cgroup here"}
    }


def test_exec_in_a_real_cell(tree: Path) -> None:
    from stockade.cell import Cell

    def run(argv: list[str], policy: Policy) -> CellResult:
        with Cell(policy, audit=None) as cell:
            return cell.run(argv)

    (tree / "ws" / "agent-only").write_text("x")
    base = default_policy("t")
    policy = dataclasses.replace(
        base,
        filesystem=dataclasses.replace(base.filesystem, read=(*base.filesystem.read, str(tree / "data"))),
    )
    ex = IntentExecutor(policy, workspace=str(tree / "ws"), run_workbench=run)
    value = ex.execute(
        "exec", {"argv": ["/bin/sh", "-c", "cat " + str(tree / "data" / "a.txt") + "; echo; pwd; ls -A"]}
    )
    assert value["exit_code"] == 0, value
    stdout = value["stdout"]
    assert isinstance(stdout, dict) and stdout["encoding"] == "utf-8"
    lines = str(stdout["content"]).splitlines()
    assert lines[0] == "hello"
    assert lines[1] != str(tree / "ws") and lines[1].startswith("/var/lib/stockade/workspaces/")  # fresh
    assert "agent-only" not in lines


# -------------------------------------------------------------------------- ask


def test_ask_returns_the_operators_answer(tree: Path) -> None:
    questions: list[str] = []

    def answer(question: str) -> str | None:
        questions.append(question)
        return "yes, go ahead"

    value = executor(tree, answer=answer).execute("ask", {"question": "May I delete build/?"})
    assert value == {"answer": "yes, go ahead"} and questions == ["May I delete build/?"]
    assert executor(tree, answer=lambda q: None).execute("ask", {"question": "?"}) == {"answer": None}


def test_ask_without_an_operator_is_unavailable(tree: Path) -> None:
    value = executor(tree).execute("ask", {"question": "anyone?"})
    assert value == {
        "error": {"code": "unavailable", "message": "nobody is attached to answer questions for this run"}
    }


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_the_escaped_size_of_text_is_what_json_writes(text: str) -> None:
    # blob() chooses text or base64 by this size without writing the JSON.
    data = text.encode("utf-8")
    assert _json_escaped_size(text, len(data)) == len(json.dumps(text, ensure_ascii=False).encode()) - 2


def test_blob_keeps_text_only_while_it_is_no_longer_than_base64() -> None:
    assert blob(b"\x01" * 30)["encoding"] == "base64"  # 180 bytes escaped, 40 in base64
    assert blob(b"a\nb\nc")["encoding"] == "utf-8"


@given(st.binary(max_size=64) | st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_blob_chooses_as_the_json_sizes_say(data: bytes) -> None:
    # Text exactly while its JSON string is no longer than base64, whatever the shortcut.
    value = blob(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert value["encoding"] == "base64"
        return
    fits = len(json.dumps(text, ensure_ascii=False).encode()) - 2 <= len(base64.b64encode(data))
    assert value["encoding"] == ("utf-8" if fits else "base64")
    assert value["content"] == (text if fits else base64.b64encode(data).decode())
