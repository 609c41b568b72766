"""A real build: an mmdebstrap base, ``apt-get install`` and ``pip install``
in build cells through the gateway, every URL recorded, the cache on a rebuild.

The Debian base takes ~50 s to make; it is kept in a store that outlives the
test run (``$STOCKADE_TEST_IMAGES``, else /var/tmp/stockade-test-images), so
CI makes it once and later runs reuse it. The RUN steps start from a fresh
token each run, so they really run every time (~10 s).

The registries' names resolve here to 203.0.113.80, which the build policy
names (../shared/HOST.md, "Package registries from inside a cell").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from stockade.errors import ImageError
from stockade.image import ImageStore
from stockade.image._build import build_image

DOCKERFILE = """\
FROM python:3.11-slim
ARG TOKEN
ENV STOCKADE_TEST_TOKEN=$TOKEN
RUN apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir six==1.17.0 && echo $TOKEN > /etc/stockade-test-token
COPY hello.py /usr/local/bin/hello.py
CMD ["python3", "/usr/local/bin/hello.py"]
"""


@pytest.fixture(scope="module")
def store() -> ImageStore:
    if shutil.which("mmdebstrap") is None:
        pytest.fail("mmdebstrap is not installed: run scripts/setup.sh (apt-get install -y mmdebstrap)")
    root = Path(os.environ.get("STOCKADE_TEST_IMAGES", "/var/tmp/stockade-test-images"))
    return ImageStore(root)


def test_build_with_apt_and_pip_through_the_gateway(store: ImageStore, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "hello.py").write_text("import six\nprint('hello', six.__version__)\n")
    token = os.urandom(6).hex()
    name = f"stockade-test/real:{token}"
    lines: list[str] = []
    image = build_image(store, ctx, name=name, build_args={"TOKEN": token}, log=lines.append)
    try:
        root = image.rootfs
        assert (root / "usr/bin/tini").is_file()
        assert (root / "usr/local/lib/python3.11/dist-packages/six.py").is_file()
        assert (root / "usr/local/bin/hello.py").is_file()
        # A new name directly in /etc (as useradd's files, a package's conffile).
        assert (root / "etc/stockade-test-token").read_text() == token + "\n"
        # apt's lists were removed in the same step: they are in no layer.
        assert not any((root / "var/lib/apt/lists").glob("*Packages*"))
        prov = image.provenance
        assert prov["from"] == "python:3.11-slim" and prov["approximate"] is False
        steps = prov["steps"]
        assert isinstance(steps, list) and [s["cached"] for s in steps] == [False, False, False]
        fetches = prov["fetches"]
        assert isinstance(fetches, list)
        # The base's packages (from apt's lists), then each RUN's requests through the gateway.
        assert any(f.startswith("http://deb.debian.org/debian") and "/p/python3.11/" in f for f in fetches)
        assert any(f.startswith("GET http://deb.debian.org/debian/pool/main/t/tini/tini_") for f in fetches)
        assert "GET https://pypi.org/simple/six/" in fetches
        assert any(f.startswith("GET https://files.pythonhosted.org/") and "six-1.17.0" in f for f in fetches)
        assert image.config.cmd == ("python3", "/usr/local/bin/hello.py")
        assert f"STOCKADE_TEST_TOKEN={token}" in image.config.env
        # The base the build stood on is unchanged (its files are shared as hard links).
        base = store.get(str(steps[0]["digest"])).provenance.get("step")
        assert isinstance(base, dict)
        base_image = store.get(str(prov["base"]["digest"]))  # type: ignore[index]
        assert not (base_image.rootfs / "usr/bin/tini").exists()

        # The second build: every step from the cache, the same image.
        again = build_image(store, ctx, name=name, build_args={"TOKEN": token})
        assert again.digest == image.digest
        steps = again.provenance["steps"]
        assert isinstance(steps, list) and all(s["cached"] for s in steps)
        assert again.provenance["fetches"] == fetches
    finally:
        store.rm(name)
        store.prune()


def test_a_host_off_the_build_list_is_refused_and_the_step_fails(store: ImageStore, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    # example.com is on no allow list: the gateway refuses it before resolving the name.
    fetch = "import urllib.request; urllib.request.urlopen('http://example.com/x', timeout=20)"
    (ctx / "Dockerfile").write_text(f'FROM python:3.11-slim\nRUN python3 -c "{fetch}"\n')
    with pytest.raises(ImageError) as info:
        build_image(store, ctx)
    assert info.value.exit_code == 1
    assert info.value.location == f"{ctx}/Dockerfile:2"
    assert "failed with exit code 1" in str(info.value)
    assert "refused: GET http://example.com/x refused" in str(info.value)
    # The control: an allowed registry answers from the same kind of cell.
    ok = "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/six/', timeout=20).read(1)"
    (ctx / "Dockerfile").write_text(f'FROM python:3.11-slim\nARG T\nRUN python3 -c "{ok}" # $T\n')
    image = build_image(store, ctx, build_args={"T": os.urandom(4).hex()})
    assert "GET https://pypi.org/simple/six/" in image.provenance["fetches"]  # type: ignore[operator]
    store.prune()


def test_a_setuid_root_file_of_an_image_gives_nothing_in_a_cell(store: ImageStore, tmp_path: Path) -> None:
    from stockade.cell._cell import Cell
    from stockade.policy import default_policy

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy("/usr/bin/id", ctx / "id")
    (ctx / "Dockerfile").write_text(
        "FROM python:3.11-slim\nCOPY --chmod=4755 id /usr/local/bin/suid-id\nUSER 1000\n"
    )
    name = f"stockade-test/suid:{os.urandom(4).hex()}"
    image = build_image(store, ctx, name=name)
    try:
        st = os.stat(image.rootfs / "usr/local/bin/suid-id")
        assert st.st_uid == 0 and st.st_mode & 0o4000  # kept as the image has it
        result = Cell(default_policy(), image=image).run(["/usr/local/bin/suid-id"])
        assert result.exit_code == 0
        # nosuid and no_new_privs: the setuid bit raises nothing (no euid=0).
        assert result.stdout == b"uid=1000 gid=1000 groups=1000\n"
        # The control: the image's own user runs the same binary as itself.
        assert Cell(default_policy(), image=image).run(["/usr/bin/id", "-u"]).stdout == b"1000\n"
    finally:
        store.rm(name)
        store.prune()
