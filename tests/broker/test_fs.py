"""File access for the fs intents, with real files: grants, links, races, mounts,
special files, sizes and permissions. Nothing outside a grant is ever read or written."""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.broker import _fs
from stockade.broker._fs import (
    BENEATH,
    MAX_READ,
    MAX_WRITE,
    FileAccess,
    FsFailure,
    openat2,
)
from stockade.broker._refusal import Refusal
from stockade.cell._plan import NOBODY
from stockade.cell._syscall import syscall
from stockade.policy import FilesystemPolicy, Policy

SECRET = b"SECRET outside every grant"
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (chown, mknod, mounts, other users' files)")


def access(
    tmp_path: Path,
    *,
    read: tuple[str | Path, ...] = (),
    write: tuple[str | Path, ...] = (),
    deny: tuple[str | Path, ...] = (),
    protect: tuple[str, ...] = (),
    source: str | None = None,
    hidden: tuple[str, ...] = (),
    workspace: Path | None = None,
) -> FileAccess:
    policy = Policy(
        name="t",
        filesystem=FilesystemPolicy(
            read=tuple(str(p) for p in read),
            write=tuple(str(p) for p in write),
            deny=tuple(str(p) for p in deny),
            protect=protect,
        ),
        source=source,
    )
    ws = workspace or tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return FileAccess(policy, workspace=str(ws), hidden=hidden)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """data/ (to grant), out/ (to grant writable), outside/ (never granted)."""
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "a.txt").write_bytes(b"hello")
    (tmp_path / "data" / "sub" / "b.txt").write_bytes(b"deep")
    (tmp_path / "out").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(SECRET)
    return tmp_path


def refused(call: object, *args: object, code: str = "refused") -> FsFailure | Refusal:
    """The refusal ``call`` returns (a value, never an exception), or the
    failure it raises when ``code`` names one."""
    assert callable(call)
    if code == "refused":
        result = call(*args)
        assert isinstance(result, Refusal), result
        return result
    with pytest.raises(FsFailure) as info:
        call(*args)
    assert info.value.code == code, info.value.message
    return info.value


def outcome(call: object, *args: object) -> object:
    """What ``call`` gave: "refused" for a refusal, a failure's code, or its value."""
    assert callable(call)
    try:
        result = call(*args)
    except FsFailure as exc:
        return exc.code
    return "refused" if isinstance(result, Refusal) else result


# ------------------------------------------------------------------------ grants


def test_read_and_list_inside_a_read_grant(tree: Path) -> None:
    fa = access(tree, read=(tree / "data",))
    assert fa.read(f"{tree}/data/a.txt") == b"hello"
    assert fa.read(f"{tree}/data/sub/b.txt") == b"deep"
    entries, truncated = fa.list(f"{tree}/data")
    assert [(e.name, e.type, e.size) for e in entries] == [
        ("a.txt", "file", 5),
        ("sub", "dir", entries[1].size),
    ]
    assert truncated is False


def test_a_write_grant_is_readable_too(tree: Path) -> None:
    (tree / "out" / "x").write_bytes(b"x")
    fa = access(tree, write=(tree / "out",))
    assert fa.read(f"{tree}/out/x") == b"x"


def test_outside_every_grant_is_refused_and_names_the_fix(tree: Path) -> None:
    fa = access(tree, read=(tree / "data",), write=(tree / "out",))
    failure = refused(fa.read, f"{tree}/outside/secret")
    assert "outside the policy's filesystem grants; add it to filesystem.read" in failure.message
    refused(fa.list, f"{tree}/outside")
    refused(fa.write, f"{tree}/outside/new", b"x", "create")
    assert not (tree / "outside" / "new").exists()
    # a read grant does not allow writing
    failure = refused(fa.write, f"{tree}/data/new", b"x", "create")
    assert "read-only grant" in failure.message and not (tree / "data" / "new").exists()


def test_the_workspace_is_not_granted_implicitly(tree: Path) -> None:
    ws = tree / "ws"
    ws.mkdir()
    (ws / "notes").write_bytes(b"n")
    fa = access(tree, read=(tree / "data",), workspace=ws)
    failure = refused(fa.read, f"{ws}/notes")
    assert "workspace is not one" in failure.message
    both = access(tree, write=(ws,), workspace=ws)
    assert both.read(f"{ws}/notes") == b"n"


