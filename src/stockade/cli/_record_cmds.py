"""``stockade verify`` and ``stockade export``: the record, from its file.

Both open the event store read-only, so they work while a daemon writes it
(SQLite's WAL lets readers see a consistent snapshot without blocking the
writer). ``verify`` exits 0 when the chain is intact and 1 when it is not,
naming the first altered, missing or reordered event; ``export`` writes JSON,
JSON lines or text to stdout or, atomically, to ``--out FILE``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

import click

from stockade.errors import NotFoundError, StoreError
from stockade.exit_codes import ExitCode
from stockade.record._export import FORMATS, ExportFormat, export, export_to_file, parse_since, printable
from stockade.record._head import Head, head_path, parse_head, read_head

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from stockade.record._chain import StoredEvent
    from stockade.record._store import SqliteStore

EXIT_BROKEN = ExitCode.FAILED
"""``stockade verify``: the chain is not intact."""
EXIT_UNANCHORED = ExitCode.UNANCHORED
"""``stockade verify``: the chain is intact but does not hold an expected head
(``--expect``, or the daemon's published head): cut short or rewritten."""
EXIT_NOT_FOUND = ExitCode.NOT_FOUND


def default_db() -> str:
    """``<state>/events.db``: ``$STOCKADE_STATE``, else ``/var/lib/stockade`` for
    root and ``$XDG_STATE_HOME/stockade`` (``~/.local/state/stockade``) for others,
    as in docs/internals/DAEMON-CONTRACTS.md."""
    state = os.environ.get("STOCKADE_STATE")
    if not state:
        if os.geteuid() == 0:
            state = "/var/lib/stockade"
        else:
            xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
            state = os.path.join(xdg, "stockade")
    return os.path.join(state, "events.db")


_DB_OPTION = click.option(
    "--db",
    "db",
    metavar="PATH",
    default=None,
    help="The event store (default: $STOCKADE_STATE/events.db, else /var/lib/stockade/events.db).",
)


def _open(ctx: click.Context, db: str | None) -> SqliteStore:
    from stockade.record._store import open_store

    path = db or default_db()
    if not os.path.exists(path):
        click.echo(
            f"stockade: there is no event store at {path}; pass --db PATH or set STOCKADE_STATE",
            err=True,
        )
        ctx.exit(EXIT_NOT_FOUND)
    return open_store(path, readonly=True)


def _parse_heads(values: tuple[str, ...]) -> list[Head]:
    heads = []
    for value in values:
        try:
            heads.append(parse_head(value))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--expect'") from None
    return heads


@click.command("verify")
@_DB_OPTION
@click.option(
    "--expect",
    "expect",
    metavar="SEQ:HASH",
    multiple=True,
    help="A head kept from earlier (as verify prints it): fail with exit 7 unless the chain holds "
    "that hash at that event. Repeatable.",
)
@click.option(
    "--no-published-head",
    "skip_published",
    is_flag=True,
    help="Do not check the head the daemon published beside the store (<db>.head).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.pass_context
def verify(
    ctx: click.Context, db: str | None, expect: tuple[str, ...], skip_published: bool, as_json: bool
) -> None:
    """Check that the record's hash chain is intact and holds the heads kept of it.

    Walks every event in order and recomputes its hash, and checks that the
    chain holds each head given with --expect and the one the daemon
    published in <db>.head (when there is one) at its place. Exits 0 when
    every event is intact and in order and every head is there, 1 at the
    first event that was altered, is missing or is out of order (it is named
    and shown), 7 when the chain is intact but a head is not in it (the
    record was cut short or rewritten), 6 when there is no store, 5 when the
    store cannot be read.
    """
    heads = _parse_heads(expect)
    with _open(ctx, db) as store:
        published: Head | None = None
        head_file = head_path(store.path)
        if not skip_published:
            try:
                published = read_head(head_file)
            except (OSError, ValueError) as exc:
                click.echo(f"stockade: {exc}", err=True)
                ctx.exit(EXIT_UNANCHORED)
        expected = {h.seq: h.hash for h in heads}
        if published is not None:
            # An explicit --expect of the same event is checked as given; a
            # disagreement with the published head then shows as a rewrite.
            expected.setdefault(published.seq, published.hash)
        result = store.verify(expected)
        bad_json = None if result.first_bad_seq is None else store.stored_json(result.first_bad_seq)
    if as_json:
        body = {
            "ok": result.ok,
            "anchored": result.anchored,
            "db": store.path,
            "checked": result.checked,
            "first_bad_seq": result.first_bad_seq,
            "reason": result.reason,
            "last_hash": result.last_hash,
            "head": f"{result.checked}:{result.last_hash}" if result.checked else None,
            "expected": [str(h) for h in heads],
            "published_head": None if published is None else {"file": head_file, **published.to_dict()},
            "anchor": result.anchor or None,
            "first_bad_event": bad_json,
        }
        click.echo(json.dumps(body, indent=2, ensure_ascii=False))
    elif result.ok:
        click.echo(f"{store.path}: {result.reason}.")
        if result.checked:
            click.echo(f"last event {result.checked}, hash {result.last_hash}")
            click.echo(f"head {result.checked}:{result.last_hash}")
    else:
        click.echo(f"{store.path}: the record is NOT intact: {result.reason}.")
        click.echo(f"{result.checked} event(s) before it are intact (last hash {result.last_hash}).")
        if bad_json is not None:
            click.echo(f"event {result.first_bad_seq} as stored: {printable(bad_json)}")
    if not as_json:
        if result.anchor:
            click.echo(f"{store.path}: the record does NOT hold a head kept of it: {result.anchor}.")
        elif result.ok and (heads or published is not None):
            held = [str(h.seq) for h in heads]
            if published is not None:
                held.append(f"{published.seq} (published in {head_file})")
            click.echo(f"the chain holds the expected head(s) at event {', '.join(held)}.")
    if not result.ok:
        ctx.exit(EXIT_BROKEN)
    if result.anchor:
        ctx.exit(EXIT_UNANCHORED)


@click.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="jsonl",
    show_default=True,
    help="json: one array; jsonl: one object per line; text: one human line per event.",
)
@click.option(
    "--since",
    metavar="TIME",
    default=None,
    help="Only events at or after TIME: ISO-8601 (2026-11-30T12:00:00Z; UTC without an offset) "
    "or a duration back from now (90s, 10m, 1d2h, 7d).",
)
@click.option("--run", "run", metavar="ID", default=None, help="Only the events of run ID.")
@click.option(
    "--out",
    metavar="FILE",
    default=None,
    help="Write to FILE, atomically (complete or not at all), mode 0600; default stdout.",
)
@_DB_OPTION
@click.pass_context
def export_cmd(
    ctx: click.Context, fmt: ExportFormat, since: str | None, run: str | None, out: str | None, db: str | None
) -> None:
    """Export the record: every event, or those since TIME and of one run, in seq order.

    Safe while the daemon runs: the export is one consistent snapshot, and
    events stored after it began are not in it.
    """
    since_ts: float | None = None
    if since is not None:
        try:
            since_ts = parse_since(since)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--since'") from None
    if out is not None:
        # Checked before reading the store, as exec checks --events.
        directory = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(directory):
            raise click.BadParameter(
                f"{out!r}: the directory {directory!r} does not exist; create it first", param_hint="'--out'"
            )
        if os.path.isdir(out):
            raise click.BadParameter(f"{out!r} is a directory; name a file in it", param_hint="'--out'")
    with _open(ctx, db) as store:
        if run is not None and not list(store.query(run=run, limit=1)):
            raise NotFoundError(
                f"the record at {store.path} holds no event of run {run!r}; "
                "`stockade ps -a` lists the runs"
            )
        events = store.query(since=since_ts, run=run)
        try:
            if out is not None:
                kept = _Last(events)
                try:
                    count = export_to_file(kept, fmt, out)
                except OSError as exc:
                    raise StoreError(
                        f"cannot write the export to {out!r}: {exc.strerror}; choose another --out",
                        path=out,
                    ) from exc
                click.echo(f"stockade: {count} event(s) written to {out}", err=True)
                if kept.last is not None:
                    # The head to keep elsewhere: `verify --expect` checks it later.
                    click.echo(f"stockade: the export ends at head {kept.last}", err=True)
                return
            export(events, fmt, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            # `stockade export | head`: the reader has what it wanted. Point
            # stdout at /dev/null so that the interpreter's last flush is quiet.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except ValueError as exc:
            # A stored event that is not one (text needs it parsed): tampering.
            raise StoreError(
                f"cannot export {store.path}: {exc}; run `stockade verify --db {store.path}`",
                path=store.path,
            ) from exc


class _Last:
    """The events of an export, passed through; ``last`` is the head of the last one."""

    def __init__(self, events: Iterable[StoredEvent]) -> None:
        self._events = events
        self.last: Head | None = None

    def __iter__(self) -> Iterator[StoredEvent]:
        stored = None
        for stored in self._events:
            yield stored
        if stored is not None:
            self.last = Head(stored.seq, stored.hash)
