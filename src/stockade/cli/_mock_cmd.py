"""``stockade mock-llm``: an offline, scripted model server (``stockade.llm.MockLlm``).

Thin: loads the script, binds the socket, serves until SIGINT or SIGTERM. The
line ``mock-llm listening on http://HOST:PORT/v1`` goes to stdout (flushed)
once the server accepts connections, so that a script or a test can start it
with ``--port 0`` and read where it is.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import TYPE_CHECKING

import click

from stockade.exit_codes import ExitCode

if TYPE_CHECKING:
    from stockade.llm import Script

EXIT_USAGE = ExitCode.USAGE


@click.command("mock-llm")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=0, show_default=True, type=click.IntRange(0, 65535), help="Port; 0 picks a free one."
)
@click.option(
    "--script",
    "script_spec",
    default="solver",
    show_default=True,
    help="A built-in script (solver, injected, solve-example) or a YAML script file.",
)
def mock_llm(host: str, port: int, script_spec: str) -> int:
    """Serve an offline OpenAI-compatible (and Anthropic) model with scripted answers.

    Answers /v1/models, /v1/chat/completions and /v1/messages. Point a
    policy's llm.base_url at the printed URL to run agents without a model.
    """
    from stockade.llm import load_script

    # A PolicyError (unknown script, bad script file) propagates: exit 3.
    script = load_script(script_spec)
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        raise click.UsageError(
            f"cannot listen on {host} port {port} ({exc.strerror}); choose another --port"
        ) from exc
    asyncio.run(_serve(sock, script))
    return 0


async def _serve(sock: socket.socket, script: Script) -> None:
    from stockade.llm import AppServer, MockLlm

    mock = MockLlm(script)
    server = AppServer(mock.app(), sock, grace=1)
    await server.start()
    host, port = server.address
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"mock-llm listening on http://{shown}:{port}/v1")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await server.close()
