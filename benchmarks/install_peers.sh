#!/usr/bin/env bash
# Installs the peers that benchmarks/cli_exec.py compares against, idempotently,
# into a scratch directory outside the repository ($STOCKADE_PEERS, default
# /var/tmp/stockade-peers): Codex's sandbox (@openai/codex) and Anthropic's
# sandbox-runtime (@anthropic-ai/sandbox-runtime, which needs bubblewrap,
# socat and ripgrep from Debian).
set -euo pipefail
peers="${STOCKADE_PEERS:-/var/tmp/stockade-peers}"
mkdir -p "$peers"
cd "$peers"
need=()
for tool in bwrap socat rg; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  pkgs=()
  for tool in "${need[@]}"; do
    case "$tool" in bwrap) pkgs+=(bubblewrap) ;; rg) pkgs+=(ripgrep) ;; *) pkgs+=("$tool") ;; esac
  done
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
if [ ! -x node_modules/.bin/codex ] || [ ! -x node_modules/.bin/srt ]; then
  npm install --prefix . --no-audit --no-fund --loglevel=error @openai/codex @anthropic-ai/sandbox-runtime >/dev/null
fi
# Codex refuses to create its helper when CODEX_HOME is under /tmp; a symlink
# named codex-linux-sandbox to the native binary on PATH works (HOST.md).
native=$(find node_modules/@openai -type f -name codex -perm -u+x 2>/dev/null | grep -v '/bin/codex.js' | head -n 1 || true)
if [ -n "$native" ]; then
  mkdir -p bin
  ln -sf "$(realpath "$native")" bin/codex-linux-sandbox
  ln -sf "$(realpath "$native")" bin/codex-native
fi
echo "peers in $peers"
