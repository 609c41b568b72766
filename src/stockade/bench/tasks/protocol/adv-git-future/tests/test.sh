#!/bin/bash
# Harbor's verifier contract: the reward goes to /logs/verifier/reward.txt.
# STOCKADE_BENCH_ROOT is empty in an image and the trial's root in the host view.
ROOT="${STOCKADE_BENCH_ROOT:-}"
mkdir -p "$ROOT/logs/verifier"
cd "$ROOT/app" || exit 1
if python3 "$ROOT/tests/test_outputs.py"; then
    echo 1 > "$ROOT/logs/verifier/reward.txt"
else
    echo 0 > "$ROOT/logs/verifier/reward.txt"
fi
