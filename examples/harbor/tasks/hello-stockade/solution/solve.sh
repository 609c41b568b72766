#!/bin/sh
set -e
cd /app
echo "hello from a cell" > greeting.txt
wc -l < /etc/os-release > count.txt
