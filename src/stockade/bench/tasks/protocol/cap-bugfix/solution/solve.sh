#!/bin/bash
set -e
sed -i 's|text.split(" ")|text.split()|' wordcount.py
