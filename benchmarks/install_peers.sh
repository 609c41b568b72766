#!/usr/bin/env bash
# Installs the peers that benchmarks/cli_exec.py compares against, idempotently,
# into benchmarks/.peers (git-ignored): Codex's sandbox (@openai/codex) and
# Anthropic's sandbox-runtime (@anthropic-ai/sandbox-runtime, which needs
# bubblewrap, socat and ripgrep from Debian).
set -euo pipefail
cd "$(dirname "$0")"
need=()
for tool in bwrap socat rg; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  pkgs=()
  for tool in "${need[@]}"; do
    case "$tool" in bwrap) pkgs+=(bubblewrap) ;; rg) pkgs+=(ripgrep) ;; *) pkgs+=("$tool") ;; esac
  done
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
mkdir -p .peers
if [ ! -x .peers/node_modules/.bin/codex ] || [ ! -x .peers/node_modules/.bin/srt ]; then
  npm install --prefix .peers --no-audit --no-fund --loglevel=error @openai/codex @anthropic-ai/sandbox-runtime >/dev/null
fi
# Codex refuses to create its helper when CODEX_HOME is under /tmp; a symlink
# named codex-linux-sandbox to the native binary on PATH works (HOST.md).
native=$(find .peers/node_modules/@openai -type f -name codex -perm -u+x 2>/dev/null | grep -v '/bin/codex.js' | head -n 1 || true)
if [ -n "$native" ]; then
  mkdir -p .peers/bin
  ln -sf "$(realpath "$native")" .peers/bin/codex-linux-sandbox
  ln -sf "$(realpath "$native")" .peers/bin/codex-native
fi
echo "peers in $(pwd)/.peers"
