"""Plain value classes for the start-up path: ``__slots__`` and a written
``__init__``, with the equality, hash and repr of a dataclass.

Why not ``@dataclass``: on Python 3.11 it compiles five or six functions per
class with ``exec`` when the module is imported (0.7 to 2.3 ms a class on this
host, measured for issue 18), and ``stockade exec`` imports ~40 of them before
its cell starts. A class here costs a plain class statement (~10 µs); its
methods are defined once, below. Use it for internal classes on the exec path
only; public and wire-facing types (``Policy``, ``Event``, ``CellResult``)
stay dataclasses because callers use ``dataclasses.replace``,
``fields`` and ``asdict`` on them.

A subclass names its fields in ``_fields``, in the order of its
``__init__``'s parameters (``__reduce__`` relies on it), sets ``__slots__ =
_fields`` and sets them in ``__init__``: ``Frozen`` with ``object.__setattr__`` (assignment raises
afterwards, as for ``@dataclass(frozen=True)``), ``Mutable`` plainly.
``_replace(**changes)`` stands for ``dataclasses.replace``.
"""

from __future__ import annotations

from typing import ClassVar, Self


class Mutable:
    """A value class: equal (and repr'd) by its fields, like ``@dataclass``."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Mutable)
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # as @dataclass(eq=True) without frozen: unhashable

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{self.__class__.__qualname__}({inner})"

    def _replace(self, **changes: object) -> Self:
        """A copy with ``changes``: what ``dataclasses.replace`` is for a dataclass
        (namedtuple's name for it)."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"{self.__class__.__qualname__} has no field {sorted(unknown)[0]!r}")
        return self.__class__(**{name: changes.get(name, getattr(self, name)) for name in self._fields})

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return (self.__class__, self._values())


class Frozen(Mutable):
    """A value class that cannot change after ``__init__``: hashable by its
    fields, like ``@dataclass(frozen=True)``."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {self.__class__.__qualname__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {self.__class__.__qualname__}")
