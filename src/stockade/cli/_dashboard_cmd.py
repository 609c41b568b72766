"""``stockade dashboard``: the daemon's web page, or a recorded run replayed (docs/DASHBOARD.md)."""

from __future__ import annotations

import os
import webbrowser
from typing import Any

import click


@click.command("dashboard")
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser too.")
@click.option(
    "--replay",
    metavar="BUNDLE_OR_EXPORT",
    type=click.Path(exists=True),
    default=None,
    help="Serve a recorded run (an export, a bundle, a demo's run directory) without a daemon.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The loopback TCP port (0: a free one). A daemon already serving its dashboard keeps its own.",
)
@click.option(
    "--bench",
    "bench",
    metavar="DIR",
    multiple=True,
    type=click.Path(exists=True, file_okay=False),
    help="A bench campaign's directory (its results.json and trial bundles) for the bench pages; repeatable.",
)
@click.option("--socket", "socket_path", metavar="PATH", default=None, help="The daemon's socket.")
@click.option("--state", "state", metavar="DIR", default=None, help="The daemon's state directory.")
def dashboard(
    open_browser: bool,
    replay: str | None,
    port: int,
    bench: tuple[str, ...],
    socket_path: str | None,
    state: str | None,
) -> int:
    """Print the URL of the live dashboard, with the operator token it carries once.

    The daemon serves the page on 127.0.0.1 only; whoever can use its socket
    is an operator. With --replay, serve a recorded run here instead, in the
    foreground until Ctrl-C, with no daemon and no kernel feature.
    """
    if replay is not None:
        from stockade.dashboard import load_replay, serve_replay

        source = load_replay(replay)

        def ready(url: str) -> None:
            click.echo(f"stockade: REPLAY of {replay} (recorded, not live) at {url}")
            click.echo("stockade: the token in that URL is this page's; Ctrl-C stops it", err=True)
            if open_browser:
                webbrowser.open(url)

        return serve_replay(source, port=port, ready=ready, bench=[os.path.abspath(d) for d in bench])

    from stockade.daemon import _paths
    from stockade.daemon._client import Client, RemoteError

    sock = _paths.socket_path(socket_path, state=_paths.state_dir(state))
    with Client(sock, timeout=30.0) as client:
        try:
            opened = client.call("dashboard.open", port=port, bench=[os.path.abspath(d) for d in bench])
        except RemoteError as exc:
            if exc.code == "unknown_method":
                # Reachable, but without the dashboard: a daemon error (5), not "unreachable" (4).
                raise RemoteError(
                    f"the daemon at {sock} serves no dashboard (it was started without one); "
                    "restart it with `stockade daemon`, or replay a record with --replay",
                    code=exc.code,
                    method=exc.method,
                ) from exc
            raise
    url = str(opened["url"])
    click.echo(url)
    click.echo(
        f"stockade: the dashboard of the daemon at {sock}, for {opened.get('operator')}; "
        "the URL carries a token: do not share it",
        err=True,
    )
    if open_browser:
        webbrowser.open(url)
    return 0


def demo_hooks(open_browser: bool = False) -> dict[str, Any]:
    """``stockade demo --dashboard``: the hooks that attach the dashboard to the
    demo's in-process daemon (``run_agent_demo``'s ``on_daemon`` and
    ``before_stop``), wait for the operator to open it before the run starts,
    and keep it up once the run ended until they press Enter.

    The demo's daemon lives in the demo's network namespace, every thread of
    it: the page's socket is made here, in the host's, so a browser on this
    machine reaches it."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    opened: dict[str, str] = {}

    def on_daemon(thread: Any) -> None:
        from stockade.daemon._client import Client
        from stockade.dashboard import attach

        attach(thread.daemon, sock=sock)
        with Client(thread.socket_path, timeout=30.0) as client:
            opened["url"] = url = str(client.call("dashboard.open")["url"])
        click.echo(f"stockade: the demo's dashboard: {url}", err=True)
        if open_browser:
            webbrowser.open(url)
        click.prompt("Open it, then press Enter to start the run", default="", show_default=False, err=True)

    def before_stop(report: Any) -> None:
        run = report.setup.get("run", "")
        click.echo(
            f"stockade: the run ended; its debrief: {opened.get('url', '')}&page=/debrief/{run}", err=True
        )
        click.prompt(
            "Press Enter to stop the demo's daemon and its dashboard",
            default="",
            show_default=False,
            err=True,
        )

    return {"on_daemon": on_daemon, "before_stop": before_stop}


__all__ = ["dashboard", "demo_hooks"]
