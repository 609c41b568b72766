"""Importing OCI layouts and ``docker save`` tarballs made in the test."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from stockade.errors import ImageError
from stockade.image import ImageStore, import_image
from tests.image._archives import Entry, docker_tarball, image_config, layer_tar, oci_tarball, sha

BASE = [
    Entry("etc", "dir", mode=0o755),
    Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"),
    Entry("etc/keep", data=b"old"),
    Entry("bin", "dir", mode=0o755),
    Entry("bin/busybox", data=b"\x7fELF", mode=0o4755),
    Entry("bin/sh", "symlink", link="busybox"),
    Entry("app", "dir", mode=0o750, uid=1000, gid=1000),
    Entry(
        "app/data",
        data=b"mine",
        uid=1000,
        gid=1000,
        mode=0o600,
        xattrs={"user.origin": "test", "trusted.overlay.opaque": "y"},
    ),
    Entry("opq", "dir"),
    Entry("opq/a", data=b"a"),
    Entry("opq/b", data=b"b"),
    Entry("gone", data=b"soon gone"),
    Entry("dev", "dir"),
    Entry("dev/null", "chr", mode=0o666, dev=(1, 3)),
    Entry("dev/pipe", "fifo", mode=0o600),
]
TOP = [
    Entry(".wh.gone"),
    Entry("opq/.wh..wh..opq"),
    Entry("opq/c", data=b"c"),
    Entry("etc/keep", data=b"new"),
    Entry("etc/passwd-link", "hardlink", link="etc/passwd"),
]
RUNTIME = {
    "Env": ["PATH=/usr/bin:/bin", "GREETING=hi"],
    "WorkingDir": "/app",
    "User": "1000:1000",
    "Entrypoint": ["/bin/sh", "-c"],
    "Cmd": ["echo hi"],
    "Labels": {"org.example.task": "tiny"},
}


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


def _layers() -> list[bytes]:
    return [layer_tar(BASE), layer_tar(TOP)]


def _check_rootfs(root: Path) -> None:
    assert not (root / "gone").exists()
    assert sorted(os.listdir(root / "opq")) == ["c"]
    assert (root / "etc/keep").read_bytes() == b"new"
    assert os.readlink(root / "bin/sh") == "busybox"
    assert os.stat(root / "etc/passwd-link").st_ino == os.stat(root / "etc/passwd").st_ino
    busybox = os.stat(root / "bin/busybox")
    assert stat.S_IMODE(busybox.st_mode) == 0o4755 and busybox.st_uid == 0
    app = os.stat(root / "app")
    assert (app.st_uid, app.st_gid, stat.S_IMODE(app.st_mode)) == (1000, 1000, 0o750)
    data = os.stat(root / "app/data")
    assert (data.st_uid, data.st_gid, stat.S_IMODE(data.st_mode)) == (1000, 1000, 0o600)
    assert os.getxattr(root / "app/data", "user.origin") == b"test"
    # A trusted.overlay.* xattr would be read by overlayfs when this is a lower layer.
    with pytest.raises(OSError):
        os.getxattr(root / "app/data", "trusted.overlay.opaque")
    null = os.lstat(root / "dev/null")
    assert stat.S_ISCHR(null.st_mode) and null.st_rdev == os.makedev(1, 3)
    assert stat.S_ISFIFO(os.lstat(root / "dev/pipe").st_mode)


def test_oci_layout_tarball_is_flattened_with_whiteouts_links_and_owners(
    store: ImageStore, tmp_path: Path
) -> None:
    layers = _layers()
    config = image_config(layers, **RUNTIME)
    image = import_image(store, oci_tarball(tmp_path / "tiny.tar", layers, config=config))
    assert image.digest == sha(config)
    assert image.names == ("tiny:1",)
    _check_rootfs(image.rootfs)
    assert image.config.env == ("PATH=/usr/bin:/bin", "GREETING=hi")
    assert (image.config.workdir, image.config.user) == ("/app", "1000:1000")
    assert image.config.entrypoint == ("/bin/sh", "-c") and image.config.cmd == ("echo hi",)
    assert dict(image.config.labels) == {"org.example.task": "tiny"}
    assert image.provenance["kind"] == "import" and image.provenance["format"] == "oci-layout"
    applied = image.provenance["applied"]
    assert isinstance(applied, dict)
    assert (applied["whiteouts"], applied["opaque"], applied["setuid"], applied["devices"]) == (1, 1, 1, 1)
    assert applied["dropped_xattrs"] == 1
    # Every ref form finds it; the blobs are kept by digest.
    assert store.get("tiny:1").digest == store.get(image.digest[7:19]).digest == image.digest
    assert (store.blobs / sha(config)[7:]).read_bytes() == config
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert not list(store.tmp_dir.iterdir())


def test_docker_save_tarball_and_a_directory_layout(store: ImageStore, tmp_path: Path) -> None:
    layers = _layers()
    image = import_image(store, docker_tarball(tmp_path / "d.tar", layers, tags=["tiny:docker"]))
    assert image.names == ("tiny:docker",)
    assert image.provenance["format"] == "docker-archive"
    _check_rootfs(image.rootfs)
    # The same layers as an OCI layout directory, with a name given: the same config, the same image.
    layout = tmp_path / "layout"
    layout.mkdir()

    with tarfile.open(oci_tarball(tmp_path / "o.tar", layers, gzip_layers=False)) as tar:
        tar.extractall(layout, filter="data")
    again = import_image(store, layout, name="other")
    assert again.digest == image.digest
    assert set(again.names) == {"other:latest", "tiny:docker"}
    _check_rootfs(again.rootfs)


def test_docker_25_layout_and_a_gzipped_tarball(store: ImageStore, tmp_path: Path) -> None:
    layers = _layers()
    path = docker_tarball(tmp_path / "d25.tar.gz", layers, tags=["tiny:25"], oci_names=True, compress=True)
    image = import_image(store, path)
    assert image.names == ("tiny:25",)
    _check_rootfs(image.rootfs)
    # A blob named by its digest is checked against that digest.
    layer = layers[0]
    config = image_config([layer])
    wrong = f"blobs/sha256/{sha(b'another layer')[7:]}"
    manifest = [{"Config": f"{sha(config)[7:]}.json", "RepoTags": [], "Layers": [wrong]}]
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        for name, data in (
            ("manifest.json", json.dumps(manifest).encode()),
            (f"{sha(config)[7:]}.json", config),
            (wrong, layer),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ImageError, match=r"has digest sha256:[0-9a-f]{64}, not the sha256:"):
        import_image(store, bad)
    assert store.digests() == [image.digest]


def _assert_nothing_added(store: ImageStore) -> None:
    assert store.digests() == []
    assert not store.tmp_dir.exists() or not list(store.tmp_dir.iterdir())


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        ([Entry("../evil", data=b"x")], "climbs out with '..'"),
        ([Entry("a/../../evil", data=b"x")], "climbs out with '..'"),
        ([Entry("/evil", data=b"x")], "is absolute"),
        ([Entry("etc", "dir"), Entry("etc/x", "hardlink", link="../../etc/shadow")], "climbs out with '..'"),
    ],
)
def test_paths_out_of_the_rootfs_are_refused(
    store: ImageStore, tmp_path: Path, entries: list[Entry], said: str
) -> None:
    with pytest.raises(ImageError, match=said):
        import_image(store, oci_tarball(tmp_path / "bad.tar", [layer_tar(entries)]))
    _assert_nothing_added(store)
    assert not (tmp_path / "evil").exists() and not (store.root / "evil").exists()


@pytest.mark.parametrize("link", ["OUTSIDE", "../../../../../../../../OUTSIDE"])
def test_a_symlink_planted_by_a_lower_layer_does_not_lead_out(
    store: ImageStore, tmp_path: Path, link: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = str(outside) if link == "OUTSIDE" else link.replace("OUTSIDE", str(outside).lstrip("/"))
    lower = layer_tar([Entry("esc", "symlink", link=target)])
    upper = layer_tar([Entry("esc/pwned", data=b"owned")])
    with pytest.raises(ImageError, match="goes through a symlink in 'esc' that leads out"):
        import_image(store, oci_tarball(tmp_path / "sym.tar", [lower, upper]))
    assert list(outside.iterdir()) == []
    _assert_nothing_added(store)
    # The control: a symlink that stays inside is followed, as in the image.
    inside = [
        layer_tar([Entry("real", "dir"), Entry("ok", "symlink", link="real")]),
        layer_tar([Entry("ok/file", data=b"fine")]),
    ]
    image = import_image(store, oci_tarball(tmp_path / "ok.tar", inside))
    assert (image.rootfs / "real/file").read_bytes() == b"fine"


def test_a_layer_that_does_not_match_its_digest_is_refused(store: ImageStore, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=r"not the sha256:[0-9a-f]{64} its manifest says"):
        import_image(store, oci_tarball(tmp_path / "t.tar", _layers(), tamper=1, gzip_layers=False))
    _assert_nothing_added(store)


def test_a_diff_id_that_does_not_match_is_refused(store: ImageStore, tmp_path: Path) -> None:
    layers = _layers()
    config = json.loads(image_config(layers))
    config["rootfs"]["diff_ids"][0] = sha(b"something else")
    with pytest.raises(ImageError, match=r"is not the config's rootfs.diff_ids\[0\]"):
        import_image(store, docker_tarball(tmp_path / "t.tar", layers, config=json.dumps(config).encode()))
    _assert_nothing_added(store)


@pytest.mark.parametrize(
    ("manifest", "config", "said"),
    [
        ([{"Config": "c.json"}], None, "field 'Layers' is missing, not a list"),
        ({"Config": "c.json"}, None, "is not a non-empty JSON list"),
        (None, {"rootfs": {"type": "layers", "diff_ids": []}}, "rootfs.diff_ids' has 0 entries"),
        (None, {"os": "windows"}, "field 'os' is 'windows'"),
        (None, {"architecture": "arm64"}, "field 'architecture' is 'arm64'"),
        (
            None,
            {"config": {"Env": "A=1"}, "rootfs": {"type": "layers", "diff_ids": ["x"]}},
            r"rootfs.diff_ids\[0\]' is 'x'",
        ),
    ],
)
def test_malformed_json_names_the_field(
    store: ImageStore, tmp_path: Path, manifest: object, config: object, said: str
) -> None:
    layers = [layer_tar([Entry("f", data=b"1")])]
    raw = json.dumps(config).encode() if config is not None else None
    with pytest.raises(ImageError, match=said):
        import_image(store, docker_tarball(tmp_path / "m.tar", layers, config=raw, manifest=manifest))
    _assert_nothing_added(store)


def test_config_field_of_the_wrong_type_is_named(store: ImageStore, tmp_path: Path) -> None:
    layers = [layer_tar([Entry("f", data=b"1")])]
    config = image_config(layers, Env="A=1")
    with pytest.raises(ImageError, match=r"field 'config\.Env' is not a list of strings"):
        import_image(store, oci_tarball(tmp_path / "e.tar", layers, config=config))


def test_an_unknown_ref_names_the_ref_and_the_fix(store: ImageStore) -> None:
    with pytest.raises(ImageError, match=r"no image 'nope:1' in the store .*`stockade image ls`") as info:
        store.get("nope:1")
    assert info.value.exit_code == 6


def test_not_an_archive(store: ImageStore, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ImageError, match="not a readable tar archive"):
        import_image(store, junk)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ImageError, match=r"neither manifest\.json .* nor index\.json"):
        import_image(store, empty)
