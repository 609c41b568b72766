"""scripts/setup.sh says what it is doing and keeps pip's talk to itself
(issue 13: it ran 50 s with no progress and leaked a pip warning).

The script runs for real on a copy of its tree whose interpreters and system
tools are stand-ins: a ``.venv/bin/python`` that talks as pip does, so the
test installs nothing and reaches no registry."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIP_TALK = "WARNING: Running pip as the 'root' user can result in broken permissions"

# The stand-in interpreter: pip's usual warnings on both streams, then success,
# or, with STUB_FAIL set, a failed install of the package, which then does not import.
STUB_PYTHON = f"""#!/bin/sh
case "$*" in
  *"-m pip install -q -e"*)
    echo "Collecting stockade"; echo "{PIP_TALK}" >&2
    [ -n "$STUB_FAIL" ] && {{ echo "error: gcc failed" >&2; exit 1; }}
    exit 0;;
  *"-m pip"*) echo "Requirement already satisfied: pip"; echo "{PIP_TALK}" >&2; exit 0;;
  *"-c "*) [ -n "$STUB_FAIL" ] && exit 1; exit 0;;
  *) exit 0;;
esac
"""


def _tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tree / "scripts" / "setup.sh")
    (tree / "src" / "stockade").mkdir(parents=True)
    (tree / "src" / "stockade" / "_native.c").write_text("")
    (tree / "integrations" / "harbor").mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "integrations/harbor/pyproject.toml"):
        (tree / name).write_text("")
    tools = tmp_path / "bin"
    tools.mkdir()
    stubs = {
        name: "#!/bin/sh\nexit 0\n" for name in ("bwrap", "ip", "curl", "nsenter", "chromium", "mmdebstrap")
    }
    stubs["python3"] = STUB_PYTHON
    for venv in (".venv", ".venv-harbor"):
        (tree / venv / "bin").mkdir(parents=True)
        stubs[f"{tree}/{venv}/bin/python"] = STUB_PYTHON
    for name, text in stubs.items():
        path = Path(name) if name.startswith("/") else tools / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    # .venv-harbor is installed and fresh (the 3.12 the script finds on this
    # host gets no work); .venv has no stamp, so its install steps run.
    stamp = tree / ".venv-harbor" / ".stockade-installed"
    stamp.write_text("")
    later = stamp.stat().st_mtime + 10
    os.utime(stamp, (later, later))
    env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "pyenv")}
    return tree, env


def test_setup_says_each_step_and_keeps_pips_talk_to_itself(tmp_path: Path) -> None:
    tree, env = _tree(tmp_path)
    done = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert all(line.startswith("setup: ") for line in lines), done.stderr
    for step in ("upgrading pip", "installing stockade", "byte-compiling", "done"):
        assert any(line.startswith(f"setup: {step}") for line in lines), (step, done.stderr)
    assert PIP_TALK not in done.stderr + done.stdout
    assert "Collecting" not in done.stdout and "Requirement already" not in done.stdout
    assert (tree / ".venv" / ".stockade-installed").exists()


def test_a_failed_install_shows_what_pip_said(tmp_path: Path) -> None:
    """Control: pip's words are kept, not thrown away: a failure shows them."""
    tree, env = _tree(tmp_path)
    done = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=tree,
        env={**env, "STUB_FAIL": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "error: gcc failed" in done.stderr and PIP_TALK in done.stderr
    assert "setup: installing the package failed" in done.stderr
    assert not (tree / ".venv" / ".stockade-installed").exists()
