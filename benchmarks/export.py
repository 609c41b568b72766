"""The record: append throughput and latency, export and verify of a million events.

Run from the repository:  .venv/bin/python benchmarks/export.py [--events 1000000] [--dir DIR]

1. Fills a new store with --events realistic events (kernel denials, broker
   intents, gateway requests, cell lifecycle, across 200 runs), in batches of
   1,000 per append (one durable transaction each): append throughput.
2. Exports it all to a JSONL file (``export_to_file(store.query(), "jsonl", …)``,
   what ``stockade export --format jsonl --out FILE`` does), --rounds times:
   the target is at most 10 s for 1,000,000 events. Then once each: the same
   through the command in a new process, JSON, text, a ``--since 10m`` and a
   ``--run`` export, and ``verify``.
3. Durable appends into the full store: one event per append (what a daemon
   that acknowledges each intent after storing it pays), then batches of 10, 100
   and 1,000 per append (group commit): latency per call, events per second.

The store goes under --dir (default /var/tmp, the disk /var/lib/stockade is
on; not /tmp, which may be memory) and is removed afterwards unless --keep.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from stockade.record import Event, export_to_file, open_store
from stockade.record._store import SqliteStore

BASE_TIME = 1795959063.0
PATHS = ["/etc/passwd", "/etc/shadow", "/root/.ssh/id_ed25519", "/var/tmp", "/home/op/.aws/credentials"]
SYSCALLS = [("ptrace", 101), ("mount", 165), ("bpf", 321), ("keyctl", 250), ("unshare", 272)]
HOSTS = ["pypi.org", "files.pythonhosted.org", "api.openai.com", "evil.example.net", "169.254.169.254"]
INTENTS = ["fs.read", "fs.write", "fs.list", "exec", "ask"]


def realistic(i: int, rng: random.Random) -> Event:
    """One event like those the layers write, about 300-450 bytes of JSON."""
    run = f"r-{(i // 5000) % 200:012x}"
    cell = f"c-{(i // 500) % 4000:012x}"
    when = BASE_TIME + i * 0.01 + rng.random() * 0.005
    roll = rng.random()
    if roll < 0.40:
        path = rng.choice(PATHS)
        return Event(
            kind="cell.denied",
            cell=cell,
            layer="landlock",
            outcome="denied",
            time=when,
            run=run,
            summary=f"write to {path} refused by landlock (fs.write_file)",
            detail={
                "blockers": ["fs.write_file"],
                "domain": f"{0x13AB4CADA + i % 4000:x}",
                "path": path,
                "dev": "vda",
                "ino": rng.randrange(1, 10**7),
                "syscall": "openat",
                "nr": 257,
                "pid": rng.randrange(1000, 60000),
                "comm": "python",
                "exe": "/usr/bin/python3.11",
            },
        )
    if roll < 0.60:
        name, nr = rng.choice(SYSCALLS)
        return Event(
            kind="cell.denied",
            cell=cell,
            layer="seccomp",
            outcome="denied",
            time=when,
            run=run,
            summary=f"{name} refused by seccomp",
            detail={
                "syscall": name,
                "nr": nr,
                "arch": "x86_64",
                "action": "errno",
                "pid": rng.randrange(1000, 60000),
                "comm": "python",
                "exe": "/usr/bin/python3.11",
            },
        )
    if roll < 0.85:
        intent = rng.choice(INTENTS)
        allowed = rng.random() < 0.7
        return Event(
            kind="intent",
            cell=cell,
            layer="broker",
            outcome="allowed" if allowed else "denied",
            time=when,
            run=run,
            summary=f"{intent} {'allowed by rule read-src' if allowed else 'denied: no rule matches'}",
            detail={
                "intent": intent,
                "args": {"path": f"/workspace/src/module_{i % 97}.py", "token": "[redacted]"},
                "verdict": "allow" if allowed else "deny",
                "rule": "read-src" if allowed else None,
                "reason": "matched tools[2]" if allowed else "no rule matches; add one to tools",
            },
        )
    if roll < 0.97:
        host = rng.choice(HOSTS)
        ok = not host[0].isdigit() and "evil" not in host
        return Event(
            kind="gateway.request",
            cell=cell,
            layer="gateway",
            outcome="allowed" if ok else "denied",
            time=when,
            run=run,
            summary=f"GET https://{host}/simple/requests/ {'allowed' if ok else 'refused'}",
            detail={
                "method": "GET",
                "host": host,
                "port": 443,
                "url": f"https://{host}/simple/requests/",
                "status": 200 if ok else None,
                "bytes": rng.randrange(0, 10**6) if ok else 0,
            },
        )
    return Event(
        kind="cell.end",
        cell=cell,
        layer="cell",
        outcome="info",
        time=when,
        run=run,
        summary="exit 0 after 12.3 s",
        detail={
            "exit_code": 0,
            "duration": 12.3,
            "timed_out": False,
            "limits_hit": [],
            "memory_peak": 73400320,
        },
    )


def batches(total: int, size: int, rng: random.Random, start: int = 0) -> Iterator[list[Event]]:
    for first in range(start, start + total, size):
        yield [realistic(i, rng) for i in range(first, min(first + size, start + total))]


def fill(store: SqliteStore, total: int, rng: random.Random) -> tuple[float, float]:
    """Seconds spent in append, and in building the events."""
    in_append = building = 0.0
    t = time.perf_counter()
    for batch in batches(total, 1000, rng):
        u = time.perf_counter()
        building += u - t
        store.append(batch)
        t = time.perf_counter()
        in_append += t - u
    return in_append, building


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def count_lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the JSONL export")
    parser.add_argument("--single", type=int, default=2000, help="single-event appends to time")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    rng = random.Random(1)
    where = tempfile.mkdtemp(prefix="stockade-bench-", dir=args.dir)
    db = os.path.join(where, "events.db")
    out = os.path.join(where, "export")
    try:
        with open_store(db) as store:
            print(f"store: {db} (python {sys.version.split()[0]})")
            in_append, building = fill(store, args.events, rng)
            size = os.path.getsize(db) + os.path.getsize(db + "-wal")
            print(
                f"fill: {args.events:,} events in batches of 1,000: {in_append:.1f} s in append "
                f"({args.events / in_append:,.0f} events/s; building the events took {building:.1f} s); "
                f"store {size / 1e6:.0f} MB"
            )

            rounds = [
                timed(lambda: export_to_file(store.query(), "jsonl", out + ".jsonl"))
                for _ in range(args.rounds)
            ]
            lines = count_lines(out + ".jsonl")
            assert lines == args.events, lines
            median = statistics.median(rounds)
            print(
                f"export jsonl ({lines:,} lines, {os.path.getsize(out + '.jsonl') / 1e6:.0f} MB): "
                f"median {median:.2f} s over {len(rounds)} rounds "
                f"({', '.join(f'{r:.2f}' for r in rounds)}); {lines / median:,.0f} events/s"
            )
            command = [
                sys.executable,
                "-c",
                "from stockade.cli._record_cmds import export_cmd; export_cmd()",
                "--db",
                db,
                "--format",
                "jsonl",
                "--out",
                out + ".cli.jsonl",
            ]
            print(
                "export jsonl through the command, new process: "
                f"{timed(lambda: subprocess.run(command, check=True, capture_output=True)):.2f} s"
            )
            took = timed(lambda: export_to_file(store.query(), "json", out + ".json"))
            print(f"export json: {took:.2f} s")
            took = timed(lambda: export_to_file(store.query(), "text", out + ".text"))
            print(f"export text: {took:.2f} s")
            now = BASE_TIME + args.events * 0.01
            since = timed(lambda: export_to_file(store.query(since=now - 600), "jsonl", out + ".since"))
            count = count_lines(out + ".since")
            print(f"export --since 10m ({count:,} events): {since * 1000:.0f} ms")
            one_run = timed(lambda: export_to_file(store.query(run=f"r-{7:012x}"), "jsonl", out + ".run"))
            count = count_lines(out + ".run")
            print(f"export --run ({count:,} events): {one_run * 1000:.0f} ms")
            result = None

            def do_verify() -> None:
                nonlocal result
                result = store.verify()

            print(f"verify: {timed(do_verify):.2f} s ({result})")

            start = args.events
            for size in (1, 10, 100, 1000):
                calls = max(20, args.single // size) if size < 1000 else 50
                latencies = []
                for batch in batches(calls * size, size, rng, start):
                    t = time.perf_counter()
                    store.append(batch)
                    latencies.append(time.perf_counter() - t)
                start += calls * size
                total = sum(latencies)
                p50, p90, p99 = (percentile(latencies, p) * 1e6 for p in (50, 90, 99))
                print(
                    f"append, {size:>4} event(s) per call, {calls} calls: p50 {p50:,.0f} µs, "
                    f"p90 {p90:,.0f} µs, p99 {p99:,.0f} µs, max {max(latencies) * 1e6:,.0f} µs; "
                    f"{calls * size / total:,.0f} events/s"
                )
            fsync = []
            fd = os.open(os.path.join(where, "fsync"), os.O_WRONLY | os.O_CREAT, 0o600)
            for _ in range(500):
                os.write(fd, b"x" * 512)
                t = time.perf_counter()
                os.fdatasync(fd)
                fsync.append(time.perf_counter() - t)
            os.close(fd)
            print(
                f"for scale, fdatasync of 512 bytes on this disk: p50 {percentile(fsync, 50) * 1e6:,.0f} µs, "
                f"p99 {percentile(fsync, 99) * 1e6:,.0f} µs"
            )
    finally:
        if args.keep:
            print(f"kept {where}")
        else:
            shutil.rmtree(where)


if __name__ == "__main__":
    main()
