"""``stockade image``: build, import, ls, inspect, rm, prune (docs/IMAGES.md).

Thin: parses, calls ``stockade.image``, renders. Errors are ``ImageError``s
(exit 3 for a bad archive or Dockerfile, 6 for a ref or file not found, 1 for
a failed build step), which the application prints as one sentence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click

from stockade.exit_codes import ExitCode


def _state_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--state",
        "state",
        metavar="DIR",
        default=None,
        help="The state directory whose images/ store is used (default: $STOCKADE_STATE, /var/lib/stockade).",
    )(f)


def _store(state: str | None) -> Any:
    from stockade.image import default_store

    return default_store(state)


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


@click.group("image")
def image() -> None:
    """Images: a task's own system as a workbench cell's /, imported or built here.

    A content-addressed store under the state directory (images/), every image
    with a digest and a record of how it was made. No container engine and no
    registry: import a `docker save` tarball or an OCI layout, or build from a
    Dockerfile on a Debian base made with mmdebstrap.
    """


@image.command("build")
@click.option("-t", "--tag", "tag", metavar="NAME", default=None, help="Name the image (repo[:tag]).")
@click.option(
    "-f",
    "--file",
    "dockerfile",
    metavar="FILE",
    default=None,
    help="The Dockerfile (default CONTEXT/Dockerfile).",
)
@click.option("--build-arg", "build_args", metavar="K=V", multiple=True, help="A value for an ARG.")
@click.option(
    "--no-cache", is_flag=True, help="Run every step again, ignoring the step cache (the base stays cached)."
)
@click.option(
    "--allow",
    "allow",
    metavar="HOST",
    multiple=True,
    help="Another host RUN steps may reach through the gateway (beyond Debian's archive, PyPI, npm).",
)
@click.option("-q", "--quiet", is_flag=True, help="Print only the image's digest.")
@click.argument("context", type=click.Path(file_okay=False))
@_state_option
def build_cmd(
    tag: str | None,
    dockerfile: str | None,
    build_args: tuple[str, ...],
    no_cache: bool,
    allow: tuple[str, ...],
    quiet: bool,
    context: str,
    state: str | None,
) -> int:
    """Build an image from a Dockerfile in CONTEXT; each RUN in a build cell."""
    from stockade.image._build import build_image

    args: dict[str, str] = {}
    for item in build_args:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise click.UsageError(f"--build-arg {item!r} is not K=V; write e.g. --build-arg VERSION=1.2")
        args[key] = value
    began = time.monotonic()
    log = None if quiet else (lambda line: click.echo(line, err=True))
    img = build_image(
        _store(state), context, dockerfile=dockerfile, name=tag, build_args=args, extra_hosts=allow,
        no_cache=no_cache, log=log,
    )  # fmt: skip
    if quiet:
        click.echo(img.digest)
    else:
        steps = img.provenance.get("steps")
        cached = (
            sum(1 for s in steps if isinstance(s, dict) and s.get("cached")) if isinstance(steps, list) else 0
        )
        total = len(steps) if isinstance(steps, list) else 0
        fetches = img.provenance.get("fetches")
        note = (
            " (approximate base: see `stockade image inspect`)" if img.provenance.get("approximate") else ""
        )
        click.echo(
            f"built {img.digest} {' '.join(img.names)} in {time.monotonic() - began:.1f} s: {total} step(s), "
            f"{cached} cached, {len(fetches) if isinstance(fetches, list) else 0} URL(s) fetched{note}"
        )
    return ExitCode.OK


@image.command("import")
@click.argument("path", type=click.Path())
@click.option(
    "-t", "--tag", "tag", metavar="NAME", default=None, help="Name the image (default: the archive's names)."
)
@_state_option
def import_cmd(path: str, tag: str | None, state: str | None) -> int:
    """Import a `docker save` tarball or an OCI image layout (a directory or its tar)."""
    from stockade.image import import_image

    img = import_image(_store(state), path, name=tag)
    click.echo(f"imported {img.digest} {' '.join(img.names)}".rstrip())
    return ExitCode.OK


@image.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per image.")
@_state_option
def ls_cmd(as_json: bool, state: str | None) -> int:
    """List the images of the store."""
    store = _store(state)
    rows = []
    for img in store.list():
        meta = store.meta(img.digest)
        rows.append({
            "digest": img.digest,
            "names": list(img.names),
            "kind": img.provenance.get("kind"),
            "approximate": bool(img.provenance.get("approximate")),
            "size": meta.get("size"),
            "created": meta.get("created"),
        })  # fmt: skip
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return ExitCode.OK
    click.echo(f"{'DIGEST':14} {'NAMES':30} {'KIND':7} {'SIZE':>9}  CREATED")
    for row in sorted(rows, key=lambda r: -float(r["created"] or 0)):
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(row["created"] or 0)))
        names = ",".join(row["names"]) or "<none>"
        kind = f"{row['kind']}{'~' if row['approximate'] else ''}"
        click.echo(f"{str(row['digest'])[7:19]:14} {names:30} {kind:7} {_size(row['size']):>9}  {created}")
    return ExitCode.OK


@image.command("inspect")
@click.argument("ref")
@_state_option
def inspect_cmd(ref: str, state: str | None) -> int:
    """Print an image's digest, names, rootfs, config and record as JSON."""
    store = _store(state)
    img = store.get(ref)
    meta = store.meta(img.digest)
    click.echo(json.dumps({
        "digest": img.digest,
        "names": list(img.names),
        "rootfs": str(img.rootfs),
        "size": meta.get("size"),
        "created": meta.get("created"),
        "parent": meta.get("parent"),
        "config": img.config.to_json(),
        "provenance": dict(img.provenance),
    }, indent=2))  # fmt: skip
    return ExitCode.OK


@image.command("rm")
@click.argument("refs", nargs=-1, required=True)
@click.option("-f", "--force", is_flag=True, help="Remove an image by digest even while names point at it.")
@_state_option
def rm_cmd(refs: tuple[str, ...], force: bool, state: str | None) -> int:
    """Remove images (or names: a name goes, its image with it when no other name points there)."""
    store = _store(state)
    for ref in refs:
        digest, names, gone = store.rm(ref, force=force)
        for name in names:
            click.echo(f"untagged {name}")
        if gone:
            click.echo(f"deleted {digest}")
    return ExitCode.OK


@image.command("prune")
@click.option("-n", "--dry-run", is_flag=True, help="Say what would be removed, and remove nothing.")
@click.option("--all", "all_cache", is_flag=True, help="Remove the cached Debian bases too.")
@_state_option
def prune_cmd(dry_run: bool, all_cache: bool, state: str | None) -> int:
    """Remove unnamed images (not what a named one was built from, nor bases), stale cache, old work."""
    report = _store(state).prune(dry_run=dry_run, all_cache=all_cache)
    verb = "would remove" if dry_run else "removed"
    for digest in report.images:
        click.echo(f"{verb} image {digest}")
    for entry in report.cache_entries:
        click.echo(f"{verb} cache {entry}")
    for name in report.tmp:
        click.echo(f"{verb} tmp/{name}")
    click.echo(
        f"{verb} {len(report.images)} image(s), {len(report.cache_entries)} cache entr(ies), "
        f"{len(report.tmp)} abandoned work dir(s): {_size(report.bytes)}"
    )
    return ExitCode.OK


__all__ = ["image"]
