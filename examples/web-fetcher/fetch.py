"""Fetch each URL (from the command line, else urls.txt) into pages/, with urllib.

Standard library only, and nothing stockade-specific: urllib goes through
$HTTPS_PROXY, which in a cell is the gateway, and trusts the certificates the
cell trusts. Prints one line per URL; exits 1 if any could not be fetched.
"""

import os
import sys
import urllib.error
import urllib.parse
import urllib.request

if len(sys.argv) > 1:
    urls = sys.argv[1:]
else:
    with open("urls.txt") as f:
        urls = [line.strip() for line in f if line.strip()]
os.makedirs("pages", exist_ok=True)
failed = 0
for url in urls:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:  # the gateway's refusal, when it could read the request
        failed += 1
        print(f"REFUSED {url}: {exc.code} {exc.read().decode('utf-8', 'replace').strip()}")
        continue
    except urllib.error.URLError as exc:  # a tunnel the gateway refused to open, or no answer
        failed += 1
        print(f"FAILED  {url}: {exc.reason}")
        continue
    parts = urllib.parse.urlsplit(url)
    name = (parts.hostname + parts.path).rstrip("/").replace("/", "_") + ".html"
    with open(os.path.join("pages", name), "wb") as f:
        f.write(body)
    print(f"OK      {url}: {len(body)} bytes -> pages/{name}")
sys.exit(1 if failed else 0)
