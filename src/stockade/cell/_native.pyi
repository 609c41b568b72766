"""Type stub of the C extension ``_native.c``: the launcher's children."""

from collections.abc import Sequence

_Path = str | bytes
_Mount = tuple[str, _Path, _Path, bool, bytes, Sequence[_Path], int, bool]
"""(kind, dst, src, writable, data, names, userns fd or -1, from_view): one
``MountOp``; ``names`` are a decoy directory's entries, or the device names of
``dev``."""
_Landlock = tuple[bytes, tuple[bytes, ...], tuple[tuple[bytes, int, int], ...], tuple[bytes, ...], int]
"""(ruleset_attr, ready rules, (path, dir rights, file rights)..., port rules,
restrict flags): a ``PreparedLandlock``."""

def spawn(
    *,
    argv: tuple[_Path, ...],
    env: tuple[tuple[_Path, _Path], ...],
    workdir: _Path,
    mounts: tuple[_Mount, ...],
    landlock: _Landlock | None,
    seccomp: tuple[tuple[bytes, bool], ...],
    cgroup_procs: tuple[_Path, ...],
    loginuid: int | None,
    stdio: tuple[int, int, int],
    status_pipe: tuple[int, int],
    go_pipe: tuple[int, int],
    cap_last: int,
    keep_fds: tuple[int, ...],
    userns_owner: tuple[int, int] | None = None,
    notify: tuple[bytes, int] | None = None,
    session: int | None = None,
    identity: tuple[int, int, int] | None = None,
    decoys: tuple[int, int, tuple[_Path, ...]] | None = None,
) -> int:
    """Fork the cell's first child and return its pid.

    ``identity``: (uid, gid, kept capabilities) of the command inside, for a
    workbench (``CellPlan.id_range``); None is the agent, uid 1000, with none.
    An ``overlay`` mount is (kind, "/", image rootfs, True, upper's host
    directory, (upper name, work name), id-range user namespace fd, False).

    ``notify``: a seccomp filter to load with a user-notification listener, and
    the socket on which the cell's init sends that listener (SCM_RIGHTS).
    ``session``: a descriptor, also in ``keep_fds``, on which the cell's init
    serves session calls instead of running ``argv`` (``_session_init.h``).
    ``decoys``: (uid, gid, writable paths): the host ids that own the cell's
    decoys and the paths it may write beneath; the decoy directories outside
    those are then copies of a template made once per process (from the
    second launch that asks for the same one); None: each cell makes them.

    Raises:
        TypeError, ValueError: an argument is malformed (checked before forking).
        OSError: fork failed.
    """


def kept() -> tuple[int, ...]:
    """The descriptors ``spawn`` keeps across launches, by design: the decoys'
    templates and Landlock's host entries (bounded)."""

DECOY_TEMPLATES: int
"""Set where ``spawn`` takes ``decoys``."""

def userns(uid_map: bytes, gid_map: bytes, /) -> int:
    """The fd of a fresh user namespace with these maps (setgroups denied),
    for idmapped mounts; made by a ``CLONE_VM`` child, not a fork.

    Raises:
        OSError: the namespace could not be made or mapped.
    """

def warm_cgroup(tasks: str, seconds: float) -> None:
    """Have a thread of this process (of C: it never takes the GIL) write its
    own thread id to ``tasks`` every 4 ms for ``seconds`` from now (``_migration``).

    Raises:
        ValueError: ``seconds`` outside 0-10, or a path too long.
        OSError: no thread could be started.
    """
