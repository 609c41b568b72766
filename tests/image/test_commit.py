"""The commit of an overlay upper (what a build cell keeps) onto a copy of its
parent's rootfs: whiteouts, opaque directories, replaced files; the parent,
which shares its inodes with the copy, untouched."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from stockade.errors import ImageError
from stockade.image._layers import apply_layer
from stockade.image._tree import apply_upper, copy_tree_linked, tree_digest


def _parent(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc/keep").write_text("keep")
    (root / "etc/changed").write_text("before")
    (root / "gone").write_text("gone")
    (root / "opq").mkdir()
    (root / "opq/old1").write_text("1")
    (root / "opq/old2").write_text("2")
    (root / "app").mkdir()
    os.chown(root / "app", 1000, 1000)
    (root / "app/data").write_text("data")


@pytest.mark.parametrize("opaque_xattr", ["trusted.overlay.opaque", "user.overlay.opaque"])
def test_apply_upper_whiteouts_opaque_and_replacements(tmp_path: Path, opaque_xattr: str) -> None:
    parent = tmp_path / "parent"
    _parent(parent)
    before = tree_digest(parent)
    upper = tmp_path / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc/changed").write_text("after")
    os.mknod(upper / "gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # an overlay whiteout
    (upper / "opq").mkdir()
    os.setxattr(upper / "opq", opaque_xattr, b"y")
    (upper / "opq/new").write_text("n")
    (upper / "app").mkdir()
    os.chown(upper / "app", 1000, 1000)
    os.symlink("data", upper / "app/link")
    child = tmp_path / "child"
    copy_tree_linked(parent, child)
    assert os.stat(child / "etc/changed").st_ino == os.stat(parent / "etc/changed").st_ino
    apply_upper(upper, child)
    assert (child / "etc/changed").read_text() == "after"
    assert (child / "etc/keep").read_text() == "keep"
    assert not (child / "gone").exists()
    assert sorted(os.listdir(child / "opq")) == ["new"]
    assert os.readlink(child / "app/link") == "data"
    assert os.stat(child / "app").st_uid == 1000
    # The upper's overlay marks are not copied into the image.
    with pytest.raises(OSError):
        os.getxattr(child / "opq", opaque_xattr)
    # The parent is as it was, byte for byte: a changed file got a new inode.
    assert tree_digest(parent) == before
    assert (parent / "etc/changed").read_text() == "before"
    assert os.stat(child / "etc/changed").st_ino != os.stat(parent / "etc/changed").st_ino


def test_an_upper_directory_replaces_a_planted_symlink_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), root / "esc")
    upper = tmp_path / "upper"
    (upper / "esc").mkdir(parents=True)
    (upper / "esc/pwned").write_text("x")
    # The upper's own "esc" is a directory and replaces the link: the write stays inside.
    apply_upper(upper, root)
    assert list(outside.iterdir()) == []
    assert (root / "esc/pwned").read_text() == "x" and not (root / "esc").is_symlink()


def test_add_of_a_hostile_archive_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    with pytest.raises(ImageError, match=r"climbs out with '\.\.'"):
        apply_layer(buf, root, what="ADD evil.tar")
    assert not (tmp_path / "escaped").exists() and not (tmp_path.parent / "escaped").exists()
