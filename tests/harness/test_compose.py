"""What of a compose file the stockade sandbox honours, and the keys it refuses by name."""

from __future__ import annotations

import pytest

from stockade.errors import PolicyError
from stockade.harness._compose import compose_service, is_compose, policy_for_service
from stockade.policy import default_policy


def test_one_service_maps_onto_the_policy() -> None:
    doc = {
        "services": {
            "default": {
                "image": "bench/python:3.11",
                "working_dir": "/work",
                "environment": ["A=1", "B=two=2"],
                "mem_limit": "512m",
                "cpus": 1.5,
                "command": "tail -f /dev/null",
                "init": True,
            }
        }
    }
    service = compose_service(doc, source="compose.yaml")
    policy = policy_for_service(default_policy(), service)
    assert policy.image == "bench/python:3.11"
    assert policy.workdir == "/work"
    assert ("A", "1") in policy.env.set and ("B", "two=2") in policy.env.set
    assert policy.limits.memory == 512 << 20
    assert policy.limits.cpu == 1.5


def test_environment_as_a_mapping_and_network_none() -> None:
    doc = {"services": {"s": {"image": "x:1", "environment": {"K": "v", "E": None}, "network_mode": "none"}}}
    service = compose_service(doc, source="c.yaml")
    assert service.environment == (("K", "v"), ("E", ""))
    assert service.network is False


@pytest.mark.parametrize(
    ("service", "named"),
    [
        ({"image": "x:1", "ports": ["8080:80"]}, "services.default.ports"),
        ({"image": "x:1", "volumes": ["./data:/data"]}, "services.default.volumes"),
        ({"image": "x:1", "privileged": True}, "services.default.privileged"),
        ({"image": "x:1", "network_mode": "host"}, "network_mode 'host'"),
        ({"image": "x:1", "environment": ["FROM_HOST"]}, "'FROM_HOST'"),
        ({"image": "x:1", "mem_limit": "lots"}, "mem_limit 'lots'"),
        ({"image": "x:1", "build": {"context": ".", "args": {"A": "1"}}}, "build.args"),
    ],
)
def test_an_unsupported_key_is_named(service: dict[str, object], named: str) -> None:
    with pytest.raises(PolicyError) as info:
        compose_service({"services": {"default": service}}, source="compose.yaml")
    assert named in str(info.value)
    assert str(info.value).startswith("compose.yaml:")


def test_a_second_service_is_refused_by_name() -> None:
    doc = {"services": {"default": {"image": "a:1", "x-default": True}, "db": {"image": "postgres"}}}
    with pytest.raises(PolicyError, match="services db beside the default 'default'"):
        compose_service(doc, source="compose.yaml")
    without_default = {"services": {"a": {"image": "a:1"}, "b": {"image": "b:1"}}}
    with pytest.raises(PolicyError, match="none marked `x-default: true`"):
        compose_service(without_default, source="compose.yaml")


def test_a_top_level_volume_is_refused() -> None:
    with pytest.raises(PolicyError, match="top-level key 'volumes'"):
        compose_service({"services": {"s": {"image": "a:1"}}, "volumes": {"v": {}}}, source="c.yaml")


def test_build_without_an_image_says_how_to_build_it() -> None:
    service = compose_service({"services": {"s": {"build": "."}}}, source="c.yaml")
    with pytest.raises(PolicyError, match="stockade image build"):
        policy_for_service(default_policy(), service)


def test_compose_is_told_from_a_policy(tmp_path: object) -> None:
    import pathlib

    root = pathlib.Path(str(tmp_path))
    (root / "compose.yaml").write_text("services: {}\n")
    (root / "tasks.yaml").write_text("services:\n  s:\n    image: a:1\n")
    (root / "policy.yaml").write_text("name: p\nfilesystem:\n  read: [/usr]\n")
    assert is_compose(str(root / "compose.yaml"))
    assert is_compose(str(root / "tasks.yaml"))
    assert not is_compose(str(root / "policy.yaml"))
