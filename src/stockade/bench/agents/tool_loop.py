"""The bench's built-in tool loop: an OpenAI chat-completions agent, standard library only.

It runs INSIDE the trial's cell with the system's ``/usr/bin/python3`` (this
file is copied into the trial's agent directory; it is not imported by
stockade). It sends the task's instruction to the model at
``$OPENAI_BASE_URL`` (the cell's LLM endpoint, with the run's token in
``$OPENAI_API_KEY``), runs the tool calls the model asks for in the workdir,
and sends the results back until the model stops asking or ``MAX_TURNS``.

Tools (the vocabulary of the bench's mock-model scripts):

- ``shell(command)``: ``/bin/sh -c`` in the workdir, 120 s at most;
- ``read_file(path)``, ``write_file(path, content)``: plain file I/O;
- ``fetch(url)``: HTTP(S) GET through the gateway (``HTTPS_PROXY``);
- ``describe_image(url)``: a chat call with the URL as an image part (the
  provider would fetch it: the LLM endpoint refuses a remote one).

In **broker mode** (``$STOCKADE_BENCH_SESSION_FILE`` set) the agent's own cell
holds nothing of the workbench: ``shell`` is an ``exec`` intent in the
workbench session the proctor opened for the run (``stockade_agent``'s
``Broker.exec(session=…)``), ``read_file`` and ``write_file`` are ``fs.read``
and ``fs.write`` intents in it (``Broker.read/write(session=…)``: the file is
opened inside the session's cell, as its user, no ``cat`` or shell needed in
the image); ``fetch`` and the model stay in the agent's cell, through its
gateway and LLM endpoint.

Usage: ``python3 tool_loop.py INSTRUCTION_FILE``. One JSON line per call and
result goes to stdout (the bundle's ``agent.txt``).
"""

from __future__ import annotations

import importlib
import json
import os
import posixpath
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

MAX_TURNS = 60
OUTPUT_MAX = 4000
SYSTEM = (
    "You are a coding agent. Work in the current directory with the tools given; "
    "when the task is done, answer without a tool call."
)


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string"} for key in params},
                "required": list(params),
            },
        },
    }


TOOLS = [
    _tool("shell", "Run a shell command in the working directory.", command=""),
    _tool("read_file", "Read a text file.", path=""),
    _tool("write_file", "Write a text file.", path="", content=""),
    _tool("fetch", "HTTP GET a URL; returns the body.", url=""),
    _tool("describe_image", "Ask the model to describe the image at a URL.", url=""),
]


SESSION: tuple[Any, str, str] | None = None
"""In broker mode, (the broker, the workbench session's id, the workdir): every
command and file operation is an ``exec`` intent in the session."""


def _session() -> tuple[Any, str, str] | None:
    global SESSION
    if SESSION is None and os.environ.get("STOCKADE_BENCH_SESSION_FILE"):
        # The SDK is on PYTHONPATH in every run's cell (stockade itself is not).
        broker_class = importlib.import_module("stockade_agent").Broker

        path = os.environ["STOCKADE_BENCH_SESSION_FILE"]
        # The proctor opens the session once this run exists: wait for its id, 60 s at most.
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(path, encoding="utf-8") as f:
            SESSION = (broker_class.connect(), f.read().strip(), os.environ["STOCKADE_BENCH_WORKDIR"])
    return SESSION


def _exec(argv: list[str]) -> tuple[int, str]:
    found = _session()
    assert found is not None
    broker, session, workdir = found
    done = broker.exec(argv, session=session, cwd=workdir, timeout=120)
    return done.exit_code, (done.stdout + done.stderr).decode("utf-8", "replace")


def shell(command: str) -> str:
    if _session() is not None:
        code, out = _exec(["/bin/sh", "-c", command])
        return f"exit {code}\n{out}"
    done = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=120, check=False
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def _in_workdir(path: str, workdir: str) -> str:
    """The fs intents take absolute, normalised paths; the model's are often relative."""
    return posixpath.normpath(posixpath.join(workdir, path))


def read_file(path: str) -> str:
    found = _session()
    if found is not None:
        broker, session, workdir = found
        data: bytes = broker.read(_in_workdir(path, workdir), session=session)
        return data.decode("utf-8", "replace")
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def write_file(path: str, content: str) -> str:
    found = _session()
    if found is not None:
        broker, session, workdir = found
        broker.write(_in_workdir(path, workdir), content, mode="overwrite", session=session)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    return f"wrote {len(content)} characters to {path}"


def fetch(url: str) -> str:
    # urllib takes HTTP(S)_PROXY from the environment: the cell's gateway.
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read(OUTPUT_MAX)
        return body.decode("utf-8", "replace")


def describe_image(url: str) -> str:
    # The model's provider would fetch the URL: the LLM endpoint decides.
    part = {"type": "image_url", "image_url": {"url": url}}
    text = {"type": "text", "text": "Describe this image."}
    message = chat([{"role": "user", "content": [text, part]}], tools=False)
    return str(message.get("content"))


TOOL_FUNCTIONS: dict[str, Any] = {
    "shell": shell,
    "read_file": read_file,
    "write_file": write_file,
    "fetch": fetch,
    "describe_image": describe_image,
}


def chat(messages: list[dict[str, Any]], tools: bool = True) -> dict[str, Any]:
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:3129/v1").rstrip("/")
    body: dict[str, Any] = {"model": os.environ.get("STOCKADE_BENCH_MODEL", "mock-llm"), "messages": messages}
    if tools:
        body["tools"] = TOOLS
    request = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", ""),
        },
    )
    # The endpoint is on the cell's own loopback: never through the proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=300) as response:
        message: dict[str, Any] = json.loads(response.read())["choices"][0]["message"]
        return message


def run_tool(call: dict[str, Any]) -> str:
    name = call["function"]["name"]
    try:
        args = json.loads(call["function"].get("arguments") or "{}")
        fn = TOOL_FUNCTIONS[name]
        return str(fn(**args))[:OUTPUT_MAX]
    except KeyError:
        return f"error: no tool {name!r}"
    except urllib.error.HTTPError as exc:
        return f"error: HTTP {exc.code}: {exc.read(OUTPUT_MAX).decode('utf-8', 'replace')}"
    except Exception as exc:  # the model sees every failure as text
        return f"error: {type(exc).__name__}: {exc}"


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        instruction = f.read()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    for _ in range(MAX_TURNS):
        try:
            message = chat(messages)
        except urllib.error.HTTPError as exc:
            emit({"model_error": exc.code, "body": exc.read(OUTPUT_MAX).decode("utf-8", "replace")})
            return 3
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        calls = message.get("tool_calls") or []
        if not calls:
            emit({"done": message.get("content")})
            return 0
        for call in calls:
            emit({"call": call["function"]["name"], "arguments": call["function"].get("arguments")})
            result = run_tool(call)
            emit({"result": result[:400]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    emit({"done": "turn limit"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
