#!/usr/bin/env bash
# Installs everything stockade needs on a fresh Debian 12 machine, idempotently:
# the system packages (bubblewrap for the side-by-side benchmarks and the doctor's
# comparisons), a virtualenv at .venv, and the package with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
# One line per step, so that a minute of installing says what it is doing.
step() { echo "setup: $*" >&2; }
# pip and setuptools talk a lot (index warnings, build-backend notices): keep
# what they say, and show it only when the step fails.
quietly() {
  local log rc=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then cat "$log" >&2; fi
  rm -f "$log"
  return "$rc"
}
# pip's "running as root" and "new version" notices are not ours to show.
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# curl: the gateway's tests and examples use it inside cells, as agents do.
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
# chromium: the dashboard's tests drive Debian's browser headless (Playwright,
# with executable_path: no browser download).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# mmdebstrap: `stockade image build` makes its Debian bases with it (docs/IMAGES.md).
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing system packages: ${need_apt[*]}; run 'sudo apt-get install -y ${need_apt[*]}' and try again" >&2
    exit 1
  fi
  step "installing system packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The real interpreter, never a shim (a pyenv shim costs ~70 ms per start).
py=$(command -v python3)
if command -v pyenv >/dev/null 2>&1; then py=$(pyenv which python3 2>/dev/null || echo "$py"); fi
if [ ! -x .venv/bin/python ]; then
  step "making the virtualenv .venv"
  "$py" -m venv .venv
fi
stamp=.venv/.stockade-installed
# The install also compiles the C extensions (setup.py): redo it when one of
# their sources (a .c or an included .h) changed, or an extension is missing
# (e.g. a checkout from before it existed).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
  || [ -n "$(find src/stockade -name '*.[ch]' -newer "$stamp" 2>/dev/null)" ] \
  || ! .venv/bin/python -c "import stockade.cell._native" 2>/dev/null; then
  step "upgrading pip in .venv"
  quietly .venv/bin/python -m pip install -q --upgrade pip
  step "installing stockade and its test extras into .venv (compiles the C extension; about a minute)"
  quietly .venv/bin/python -m pip install -q -e '.[test]' || true
  .venv/bin/python -c "import stockade, stockade.cell._native, pydantic, yaml, click, rich, pytest, hypothesis, h11, httpx, starlette, uvicorn, cryptography, dns" \
    || { echo "setup: installing the package failed (the C extension needs gcc and the Python headers)" >&2; exit 1; }
  touch "$stamp"
fi
# Byte-compile the package: this machine sets PYTHONDONTWRITEBYTECODE, so
# without this every `stockade exec` would compile its modules again (~40 ms).
# Quick when nothing changed.
step "byte-compiling src/"
# (not the shipped bench tasks: their files are data, copied into workbenches)
.venv/bin/python -m compileall -q -x "/bench/tasks/" src >/dev/null

# Harbor (integrations/harbor) needs Python >= 3.12, and Debian 12 has 3.11:
# machines of this kind carry pyenv's 3.12, so look for a real 3.12 interpreter
# (never a shim) and build .venv-harbor with harbor, stockade and the
# environment package. Without one, say how to get it and go on: the Harbor
# tests then skip, naming the missing interpreter.
py312=""
for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
  /usr/local/bin/python3.12 /usr/bin/python3.12; do
  if [ -x "$c" ] && "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then py312=$c; break; fi
done
if [ -z "$py312" ]; then
  echo "setup: no Python 3.12 found for Harbor (integrations/harbor); install one (e.g. 'pyenv install 3.12') and run setup again" >&2
else
  hstamp=.venv-harbor/.stockade-installed
  if [ ! -x .venv-harbor/bin/python ]; then step "making .venv-harbor with $py312"; "$py312" -m venv .venv-harbor; fi
  if [ ! -f "$hstamp" ] || [ integrations/harbor/pyproject.toml -nt "$hstamp" ] || [ pyproject.toml -nt "$hstamp" ] \
    || [ -n "$(find src/stockade -name '*.[ch]' -newer "$hstamp" 2>/dev/null)" ] \
    || ! .venv-harbor/bin/python -c "import harbor, stockade.cell._native, stockade_harbor" 2>/dev/null; then
    step "installing Harbor and stockade into .venv-harbor"
    quietly .venv-harbor/bin/python -m pip install -q 'harbor==0.25.0' -e . -e integrations/harbor || true
    .venv-harbor/bin/python -c "import harbor, stockade.cell._native, stockade_harbor" \
      || { echo "setup: installing Harbor into .venv-harbor failed" >&2; exit 1; }
    touch "$hstamp"
  fi
fi
step "done: run the tests with the README's command"
