"""Plain value classes for the start-up path: ``__slots__`` and a written
``__init__``, with the equality, hash and repr of a dataclass.

Why not ``@dataclass``: on Python 3.11 it compiles five or six functions per
class with ``exec`` when the module is imported (0.7 to 2.3 ms a class on this
host, measured for issue 18), and ``stockade exec`` imports ~40 of them before
its cell starts. A class here costs a plain class statement (~10 µs); its
methods are defined once, below. Use it for the classes of the exec path;
elsewhere a dataclass reads better and costs nothing that matters.

They still answer to ``dataclasses``: ``dataclasses.replace``, ``fields``,
``asdict`` and ``is_dataclass`` work on them (``__dataclass_fields__`` is made
the first time one of those asks, from the class's ``_fields``, annotations
and ``__init__`` defaults: by then the caller has imported ``dataclasses``
anyway), and a frozen one refuses a change with
``dataclasses.FrozenInstanceError``. So the public types of the path
(``Policy`` and its sections, ``Event``, ``CellResult``) are slotted too, and
it imports neither ``dataclasses`` nor what that pulls in (``inspect``,
``ast``, ``dis``, ``tokenize``). What is lost: mypy's dataclass plugin no
longer checks the field names given to ``dataclasses.replace`` on them (a
wrong one is still a ``TypeError`` at once).

A subclass names its fields in ``_fields``, in the order of its
``__init__``'s parameters (``__reduce__`` relies on it), sets ``__slots__ =
_fields`` and sets them in ``__init__``: ``Frozen`` with
``object.__setattr__`` (assignment raises afterwards, as for
``@dataclass(frozen=True)``), ``Mutable`` plainly.
``_replace(**changes)`` stands for ``dataclasses.replace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from dataclasses import Field

_made: dict[type, dict[str, Any]] = {}
"""The ``__dataclass_fields__`` of each class, once asked for."""


class _DataclassFields:
    """``__dataclass_fields__``, made when ``dataclasses`` first asks for it."""

    def __get__(self, instance: object, owner: type) -> dict[str, Any]:
        made = _made.get(owner)
        if made is None:
            made = _made[owner] = _dataclass_fields(owner)
        return made


def _dataclass_fields(cls: type) -> dict[str, Any]:
    """The fields of ``cls`` as ``dataclasses`` has them for a dataclass of the
    same fields, annotations and defaults (those of its ``__init__``)."""
    import copy
    import dataclasses
    import functools
    import inspect

    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        hints.update(getattr(klass, "__annotations__", {}))
    parameters = inspect.signature(cls).parameters
    spec: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name in getattr(cls, "_fields", ()):
        hint = hints.get(name, "Any")
        param = parameters.get(name)
        if param is None or param.default is param.empty:
            spec.append((name, hint))
        elif param.default.__class__.__hash__ is None:  # a mutable default: a copy each time
            fresh = functools.partial(copy.copy, param.default)
            spec.append((name, hint, dataclasses.field(default_factory=fresh)))
        else:
            spec.append((name, hint, dataclasses.field(default=param.default)))
    shadow = dataclasses.make_dataclass(cls.__name__, spec, frozen=issubclass(cls, Frozen))
    return {f.name: f for f in dataclasses.fields(shadow)}


class Mutable:
    """A value class: equal (and repr'd) by its fields, like ``@dataclass``."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    else:
        __dataclass_fields__ = _DataclassFields()

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
    fields, like ``@dataclass(frozen=True)``, and refusing a change with the
    same ``dataclasses.FrozenInstanceError`` (an ``AttributeError``)."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())

    def __setattr__(self, name: str, value: object) -> None:
        from dataclasses import FrozenInstanceError  # only on this mistake

        raise FrozenInstanceError(
            f"cannot assign to field {name!r} of a frozen {self.__class__.__qualname__}"
        )

    def __delattr__(self, name: str) -> None:
        from dataclasses import FrozenInstanceError

        raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen {self.__class__.__qualname__}")
