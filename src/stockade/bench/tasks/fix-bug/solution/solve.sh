#!/bin/bash
set -e
sed -i 's|sum(xs) / (len(xs) - 1)|sum(xs) / len(xs)|' calc.py
