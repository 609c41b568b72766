#!/bin/bash
set -e
python3 - <<'PY'
import csv
totals = {}
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["amount"])
with open("totals.csv", "w") as out:
    out.write("region,total\n")
    for region in sorted(totals):
        out.write(f"{region},{totals[region]:.2f}\n")
PY
