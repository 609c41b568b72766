"""Which refusals of the mount layer and of file permissions the agent tried.

The kernel audit rules of ``_audit_mount`` match every refused call of a
cell's processes, the launcher's included, and an ordinary ``mv`` from
``/tmp`` to the workspace meets ``EXDEV`` before it copies instead. Telling
those from attempts needs the cell's plan: where it may write, which
read-only mounts lie inside those places (protected files), which writable
mounts are pinned because they hold one. ``Places`` is that much of the plan,
small and plain (JSON) so that a reader in another process (the daemon's
audit relay, ``_audit_relay``) judges a cell's refusals exactly as ``Cell``
does; ``not_an_attempt`` is the one judgement both use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from stockade._slots import Frozen

if TYPE_CHECKING:
    from stockade.cell._plan import CellPlan
    from stockade.record import Event

__all__ = ["MAX_PLACES_BYTES", "VIEW_STAGE", "Places", "needs_places", "not_an_attempt"]

VIEW_STAGE: Final = "/newroot"
"""Where the launcher builds the cell's view before it pivots into it
(``_native.c``): no path of the agent's starts there."""

MAX_PLACES_BYTES: Final = 64 * 1024
"""The most a cell's ``Places`` may weigh as JSON on the relay's pipe. A
plan's places are a few hundred bytes (a workspace, /tmp, a dozen protected
files); one past this (thousands of nested repositories) is not sent, and the
relay then keeps none of that cell's ``EXDEV`` refusals, the only ones that
need it (the recovery says so)."""


class Places(Frozen):
    """The places of one cell that decide whether an ``EXDEV`` or a refused
    reach was an attempt."""

    _fields = ("writable", "protected", "pinned", "decoys", "image_rootfs")
    __slots__ = _fields
    writable: tuple[str, ...]
    """Where the cell may write (its write grants)."""
    protected: tuple[str, ...]
    """Read-only bind mounts inside those places (``.git/hooks``, ``.bashrc``…)."""
    pinned: tuple[str, ...]
    """Writable bind mounts (not the workspace) that hold a protected path (``.git``)."""
    decoys: tuple[str, ...]
    """The cell's decoys: a refused reach (``reach`` in the event: a lookup
    that changes nothing) is an attempt only inside one of them."""
    image_rootfs: str
    """A workbench's image (its read-only lower layer, on the host): a reach
    through one of the image's links names the link, not the decoy it leads
    to (a failed walk logs only the name asked for), so the name is also
    resolved inside the image, as the image's links lead."""

    def __init__(
        self,
        writable: tuple[str, ...],
        protected: tuple[str, ...],
        pinned: tuple[str, ...],
        decoys: tuple[str, ...] = (),
        image_rootfs: str = "",
    ) -> None:
        object.__setattr__(self, "writable", writable)
        object.__setattr__(self, "protected", protected)
        object.__setattr__(self, "pinned", pinned)
        object.__setattr__(self, "decoys", decoys)
        object.__setattr__(self, "image_rootfs", image_rootfs)

    @classmethod
    def of(cls, plan: CellPlan) -> Places:
        writable = (*plan.grants.write, *plan.grants.write_exec)
        protected = tuple(
            m.dst
            for m in plan.mounts
            if m.kind == "bind" and not m.writable and any(_inside(m.dst, w) for w in writable)
        )
        pinned = tuple(
            dict.fromkeys(
                m.dst
                for m in plan.mounts
                if m.kind == "bind"
                and m.writable
                and m.dst != plan.workspace
                and any(p != m.dst and _inside(p, m.dst) for p in protected)
            )
        )
        from stockade.cell._audit_mount import DIR_DECOY, PROC_DECOY

        decoys = tuple(
            dict.fromkeys(
                [
                    *plan.hidden,
                    *(m.dst for m in plan.mounts if m.kind == "bind" and m.src in (DIR_DECOY, PROC_DECOY)),
                ]
            )
        )
        return cls(
            writable=tuple(writable),
            protected=protected,
            pinned=pinned,
            decoys=decoys,
            image_rootfs=plan.image_rootfs,
        )

    def to_dict(self) -> dict[str, list[str] | str]:
        return {
            "writable": list(self.writable),
            "protected": list(self.protected),
            "pinned": list(self.pinned),
            "decoys": list(self.decoys),
            "image_rootfs": self.image_rootfs,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Places:
        """The places sent as ``to_dict`` made them.

        Raises:
            ValueError: a field is missing or not a list of strings.
        """

        def paths(key: str) -> tuple[str, ...]:
            value = data.get(key, [] if key == "decoys" else None)
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"places.{key} must be a list of paths, not {value!r}")
            return tuple(value)

        return cls(
            writable=paths("writable"),
            protected=paths("protected"),
            pinned=paths("pinned"),
            decoys=paths("decoys"),
            image_rootfs=_text(data, "image_rootfs"),
        )


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"places.{key} must be a path, not {value!r}")
    return value


