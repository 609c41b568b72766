"""The plain value classes of the start-up path behave as the dataclasses they replace."""

from __future__ import annotations

import pickle

import pytest

from stockade._slots import Frozen, Mutable


class _Point(Frozen):
    _fields = ("x", "y")
    __slots__ = _fields
    x: int
    y: tuple[int, ...]

    def __init__(self, x: int, y: tuple[int, ...] = ()) -> None:
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)


class _Box(Mutable):
    _fields = ("items",)
    __slots__ = _fields
    items: list[int]

    def __init__(self, items: list[int]) -> None:
        self.items = items


def test_frozen_is_equal_and_hashed_by_its_fields_and_cannot_change() -> None:
    a, b = _Point(1, (2,)), _Point(1, (2,))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != _Point(2, (2,))
    assert a.__eq__(("x", 1)) is NotImplemented
    assert repr(a) == "_Point(x=1, y=(2,))"
    with pytest.raises(AttributeError, match="cannot assign to field 'x'"):
        a.x = 3
    with pytest.raises(AttributeError, match="cannot delete field 'x'"):
        del a.x
    assert pickle.loads(pickle.dumps(a)) == a
    assert not hasattr(a, "__dict__")
    moved = a._replace(x=5)
    assert moved == _Point(5, (2,)) and a == _Point(1, (2,))
    with pytest.raises(TypeError, match="no field 'z'"):
        a._replace(z=1)


def test_mutable_is_equal_by_its_fields_and_unhashable() -> None:
    box = _Box([1])
    box.items.append(2)
    box.items = [1, 2]
    assert box == _Box([1, 2]) and box != _Box([1])
    with pytest.raises(TypeError):
        hash(box)
    assert pickle.loads(pickle.dumps(box)) == box


def test_dataclasses_serve_them_as_dataclasses_of_the_same_fields() -> None:
    import dataclasses

    from stockade.policy import Limits, default_policy
    from stockade.record import Event

    point = _Point(1, (2,))
    assert dataclasses.is_dataclass(point) and dataclasses.is_dataclass(_Point)
    assert [f.name for f in dataclasses.fields(_Point)] == ["x", "y"]
    assert dataclasses.fields(_Point)[1].default == ()
    assert dataclasses.fields(_Point)[0].default is dataclasses.MISSING
    assert dataclasses.replace(point, y=(3,)) == _Point(1, (3,))
    assert dataclasses.asdict(point) == {"x": 1, "y": (2,)}
    with pytest.raises(TypeError):
        dataclasses.replace(point, z=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2
    policy = default_policy()
    tighter = dataclasses.replace(policy, limits=dataclasses.replace(policy.limits, pids=7))
    assert tighter.limits == Limits(**{**dataclasses.asdict(policy.limits), "pids": 7})
    assert tighter.filesystem is policy.filesystem and policy.limits.pids != 7
    assert dataclasses.asdict(policy)["filesystem"]["read"] == policy.filesystem.read
    event = Event("cell.start", "c-1", "cell", "info")
    assert event.detail == {} and event.detail is not Event("cell.start", "c-1", "cell", "info").detail
    moved = Event("cell.start", "c-1", "cell", "info", {}, event.time, "", "r-1")
    assert dataclasses.replace(event, run="r-1") == moved
    assert dataclasses.asdict(event)["kind"] == "cell.start"
