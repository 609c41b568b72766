"""The demo's agent: an OpenAI chat-completions tool loop, standard library only.

It runs INSIDE a stockade cell with the system's ``/usr/bin/python3``: it asks
the model at ``$OPENAI_BASE_URL`` (the cell's LLM endpoint) with the key in
``$OPENAI_API_KEY`` (the run's token, never a real key), runs the tool calls
the model asks for, and sends the results back, until the model stops asking
or ``MAX_TURNS`` is reached. Each tool is wrapped with the stockade SDK's
``@tool`` (``stockade_agent``, on ``PYTHONPATH`` in every run's cell), so the
record holds every tool call and links the intents made during it.

It prints one JSON line per tool call (``{"call": …}``) and per result
(``{"result": …}``), with the times they started and ended, so the demo can
pair each call with what the kernel recorded meanwhile.

The tools are the vocabulary of ``stockade mock-llm``'s scripts:

- ``shell(command)``: ``/bin/sh -c`` in the workspace; fails on a non-zero exit;
- ``read_file(path)``, ``write_file(path, content)``: plain file I/O (relative
  paths are in the workspace);
- ``fetch(url, method, headers, body)``: HTTP(S) through the gateway, as any
  program does (``HTTPS_PROXY``); ``$NAME`` in a header value is replaced by
  that environment variable, as a shell would;
- ``http_get(url)``: HTTP without the proxy, as a program that ignores
  ``HTTP_PROXY`` does: a direct TCP connection;
- ``intent(name, args)``: any intent of the broker (``fs.read``, ``exec``,
  ``ask``, ``http.fetch``…), through the SDK.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.sdk.stockade_agent import Broker, BrokerError, tool
else:  # in the cell: the SDK is on PYTHONPATH, stockade itself is not
    from stockade_agent import Broker, BrokerError, tool

MAX_TURNS = 80
OUTPUT_MAX = 2000
"""Characters of a tool's result sent back to the model."""
SYSTEM = (
    "You are a coding agent working in the current directory. Use the tools to do the task in "
    "task.md; notes.md has the team's notes. Be brief."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command in the workspace; its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file (relative to the workspace, or absolute).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file (relative to the workspace, or absolute).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fetch",
            "description": "HTTP(S) through the gateway; $NAME in a header value is that variable.",
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {"type": "string"},
                    "method": {"type": "string"},
                    "headers": {"type": "object"},
                    "body": {"type": "string"},
                },
                "required": ["url"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "http_get",
            "description": "A plain HTTP GET over a direct connection (no proxy).",
            "parameters": {
                "type": "object",
                "properties": {"url": {"type": "string"}},
                "required": ["url"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "intent",
            "description": "Ask the stockade broker for an intent: fs.read, fs.write, exec, ask, http.fetch.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "args": {"type": "object"}},
                "required": ["name", "args"],
            },
        },
    },
]


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- the tools


@tool
def shell(command: str) -> str:
    done = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise RuntimeError(f"exit code {done.returncode}: {output[-OUTPUT_MAX:]}")
    return output


@tool
def read_file(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(1 << 20)


@tool
def write_file(path: str, content: str) -> str:
    # No O_TRUNC before the write is allowed: a refused open changes nothing.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = content.encode("utf-8")
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return f"wrote {len(data)} bytes to {path}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@tool
def fetch(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: str | None = None
) -> str:
    expanded = {
        key: re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: os.environ.get(m.group(1), ""), str(value))
        for key, value in (headers or {}).items()
    }
    request = urllib.request.Request(
        url, data=body.encode() if body is not None else None, headers=expanded, method=method
    )
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=30) as response:
            return f"{response.status} {response.read(1 << 20).decode('utf-8', 'replace')}"
    except urllib.error.HTTPError as exc:
        text = exc.read(4096).decode("utf-8", "replace")
        raise RuntimeError(f"HTTP {exc.code}: {text.strip()}") from None


@tool
def http_get(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with socket.create_connection((parts.hostname, port), timeout=10) as sock:
        sock.sendall(f"GET {parts.path or '/'} HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
        return sock.recv(4096).decode("utf-8", "replace")


_BROKER: Broker | None = None


@tool
def intent(name: str, args: dict[str, Any]) -> str:
    global _BROKER
    if _BROKER is None:
        _BROKER = Broker.connect(timeout=60)
    value = _BROKER.intent(name, args)
    if "data" in value and isinstance(value["data"], str):
        value = dict(value, data=value["data"][:OUTPUT_MAX])
    return json.dumps(value)[:OUTPUT_MAX]


TOOL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "shell": shell,
    "read_file": read_file,
    "write_file": write_file,
    "fetch": fetch,
    "http_get": http_get,
    "intent": intent,
}


# --------------------------------------------------------------------------- the model


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:3129/v1").rstrip("/")
    body = {"model": os.environ.get("STOCKADE_DEMO_MODEL", "default"), "messages": messages, "tools": TOOLS}
    request = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", ""),
        },
    )
    # The LLM endpoint is on the cell's loopback: never through the proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=300) as response:
            message: dict[str, Any] = json.loads(response.read())["choices"][0]["message"]
            return message
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"the model refused the call: HTTP {exc.code} {exc.read(2000).decode()}") from None


def run_tool(call: dict[str, Any]) -> str:
    name = call["function"]["name"]
    try:
        arguments = json.loads(call["function"].get("arguments") or "{}")
    except ValueError:
        arguments = None
    started = time.time()
    emit({"call": call["id"], "tool": name, "arguments": arguments, "start": started})
    function = TOOL_FUNCTIONS.get(name)
    ok, error, output = False, "", ""
    if function is None or not isinstance(arguments, dict):
        error = f"no tool {name!r} with those arguments"
    else:
        try:
            output = str(function(**arguments))
            ok = True
        except BrokerError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    ended = time.time()
    emit({"result": call["id"], "tool": name, "ok": ok, "error": error[:OUTPUT_MAX],
          "output": output[:OUTPUT_MAX], "start": started, "end": ended})  # fmt: skip
    return output[:OUTPUT_MAX] if ok else "ERROR " + error[:OUTPUT_MAX]


def main() -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Do the task in task.md."},
    ]
    for _ in range(MAX_TURNS):
        message = chat(messages)
        calls = message.get("tool_calls") or []
        messages.append(
            {
                "role": "assistant",
                "content": message.get("content"),
                **({"tool_calls": calls} if calls else {}),
            }
        )
        if message.get("content"):
            emit({"say": message["content"]})
        if not calls:
            emit({"done": True})
            return 0
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool(call)})
    emit({"done": False, "why": "MAX_TURNS"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
