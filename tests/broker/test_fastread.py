"""The C fast path of ``FileAccess.read`` (``_fastread.c``) against its Python path.

``read_beneath`` may only ever return what the Python path returns for the
same file, and must give up (None) wherever the Python path refuses or fails:
each case below is tried both ways on the same real files.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stockade.broker import _fs
from stockade.broker._fastread import read_beneath
from stockade.broker._fs import FileAccess, FsFailure
from stockade.broker._refusal import Refusal
from stockade.cell._plan import NOBODY
from stockade.policy import FilesystemPolicy, Policy

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (chown, mknod, mounts)")


def _access(tmp_path: Path, granted: Path, *, writable: bool = False) -> FileAccess:
    fs = FilesystemPolicy(write=(str(granted),)) if writable else FilesystemPolicy(read=(str(granted),))
    (tmp_path / "ws").mkdir(exist_ok=True)
    return FileAccess(Policy(name="t", filesystem=fs), workspace=str(tmp_path / "ws"))


def _python_path(fa: FileAccess, path: str, monkeypatch: pytest.MonkeyPatch) -> bytes | str:
    """What FileAccess.read gives without the fast path: the data, or the failure's code."""
    with monkeypatch.context() as patched:
        patched.setattr(_fs, "read_beneath", lambda *args: None)
        try:
            data = fa.read(path)
        except FsFailure as exc:
            return exc.code
        return "refused" if isinstance(data, Refusal) else data


def _fast_path(fa: FileAccess, path: str, limit: int = _fs.MAX_READ) -> bytes | None:
    grant = fa._grant(path, write=False)
    root, names = grant.encoded
    return read_beneath(root, names, fa._uid, fa._gid, grant.writable and fa._root, limit)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_bytes(b"hello")
    (d / "sub" / "b.txt").write_bytes(b"deep")
    (d / "empty").write_bytes(b"")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"SECRET")
    return d


@pytest.mark.parametrize("name", ["a.txt", "sub/b.txt", "empty"])
def test_the_plain_case_gives_what_the_python_path_gives(
    tmp_path: Path, data: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fa = _access(tmp_path, data)
    fast = _fast_path(fa, f"{data}/{name}")
    assert fast is not None
    assert fast == _python_path(fa, f"{data}/{name}", monkeypatch) == (data / name).read_bytes()


def _link_to_file(tmp_path: Path, data: Path) -> str:
    (data / "link").symlink_to(tmp_path / "outside" / "secret")
    return f"{data}/link"


def _link_on_the_way(tmp_path: Path, data: Path) -> str:
    (data / "way").symlink_to(tmp_path / "outside")
    return f"{data}/way/secret"


def _fifo(tmp_path: Path, data: Path) -> str:
    os.mkfifo(data / "fifo")  # opening it would block a reader without O_NONBLOCK
    return f"{data}/fifo"


def _directory(tmp_path: Path, data: Path) -> str:
    return f"{data}/sub"


def _missing(tmp_path: Path, data: Path) -> str:
    return f"{data}/nothing"


def _not_a_directory_on_the_way(tmp_path: Path, data: Path) -> str:
    return f"{data}/a.txt/x"


def _unreadable(tmp_path: Path, data: Path) -> str:
    (data / "private").write_bytes(b"root only")
    os.chmod(data / "private", 0o600)
    return f"{data}/private"


def _unsearchable(tmp_path: Path, data: Path) -> str:
    os.chmod(data / "sub", 0o700)
    return f"{data}/sub/b.txt"


CASES: dict[str, Callable[[Path, Path], str]] = {
    "a link as the file": _link_to_file,
    "a link on the way": _link_on_the_way,
    "a fifo": _fifo,
    "a directory": _directory,
    "a missing file": _missing,
    "a file on the way": _not_a_directory_on_the_way,
    "a file the cell cannot read": _unreadable,
    "a directory the cell cannot search": _unsearchable,
}


@pytest.mark.parametrize("case", list(CASES))
def test_whatever_the_python_path_refuses_the_fast_path_gives_up(
    tmp_path: Path, data: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    permissions = case in ("a file the cell cannot read", "a directory the cell cannot search")
    if permissions and not ROOT:
        pytest.skip("needs root: the files must belong to someone other than the cell's uid")
    path = CASES[case](tmp_path, data)
    fa = _access(tmp_path, data)
    if permissions:
        assert fa._uid != os.stat(path.rsplit("/", 1)[0]).st_uid, "the cell would own the files"
    python = _python_path(fa, path, monkeypatch)
    assert isinstance(python, str), f"the Python path read {case}: {python!r}"
    assert _fast_path(fa, path) is None
    try:  # and through read(), the Python path's answer
        through = fa.read(path)
    except FsFailure as exc:
        assert exc.code == python
    else:
        assert isinstance(through, Refusal) and python == "refused", through


def test_a_link_as_the_grant_itself_is_left_to_the_python_path(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grant outside every writable tree may be reached through a link; the
    # Python path follows it and checks where it leads. The fast path never does.
    (tmp_path / "via").symlink_to(data)
    fa = _access(tmp_path, tmp_path / "via")
    assert _fast_path(fa, f"{tmp_path}/via/a.txt") is None
    assert fa.read(f"{tmp_path}/via/a.txt") == b"hello"


def test_the_size_limit_is_the_python_path_s(tmp_path: Path, data: Path) -> None:
    fa = _access(tmp_path, data)
    assert _fast_path(fa, f"{data}/a.txt", limit=5) == b"hello"
    assert _fast_path(fa, f"{data}/a.txt", limit=4) is None


@pytest.mark.parametrize("names", [(b"..", b"a.txt"), (b".",), (b"sub/b.txt",), (b"",), (b"a\0b",), ()])
def test_a_name_that_is_not_one_plain_component_is_given_up(data: Path, names: tuple[bytes, ...]) -> None:
    assert read_beneath(os.fsencode(data), names, NOBODY, NOBODY, False, 1 << 20) is None


def test_a_root_that_is_not_absolute_is_given_up(data: Path) -> None:
    assert read_beneath(b"data", (b"a.txt",), NOBODY, NOBODY, False, 1 << 20) is None


@pytest.mark.skipif(not ROOT, reason="needs root (bind mounts)")
def test_a_mount_point_inside_the_grant_is_given_up(tmp_path: Path, data: Path) -> None:
    mountpoint = data / "mnt"
    mountpoint.mkdir()
    outside = str(tmp_path / "outside")
    done = subprocess.run(["mount", "--bind", outside, str(mountpoint)], capture_output=True)
    assert done.returncode == 0, done.stderr
    try:
        fa = _access(tmp_path, data)
        assert _fast_path(fa, f"{mountpoint}/secret") is None
        crossed = fa.read(f"{mountpoint}/secret")
        assert isinstance(crossed, Refusal) and crossed.reason == "mount", crossed
        assert "mount point" in crossed.message
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


@needs_root
def test_in_a_write_grant_the_owner_of_its_directory_counts_as_the_cell(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cell's idmapped mount makes it the grant directory's owner there:
    # a 0600 file of that owner is readable through a write grant, not a read grant.
    os.chown(data, 4242, 4242)
    (data / "mine").write_bytes(b"owner's")
    os.chown(data / "mine", 4242, 4242)
    os.chmod(data / "mine", 0o600)
    path = f"{data}/mine"
    writable = _access(tmp_path, data, writable=True)
    assert _fast_path(writable, path) == _python_path(writable, path, monkeypatch) == b"owner's"
    readonly = _access(tmp_path, data)
    assert _fast_path(readonly, path) is None
    assert _python_path(readonly, path, monkeypatch) == "refused"