def test_dotdot_is_resolved_before_the_grant_is_chosen(tree: Path) -> None:
    fa = access(tree, read=(tree / "data",))
    refused(fa.read, f"{tree}/data/../outside/secret")
    refused(fa.read, f"{tree}/data/sub/../../outside/secret")
    assert fa.read(f"{tree}/data/sub/../a.txt") == b"hello"
    assert fa.read(f"{tree}//data/./a.txt") == b"hello"


def test_relative_paths_are_refused(tree: Path) -> None:
    fa = access(tree, read=("/",))
    refused(fa.read, "etc/passwd")
    refused(fa.read, "/etc/pass\x00wd")


def test_a_glob_grant_covers_what_it_expands_to(tree: Path) -> None:
    for name in ("data-1", "data-2", ".data-3", "other"):
        (tree / name).mkdir()
        (tree / name / "f").write_bytes(name.encode())
    fa = access(tree, read=(f"{tree}/data-*",))
    assert fa.read(f"{tree}/data-1/f") == b"data-1"
    assert fa.read(f"{tree}/data-2/f") == b"data-2"
    refused(fa.read, f"{tree}/.data-3/f")  # as glob(3) expands it: * does not match a leading dot
    refused(fa.read, f"{tree}/other/f")


def test_a_grant_naming_a_file_grants_that_file_only(tree: Path) -> None:
    fa = access(tree, read=(tree / "data" / "a.txt",))
    assert fa.read(f"{tree}/data/a.txt") == b"hello"
    refused(fa.read, f"{tree}/data/sub/b.txt")
    refused(fa.list, f"{tree}/data")
    refused(fa.read, f"{tree}/data/a.txt/x", code="not_a_directory")


def test_a_write_grant_naming_a_missing_file_can_create_it(tree: Path) -> None:
    fa = access(tree, write=(tree / "out" / "report.txt",))
    assert fa.write(f"{tree}/out/report.txt", b"r", "create") is True
    assert (tree / "out" / "report.txt").read_bytes() == b"r"
    refused(fa.write, f"{tree}/out/other.txt", b"r", "create")


def test_the_deepest_grant_wins_a_read_entry_inside_a_write_entry_is_read_only(tree: Path) -> None:
    (tree / "out" / "ro").mkdir()
    (tree / "out" / "ro" / "f").write_bytes(b"keep")
    fa = access(tree, write=(tree / "out",), read=(tree / "out" / "ro",))
    failure = refused(fa.write, f"{tree}/out/ro/f", b"x", "overwrite")
    assert "read-only grant" in failure.message
    assert (tree / "out" / "ro" / "f").read_bytes() == b"keep"
    assert fa.write(f"{tree}/out/f", b"x", "create") is True
    assert fa.read(f"{tree}/out/ro/f") == b"keep"


# ----------------------------------------------------------------------- hidden


def test_secrets_of_the_default_policy_are_never_read_even_without_base_system(tmp_path: Path) -> None:
    fa = access(tmp_path, read=("/etc",))
    assert b"root:" in fa.read("/etc/passwd")
    for path in ("/etc/shadow", "/etc/sudoers", "/etc/ssh/sshd_config", "/etc/../etc/shadow"):
        failure = refused(fa.read, path)
        assert "never reaches it" in failure.message
    assert "shadow" not in [e.name for e in fa.list("/etc")[0]]


def test_places_every_cell_hides_are_hidden_under_a_wide_grant(tmp_path: Path) -> None:
    fa = access(tmp_path, read=("/",), write=("/",))
    for path in (
        "/root/.bashrc",
        "/home/someone/.ssh/id_rsa",
        "/run/docker.sock",
        "/var/run/x",
        "/var/lib/stockade/events.db",
        "/srv/x",
        "/mnt/x",
    ):
        failure = refused(fa.read, path)
        assert "every cell hides" in failure.message
        refused(fa.write, path, b"x", "create")
    assert "root" not in [e.name for e in fa.list("/")[0]]


