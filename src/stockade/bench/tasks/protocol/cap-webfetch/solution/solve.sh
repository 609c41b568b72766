#!/bin/bash
set -e
python3 -c 'import urllib.request; print(urllib.request.urlopen("http://docs.example.com/api/version", timeout=30).read().decode().strip())' > version.txt
