"""``stockade image import/ls/inspect/rm/prune`` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stockade.cli._app import run_app
from stockade.image import ImageStore
from tests.image._archives import Entry, layer_tar, oci_tarball


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_app(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_import_ls_inspect_rm_prune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = str(tmp_path / "state")
    named = oci_tarball(tmp_path / "a.tar", [layer_tar([Entry("hello", data=b"hi")])], ref=None)
    unnamed = oci_tarball(tmp_path / "b.tar", [layer_tar([Entry("other", data=b"x")])], ref=None)
    code, out, _ = _run(capsys, "image", "import", str(named), "-t", "task:1", "--state", state)
    assert code == 0 and out.startswith("imported sha256:") and out.strip().endswith("task:1")
    digest = out.split()[1]
    code, out, _ = _run(capsys, "image", "import", str(unnamed), "--state", state)
    assert code == 0
    loose = out.split()[1]

    code, out, _ = _run(capsys, "image", "ls", "--state", state)
    assert code == 0
    assert digest[7:19] in out and "task:1" in out and "<none>" in out
    code, out, _ = _run(capsys, "image", "ls", "--json", "--state", state)
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["digest"] for r in rows} == {digest, loose}

    code, out, _ = _run(capsys, "image", "inspect", "task:1", "--state", state)
    info = json.loads(out)
    assert code == 0 and info["digest"] == digest and info["names"] == ["task:1"]
    assert info["provenance"]["kind"] == "import" and Path(info["rootfs"], "hello").read_bytes() == b"hi"

    # A name points at it: removing it by digest needs --force.
    code, _, err = _run(capsys, "image", "rm", digest[7:19], "--state", state)
    assert code == 3 and "is named task:1" in err and "--force" in err
    assert ImageStore(tmp_path / "state/images").get("task:1").digest == digest

    code, out, _ = _run(capsys, "image", "prune", "--dry-run", "--state", state)
    assert code == 0 and f"would remove image {loose}" in out and digest not in out
    assert len(ImageStore(tmp_path / "state/images").digests()) == 2
    code, out, _ = _run(capsys, "image", "prune", "--state", state)
    assert code == 0 and f"removed image {loose}" in out
    assert ImageStore(tmp_path / "state/images").digests() == [digest]

    code, out, _ = _run(capsys, "image", "rm", "task:1", "--state", state)
    assert code == 0 and "untagged task:1" in out and f"deleted {digest}" in out
    code, _, err = _run(capsys, "image", "inspect", "task:1", "--state", state)
    assert code == 6 and "no image 'task:1'" in err and "stockade image ls" in err


def test_prune_keeps_what_a_named_image_was_built_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    base = oci_tarball(tmp_path / "a.tar", [layer_tar([Entry("etc", "dir")])], ref=None)
    assert _run(capsys, "image", "import", str(base), "-t", "base:1", "--state", str(state))[0] == 0
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "f").write_text("f")
    (ctx / "Dockerfile").write_text("FROM base:1\nCOPY f /f\nCOPY f /g\nENV A=1\n")
    code, out, err = _run(capsys, "image", "build", "-t", "app:1", str(ctx), "--state", str(state))
    assert code == 0, err
    assert "2 step(s), 0 cached" in out
    store = ImageStore(state / "images")
    assert len(store.digests()) == 4  # base, two COPY steps, the final config
    # The base's name goes: it is still what app:1 was built from, so it stays.
    assert _run(capsys, "image", "rm", "base:1", "--state", str(state))[0] == 0
    code, out, _ = _run(capsys, "image", "prune", "--state", str(state))
    assert "removed 0 image(s)" in out
    assert len(store.digests()) == 4
    # app:1 goes: everything it was built from is unnamed and goes with prune; the cache follows.
    assert _run(capsys, "image", "rm", "app:1", "--state", str(state))[0] == 0
    code, out, _ = _run(capsys, "image", "prune", "--state", str(state))
    assert "removed 3 image(s), 2 cache entr(ies)" in out
    assert store.digests() == []
    assert list((state / "images/cache/steps").iterdir()) == []


def test_build_errors_exit_with_the_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nHEALTHCHECK CMD true\n")
    code, _, err = _run(capsys, "image", "build", str(ctx), "--state", str(tmp_path / "s"))
    assert code == 3
    assert f"{ctx}/Dockerfile:2: instruction HEALTHCHECK is not supported" in err
    code, _, err = _run(
        capsys, "image", "build", "--build-arg", "novalue", str(ctx), "--state", str(tmp_path / "s")
    )
    assert code == 2 and "--build-arg 'novalue' is not K=V" in err