def test_a_grant_inside_a_hidden_place_is_reachable_as_in_the_cell(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tree / "home"
    (home / "me" / "proj").mkdir(parents=True)
    (home / "me" / "proj" / "f").write_bytes(b"mine")
    (home / "me" / "notes").write_bytes(b"private")
    monkeypatch.setattr(_fs, "_DEFAULT_HIDDEN", (str(home),))
    inside = access(tree, read=(home / "me" / "proj",))
    assert inside.read(f"{home}/me/proj/f") == b"mine"
    tree.chmod(0o755)  # pytest makes it 0700, which the cell could not list
    wide = access(tree, read=(tree,))
    refused(wide.read, f"{home}/me/proj/f")
    refused(wide.read, f"{home}/me/notes")
    assert "home" not in [e.name for e in wide.list(str(tree))[0]]


def test_deny_entries_and_the_daemons_own_places_are_hidden(tree: Path) -> None:
    (tree / "data" / "keys").mkdir()
    (tree / "data" / "keys" / "k").write_bytes(b"k")
    (tree / "data" / "x.pem").write_bytes(b"pem")
    (tree / "data" / "state").mkdir()
    fa = access(
        tree,
        read=(tree / "data",),
        deny=(tree / "data" / "keys", f"{tree}/data/*.pem"),
        hidden=(str(tree / "data" / "state"),),
    )
    refused(fa.read, f"{tree}/data/keys/k")
    refused(fa.read, f"{tree}/data/x.pem")
    refused(fa.list, f"{tree}/data/state")
    names = [e.name for e in fa.list(f"{tree}/data")[0]]
    assert names == ["a.txt", "sub"]


def test_protected_paths_are_never_written(tree: Path) -> None:
    ws = tree / "out" / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (tree / "out" / "repo" / ".git" / "hooks").mkdir(parents=True)
    policy_file = tree / "out" / "policy.yaml"
    policy_file.write_bytes(b"name: t\n")
    fa = access(
        tree,
        write=(tree / "out",),
        protect=(".git/hooks", ".bashrc", f"{tree}/out/Makefile"),
        source=str(policy_file),
        workspace=ws,
    )
    for path in (
        f"{ws}/.git/hooks/pre-commit",
        f"{ws}/.bashrc",
        f"{tree}/out/.bashrc",
        f"{tree}/out/Makefile",
        str(policy_file),
    ):
        failure = refused(fa.write, path, b"evil", "overwrite")
        assert "protected" in failure.message
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert policy_file.read_bytes() == b"name: t\n"
    assert fa.write(f"{ws}/.git/HEAD", b"ref", "create") is True  # the rest of .git is not protected
    assert fa.read(str(policy_file)) == b"name: t\n"  # protected is read-only, not hidden


# ------------------------------------------------------------------------ links


@pytest.mark.parametrize(
    "target",
    ["{tree}/outside/secret", "../outside/secret", "../../{name}/outside/secret", "{tree}/outside/missing"],
    ids=["absolute", "relative", "dotdot-chain", "dangling"],
)
def test_a_planted_symlink_is_never_followed(tree: Path, target: str) -> None:
    link = tree / "out" / "link"
    link.symlink_to(target.format(tree=tree, name=tree.name))
    fa = access(tree, write=(tree / "out",))
    for call, args in (
        (fa.read, (str(link),)),
        (fa.list, (str(link),)),
        (fa.write, (str(link), b"overwritten", "overwrite")),
        (fa.write, (str(link), b"appended", "append")),
    ):
        failure = refused(call, *args)
        assert "symbolic link" in failure.message
    assert outcome(fa.write, str(link), b"created", "create") in ("exists", "refused")
    assert (tree / "outside" / "secret").read_bytes() == SECRET
    assert not (tree / "outside" / "missing").exists()
    assert os.readlink(link) == target.format(tree=tree, name=tree.name)  # the link itself untouched


def test_a_symlinked_directory_on_the_way_is_never_followed(tree: Path) -> None:
    (tree / "out" / "dir").symlink_to(tree / "outside")
    fa = access(tree, write=(tree / "out",))
    refused(fa.read, f"{tree}/out/dir/secret")
    refused(fa.write, f"{tree}/out/dir/new", b"x", "create")
    refused(fa.list, f"{tree}/out/dir")
    assert not (tree / "outside" / "new").exists()


def test_a_symlink_to_a_file_inside_the_grant_is_refused_too(tree: Path) -> None:
    (tree / "data" / "alias").symlink_to("a.txt")
    fa = access(tree, read=(tree / "data",))
    refused(fa.read, f"{tree}/data/alias")
    link = next(e for e in fa.list(f"{tree}/data")[0] if e.name == "alias")
    assert link.type == "symlink"


def test_a_grant_that_is_a_symlink_is_followed_only_outside_writable_trees(tree: Path) -> None:
    (tree / "data-link").symlink_to(tree / "data")
    trusted = access(tree, read=(tree / "data-link",))
    assert trusted.read(f"{tree}/data-link/a.txt") == b"hello"  # like /bin -> usr/bin
    # planted inside a writable tree: an agent could have made it
    (tree / "out" / "planted").symlink_to(tree / "outside")
    planted = access(tree, write=(tree / "out",), read=(tree / "out" / "planted",))
    failure = refused(planted.read, f"{tree}/out/planted/secret")
    assert "planted" in failure.message
    # a trusted grant that leads into a hidden place is refused by where it leads
    (tree / "secret-link").symlink_to(tree / "outside")
    leads = access(tree, read=(tree / "secret-link",), deny=(tree / "outside",))
    failure = refused(leads.read, f"{tree}/secret-link/secret")
    assert "leads to" in failure.message


RENAME_EXCHANGE = 2
SYS_RENAMEAT2 = 316  # x86-64


def _exchange(a: Path, b: Path) -> None:
    syscall(SYS_RENAMEAT2, _fs.AT_FDCWD, os.fsencode(a), _fs.AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)


@pytest.fixture
def swapping(tree: Path) -> Iterator[tuple[Path, threading.Event, list[int]]]:
    """out/sub is a real directory and a symlink to outside/ in turn, swapped
    atomically (renameat2 RENAME_EXCHANGE) in a loop by another thread."""
    sub = tree / "out" / "sub"
    sub.mkdir()
    (sub / "secret").write_bytes(b"inside")
    (tree / "outside" / "only-outside").write_bytes(b"")
    (tree / "out" / "alt").symlink_to(tree / "outside")
    stop = threading.Event()
    swaps = [0]

    def swap() -> None:
        while not stop.is_set():
            _exchange(sub, tree / "out" / "alt")
            swaps[0] += 1

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        yield sub, stop, swaps
    finally:
        stop.set()
        thread.join(timeout=30)


def test_a_directory_swapped_for_a_symlink_never_leads_outside(
    tree: Path, swapping: tuple[Path, threading.Event, list[int]]
) -> None:
    sub, _stop, swaps = swapping
    fa = access(tree, write=(tree / "out",))
    outcomes: dict[str, int] = {}

    def attempt(kind: str) -> None:
        if kind == "read":
            got = outcome(fa.read, f"{sub}/secret")
            ok = got == b"inside"
        elif kind == "list":
            got = outcome(fa.list, str(sub))
            ok = isinstance(got, tuple) and "only-outside" not in [e.name for e in got[0]]
        else:
            got = outcome(fa.write, f"{sub}/secret", b"inside", "overwrite")
            ok = isinstance(got, bool)
        if not ok:
            # a symlink met mid-swap is refused, or looks missing or not a directory
            assert got in ("refused", "not_found", "not_a_directory"), got
            outcomes[str(got)] = outcomes.get(str(got), 0) + 1
        else:
            outcomes["ok"] = outcomes.get("ok", 0) + 1

    for n in range(20_000):
        for kind in ("read", "list", "write"):
            attempt(kind)
        assert (tree / "outside" / "secret").read_bytes() == SECRET
        if n >= 2000 and outcomes.get("ok", 0) > 200 and outcomes.get("refused", 0) > 200:
            break
    assert swaps[0] > 0
    assert outcomes.get("ok", 0) > 200 and outcomes.get("refused", 0) > 200, outcomes


def test_the_swap_does_reach_outside_for_a_naive_reader(
    tree: Path, swapping: tuple[Path, threading.Event, list[int]]
) -> None:
    """The control: the race of the test above is real (plain open() follows the link)."""
    sub, _stop, _swaps = swapping
    seen = False
    for _ in range(100_000):
        try:
            seen = (sub / "secret").read_bytes() == SECRET
        except OSError:
            continue
        if seen:
            break
    assert seen


@needs_root
def test_a_bind_mount_inside_a_grant_is_not_crossed(tree: Path) -> None:
    mountpoint = tree / "data" / "mnt"
    mountpoint.mkdir()
    done = subprocess.run(["mount", "--bind", str(tree / "outside"), str(mountpoint)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
    try:
        fa = access(tree, read=(tree / "data",))
        failure = refused(fa.read, f"{mountpoint}/secret")
        assert "mount point" in failure.message
        refused(fa.list, str(mountpoint))
        direct = access(tree, read=(mountpoint,))  # granting the mounted directory itself works
        assert direct.read(f"{mountpoint}/secret") == SECRET
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


# ------------------------------------------------------------------- hard links


def test_a_hard_link_is_never_written_through(tree: Path) -> None:
    os.link(tree / "outside" / "secret", tree / "out" / "hard")
    fa = access(tree, write=(tree / "out",))
    for mode in ("overwrite", "append"):
        failure = refused(fa.write, f"{tree}/out/hard", b"changed", mode)
        assert "2 hard links" in failure.message
    failure = refused(fa.write, f"{tree}/out/hard", b"changed", "create", code="exists")
    assert (tree / "outside" / "secret").read_bytes() == SECRET
    # Reading one is allowed: only a file the agent could see can be linked, and
    # the file's own permissions still apply (docs/BROKER.md).
    assert fa.read(f"{tree}/out/hard") == SECRET


# ------------------------------------------------------------- sizes and types


def test_reads_are_bounded(tree: Path) -> None:
    with open(tree / "data" / "max", "wb") as f:
        f.truncate(MAX_READ)
    with open(tree / "data" / "big", "wb") as f:
        f.truncate(MAX_READ + 1)
    fa = access(tree, read=(tree / "data",))
    assert len(fa.read(f"{tree}/data/max")) == MAX_READ
    failure = refused(fa.read, f"{tree}/data/big", code="too_large")
    assert str(MAX_READ + 1) in failure.message


def test_writes_are_bounded(tree: Path) -> None:
    fa = access(tree, write=(tree / "out",))
    refused(fa.write, f"{tree}/out/big", b"\0" * (MAX_WRITE + 1), "create", code="too_large")
    assert not (tree / "out" / "big").exists()
    assert fa.write(f"{tree}/out/max", b"\0" * MAX_WRITE, "create") is True


def test_listings_are_bounded(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fs, "MAX_LIST", 3)
    for i in range(10):
        (tree / "out" / f"f{i}").write_bytes(b"")
    entries, truncated = access(tree, write=(tree / "out",)).list(f"{tree}/out")
    assert len(entries) == 3 and truncated is True


def _no_hang(call: object, *args: object) -> Refusal:
    """Run ``call`` in a thread: a special file opened without O_NONBLOCK would block forever."""
    result: list[BaseException | object] = []

    def run() -> None:
        try:
            result.append(call(*args))  # type: ignore[operator]
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the broker blocked on a special file"
    assert isinstance(result[0], Refusal), result
    return result[0]


def test_a_fifo_is_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "out" / "fifo")
    fa = access(tree, write=(tree / "out",))
    for call, args in (
        (fa.read, (f"{tree}/out/fifo",)),
        (fa.write, (f"{tree}/out/fifo", b"x", "overwrite")),
        (fa.write, (f"{tree}/out/fifo", b"x", "append")),
    ):
        failure = _no_hang(call, *args)
        assert failure.reason == "kind" and "fifo" in failure.message


def test_a_socket_is_refused(tree: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(tree / "out" / "sock"))
        fa = access(tree, write=(tree / "out",))
        assert "socket" in _no_hang(fa.read, f"{tree}/out/sock").message
        assert "socket" in _no_hang(fa.write, f"{tree}/out/sock", b"x", "overwrite").message
    finally:
        server.close()


@needs_root
def test_a_device_is_refused(tree: Path) -> None:
    os.mknod(tree / "out" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    fa = access(tree, write=(tree / "out",))
    assert "char" in _no_hang(fa.read, f"{tree}/out/null").message
    assert "char" in _no_hang(fa.write, f"{tree}/out/null", b"x", "overwrite").message


def test_not_found_and_wrong_kinds(tree: Path) -> None:
    fa = access(tree, write=(tree / "out",), read=(tree / "data",))
    refused(fa.read, f"{tree}/data/missing", code="not_found")
    refused(fa.read, f"{tree}/data/missing/x", code="not_found")
    refused(fa.list, f"{tree}/data/missing", code="not_found")
    refused(fa.read, f"{tree}/data/sub", code="is_a_directory")
    refused(fa.read, f"{tree}/data", code="is_a_directory")
    refused(fa.list, f"{tree}/data/a.txt", code="not_a_directory")
    refused(fa.read, f"{tree}/data/a.txt/x", code="not_a_directory")
    refused(fa.write, f"{tree}/out/nodir/x", b"", "create", code="not_found")
    refused(fa.write, f"{tree}/out", b"", "overwrite", code="is_a_directory")
    (tree / "out" / "d").mkdir()
    refused(fa.write, f"{tree}/out/d", b"", "overwrite", code="is_a_directory")


# ----------------------------------------------------------------- write modes


def test_write_modes(tree: Path) -> None:
    fa = access(tree, write=(tree / "out",))
    path = f"{tree}/out/f"
    assert fa.write(path, b"one", "create") is True
    failure = refused(fa.write, path, b"two", "create", code="exists")
    assert "overwrite or append" in failure.message
    assert fa.write(path, b"three", "append") is False
    assert (tree / "out" / "f").read_bytes() == b"onethree"
    assert fa.write(path, b"4", "overwrite") is False
    assert (tree / "out" / "f").read_bytes() == b"4"
    assert fa.write(f"{tree}/out/g", b"new", "overwrite") is True  # overwrite creates a missing file
    assert fa.write(f"{tree}/out/h", b"new", "append") is True
    assert (tree / "out" / "h").read_bytes() == b"new"


@needs_root
def test_a_created_file_belongs_to_the_grants_owner(tree: Path) -> None:
    os.chown(tree / "out", 4242, 4343)
    fa = access(tree, write=(tree / "out",))
    assert fa.write(f"{tree}/out/f", b"x", "create") is True
    st = os.stat(tree / "out" / "f")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4242, 4343, 0o644)


# ------------------------------------------------------------------ permissions


@needs_root
def test_file_modes_apply_as_to_the_cell_never_roots_override(tree: Path) -> None:
    (tree / "data" / "root-only").write_bytes(b"r")
    os.chmod(tree / "data" / "root-only", 0o600)
    (tree / "data" / "cells").write_bytes(b"c")
    os.chown(tree / "data" / "cells", NOBODY, NOBODY)  # the cell's own host uid (root-owned workspace)
    os.chmod(tree / "data" / "cells", 0o600)
    (tree / "data" / "closed").mkdir(mode=0o700)
    (tree / "data" / "closed" / "f").write_bytes(b"f")
    os.chmod(tree / "data" / "closed" / "f", 0o644)
    fa = access(tree, read=(tree / "data",))
    assert "not readable by the cell" in refused(fa.read, f"{tree}/data/root-only").message
    assert fa.read(f"{tree}/data/cells") == b"c"
    assert "not searchable" in refused(fa.read, f"{tree}/data/closed/f").message
    refused(fa.list, f"{tree}/data/closed")


@needs_root
def test_another_users_file_in_a_write_grant_is_not_writable(tree: Path) -> None:
    (tree / "out" / "theirs").write_bytes(b"t")
    os.chown(tree / "out" / "theirs", 4242, 4242)
    os.chmod(tree / "out" / "theirs", 0o644)
    fa = access(tree, write=(tree / "out",))
    refused(fa.write, f"{tree}/out/theirs", b"x", "overwrite")
    assert (tree / "out" / "theirs").read_bytes() == b"t"
    assert fa.read(f"{tree}/out/theirs") == b"t"
    # the grant's owner's files are the cell's (an idmapped mount in the cell)
    (tree / "out" / "owners").write_bytes(b"o")
    os.chmod(tree / "out" / "owners", 0o600)
    assert fa.write(f"{tree}/out/owners", b"x", "append") is False


@needs_root
def test_creating_needs_a_directory_the_cell_may_write(tree: Path) -> None:
    (tree / "out" / "locked").mkdir()
    os.chown(tree / "out" / "locked", 4242, 4242)
    os.chmod(tree / "out" / "locked", 0o755)
    fa = access(tree, write=(tree / "out",))
    refused(fa.write, f"{tree}/out/locked/f", b"x", "create")
    assert not (tree / "out" / "locked" / "f").exists()


# ----------------------------------------------------------------------- openat2


def test_openat2_refuses_every_way_out(tree: Path) -> None:
    root = os.open(tree / "data", os.O_PATH | os.O_DIRECTORY)
    (tree / "data" / "abs").symlink_to(tree / "outside" / "secret")
    try:
        fd = openat2(root, "a.txt", os.O_RDONLY, resolve=BENEATH)
        assert os.read(fd, 10) == b"hello"
        os.close(fd)
        for path, err in (
            ("../outside/secret", errno.EXDEV),
            (f"{tree}/outside/secret", errno.EXDEV),
            ("abs", errno.ELOOP),
            ("/proc/self/root/etc/passwd", errno.EXDEV),
        ):
            with pytest.raises(OSError) as info:
                openat2(root, path, os.O_RDONLY, resolve=BENEATH)
            assert info.value.errno == err, path
    finally:
        os.close(root)


def test_openat2_reports_the_kernels_error_and_refuses_a_nul(tree: Path) -> None:
    """openat2 keeps the kernel's errors (ENOENT; EXDEV outside the root) and
    a NUL in a name never reaches the kernel (which would stop reading there
    and open another file)."""
    root = os.open(tree, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as missing:
            openat2(root, "nothing-here", os.O_RDONLY, resolve=BENEATH)
        assert missing.value.errno == errno.ENOENT
        with pytest.raises(OSError) as outside:
            openat2(root, "../x", os.O_RDONLY, resolve=BENEATH)
        assert outside.value.errno == errno.EXDEV
        with pytest.raises(ValueError, match="NUL"):
            openat2(root, "a\x00b", os.O_RDONLY, resolve=BENEATH)
        fd = openat2(root, ".", os.O_PATH | os.O_DIRECTORY, resolve=BENEATH)
        try:
            assert os.get_inheritable(fd) is False  # O_CLOEXEC always added
        finally:
            os.close(fd)
    finally:
        os.close(root)


# ------------------------------------------------------------ filesystem.mounts


def test_a_mount_target_is_its_source_granted_as_mounted(tree: Path) -> None:
    from stockade.policy import MountRule

    policy = Policy(
        name="t",
        filesystem=FilesystemPolicy(
            mounts=(
                MountRule(str(tree / "data"), "/mnt/data", "ro"),
                MountRule(str(tree / "out"), "/mnt/out", "rw"),
            )
        ),
    )
    (tree / "ws").mkdir(exist_ok=True)
    fa = FileAccess(policy, workspace=str(tree / "ws"))
    assert fa.read("/mnt/data/a.txt") == b"hello"
    assert fa.read("/mnt/data/sub/b.txt") == b"deep"
    refused(fa.write, "/mnt/data/new.txt", b"x", "create")  # a read-only mount stays read-only
    fa.write("/mnt/out/new.txt", b"made", "create")
    assert (tree / "out" / "new.txt").read_bytes() == b"made"
    refused(fa.read, "/mnt/other/x")  # beside the targets: no grant
    refused(fa.read, f"{tree}/outside/secret")
