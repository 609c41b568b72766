"""Builds with no RUN, FROM a tiny imported image: COPY, ADD, WORKDIR and
the config instructions, the commit of each step into an image, and the cache."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from stockade.errors import ImageError
from stockade.image import ImageStore, import_image
from stockade.image._build import build_image
from tests.image._archives import Entry, layer_tar, oci_tarball

BASE = [
    Entry("etc", "dir", mode=0o755),
    Entry("etc/passwd", data=b"root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/app:/bin/sh\n"),
    Entry("etc/group", data=b"root:x:0:\napp:x:1001:\nstaff:x:50:\n"),
    Entry("srv", "dir", mode=0o750, uid=1000, gid=1001),
    Entry("srv/old", data=b"old"),
]


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    store = ImageStore(tmp_path / "images")
    import_image(store, oci_tarball(tmp_path / "base.tar", [layer_tar(BASE)], ref="tiny:base"))
    return store


def _context(tmp_path: Path, dockerfile: str) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "src/pkg").mkdir(parents=True)
    (ctx / "src/pkg/mod.py").write_text("print('hi')\n")
    (ctx / "src/run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(ctx / "src/run.sh", 0o755)
    (ctx / "note.txt").write_text("a note\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("unpacked/inside.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"inside"))
    (ctx / "bundle.tar.gz").write_bytes(buf.getvalue())
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


DOCKERFILE = """\
FROM tiny:base
ARG GREETING=hello
ENV APP_HOME=/app LANG=C.UTF-8
WORKDIR $APP_HOME
COPY src/ ./
COPY --chown=app:staff --chmod=0640 note.txt /etc/note
ADD bundle.tar.gz /opt/
USER app
LABEL org.example.greeting="${GREETING} world"
EXPOSE 8000
ENTRYPOINT ["/bin/sh"]
CMD ["run.sh"]
"""


def test_copy_add_workdir_and_config(store: ImageStore, tmp_path: Path) -> None:
    ctx = _context(tmp_path, DOCKERFILE)
    lines: list[str] = []
    image = build_image(store, ctx, name="app:1", build_args={"GREETING": "hi"}, log=lines.append)
    root = image.rootfs
    assert image.names == ("app:1",)
    assert (root / "app/pkg/mod.py").read_text() == "print('hi')\n"
    run = os.stat(root / "app/run.sh")
    assert stat.S_IMODE(run.st_mode) == 0o755 and (run.st_uid, run.st_gid) == (0, 0)
    note = os.stat(root / "etc/note")
    assert (note.st_uid, note.st_gid, stat.S_IMODE(note.st_mode)) == (1000, 50, 0o640)
    assert (root / "opt/unpacked/inside.txt").read_bytes() == b"inside"
    # The base's own files are there, with their owners.
    srv = os.stat(root / "srv")
    assert (srv.st_uid, srv.st_gid, stat.S_IMODE(srv.st_mode)) == (1000, 1001, 0o750)
    cfg = image.config
    assert cfg.env == ("APP_HOME=/app", "LANG=C.UTF-8")
    assert (cfg.workdir, cfg.user) == ("/app", "app")
    assert dict(cfg.labels) == {"org.example.greeting": "hi world"}
    assert cfg.exposed == ("8000/tcp",) and cfg.entrypoint == ("/bin/sh",) and cfg.cmd == ("run.sh",)
    prov = image.provenance
    assert prov["kind"] == "build" and prov["from"] == "tiny:base" and prov["approximate"] is False
    steps = prov["steps"]
    assert isinstance(steps, list) and [s["line"] for s in steps] == [4, 5, 6, 7]
    assert not any(s["cached"] for s in steps)
    assert prov["build_args"] == {"GREETING": "hi"}
    # The base image's files were not touched by the commits (they share inodes).
    base = store.get("tiny:base")
    assert not (base.rootfs / "app").exists() and not (base.rootfs / "etc/note").exists()


def test_the_second_build_hits_the_cache_and_a_changed_source_does_not(
    store: ImageStore, tmp_path: Path
) -> None:
    ctx = _context(tmp_path, DOCKERFILE)
    first = build_image(store, ctx, name="app:1")
    lines: list[str] = []
    second = build_image(store, ctx, name="app:1", log=lines.append)
    assert second.digest == first.digest
    steps = second.provenance["steps"]
    assert isinstance(steps, list) and all(s["cached"] for s in steps)
    assert sum("(cached" in line for line in lines) == 4
    (ctx / "note.txt").write_text("changed\n")
    third = build_image(store, ctx, name="app:1")
    steps = third.provenance["steps"]
    assert isinstance(steps, list)
    assert [s["cached"] for s in steps] == [True, True, False, False]
    assert third.digest != first.digest
    assert (third.rootfs / "etc/note").read_text() == "changed\n"
    assert (first.rootfs / "etc/note").read_text() == "a note\n"


def test_a_source_outside_the_context_is_refused(store: ImageStore, tmp_path: Path) -> None:
    ctx = _context(tmp_path, "FROM tiny:base\nCOPY ../secret /x\n")
    (tmp_path / "secret").write_text("no")
    with pytest.raises(ImageError, match="is outside the build context") as info:
        build_image(store, ctx)
    assert info.value.location == f"{ctx}/Dockerfile:2"
    os.symlink(tmp_path / "secret", ctx / "link")
    (ctx / "Dockerfile").write_text("FROM tiny:base\nCOPY link /x\n")
    with pytest.raises(ImageError, match="leads out of the build context"):
        build_image(store, ctx)
    # Nothing of a failed build is left in tmp/.
    assert not list(store.tmp_dir.iterdir())


def test_missing_source_and_unknown_chown(store: ImageStore, tmp_path: Path) -> None:
    ctx = _context(tmp_path, "FROM tiny:base\nCOPY nope.txt /x\n")
    with pytest.raises(ImageError, match=r"'nope\.txt' is not in the build context"):
        build_image(store, ctx)
    (ctx / "Dockerfile").write_text("FROM tiny:base\nCOPY --chown=nobody note.txt /x\n")
    with pytest.raises(ImageError, match="--chown 'nobody' is not in the image's /etc/passwd"):
        build_image(store, ctx)
