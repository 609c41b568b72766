#!/bin/sh
# The hidden test: the agent must not see this file before grading.
ok=1
[ "$(cat /app/greeting.txt 2>/dev/null)" = "hello from a cell" ] || ok=0
[ "$(cat /app/count.txt 2>/dev/null | tr -d ' ')" = "$(wc -l < /etc/os-release | tr -d ' ')" ] || ok=0
mkdir -p /logs/verifier
echo "$ok" > /logs/verifier/reward.txt
echo "graded: $ok"
