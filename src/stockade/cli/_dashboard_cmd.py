"""``stockade dashboard``: the daemon's web page, or a recorded run replayed (docs/DASHBOARD.md)."""

from __future__ import annotations

import webbrowser

import click

from stockade.errors import DaemonError


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
@click.option("--socket", "socket_path", metavar="PATH", default=None, help="The daemon's socket.")
@click.option("--state", "state", metavar="DIR", default=None, help="The daemon's state directory.")
def dashboard(
    open_browser: bool, replay: str | None, port: int, socket_path: str | None, state: str | None
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

        return serve_replay(source, port=port, ready=ready)

    from stockade.daemon import _paths
    from stockade.daemon._client import Client, RemoteError

    sock = _paths.socket_path(socket_path, state=_paths.state_dir(state))
    with Client(sock, timeout=30.0) as client:
        try:
            opened = client.call("dashboard.open", port=port)
        except RemoteError as exc:
            if exc.code == "unknown_method":
                raise DaemonError(
                    f"the daemon at {sock} serves no dashboard (it was started without one); "
                    "restart it with `stockade daemon`, or replay a record with --replay"
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


__all__ = ["dashboard"]