def needs_places(event: Event) -> bool:
    """An event whose judgement needs the cell's places (an ``EXDEV``, a reach)."""
    if event.layer == "dac" and event.detail.get("reach") is True:
        return True
    return event.layer == "mount" and event.detail.get("errno") == "EXDEV"


def not_an_attempt(event: Event, places: Places) -> bool:
    """A refusal of the mount layer or of file permissions that the agent did
    not try: the launcher's own, while it built the view (every path under
    ``VIEW_STAGE``: it touches files it will bind over, and root-owned ones
    refuse), an ordinary move between writable places (``_benign_crossing``),
    or a refused reach (a lookup, an open for reading) outside the cell's
    decoys: file permissions refusing a read of ``/root`` to a workbench's
    user is the image's business, and a reach into a decoy is the one the
    rule on reaches is there for (cell/_audit_mount.py)."""
    if event.layer not in ("mount", "dac"):
        return False
    paths = event.detail.get("paths")
    if (
        isinstance(paths, list)
        and paths
        and all(isinstance(p, str) and (p == VIEW_STAGE or p.startswith(VIEW_STAGE + "/")) for p in paths)
    ):
        return True
    if event.layer == "dac" and event.detail.get("reach") is True:
        named = [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []
        return not any(any(_inside(p, d) for d in places.decoys) for p in _as_reached(named, places))
    return _benign_crossing(event, places)


def _benign_crossing(event: Event, places: Places) -> bool:
    """A rename or link across mounts (EXDEV) into a place the cell may write:
    what an ordinary ``mv`` from /tmp to the workspace meets before it copies
    instead, not an attempt on anything. Kept (cell/_audit_mount.py): one
    into a read-only mount inside those places (a protected directory), into
    a directory pinned because it holds a protected path (``.git``), or into
    a place the cell may not write (either directory: the kernel logs both
    without saying which is the source). It logs only directories: a rename
    from another mount straight onto a protected file of the workspace's top
    directory is refused (EXDEV) but looks like any ``mv`` into it, so it is
    not kept (``mv``'s copy that follows meets EROFS, which is)."""
    if not needs_places(event):
        return False
    paths = event.detail.get("paths")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        return False
    # Both directories must be ordinary writable places: the kernel logs the
    # two without saying which is the source.
    if any(_inside(path, p) for path in paths for p in places.protected):
        return False
    if any(path in places.pinned for path in paths):
        return False
    return all(any(_inside(path, w) for w in places.writable) for path in paths)


def _as_reached(paths: list[str], places: Places) -> list[str]:
    """``paths`` and, in a workbench, each as the image's links resolve it
    (``_workbench.resolve_in_image``: inside the image's root, never the
    host's); an agent's own link in its upper is not followed."""
    if not places.image_rootfs:
        return paths
    from stockade.cell._workbench import resolve_in_image
    from stockade.errors import PolicyError

    out = list(paths)
    for path in paths:
        if path.startswith("/"):
            try:
                out.append(resolve_in_image(places.image_rootfs, path)[0])
            except (PolicyError, OSError):
                continue  # a loop of links: the name as asked is all there is
    return out


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
