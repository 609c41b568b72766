#!/bin/bash
# Harbor's verifier contract, with Harbor's absolute paths.
mkdir -p /logs/verifier
if [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
