"""A small tool-calling agent: the model at $OPENAI_BASE_URL decides, the agent acts.

Standard library only, plus ``stockade_agent`` (the SDK, on the cell's
PYTHONPATH under the daemon). Four tools: read_file, write_file, shell (all in
the cell), and fetch (the broker's http.fetch intent). Each is wrapped with the
SDK's ``@tool``, so the record holds every call the model asked for. A tool
that fails tells the model why; it does not stop the loop.
"""

import json
import os
import subprocess
import sys
import urllib.request

from stockade_agent import Broker, BrokerError, tool

broker = Broker.connect()


@tool
def read_file(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@tool
def write_file(path, content):
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    return f"wrote {len(content)} characters to {path}"


@tool
def shell(command):
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:  # the last line says why (a traceback's last line: the error)
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"exit code {done.returncode}: {last[0]}")
    return done.stdout


@tool
def fetch(url):
    return broker.fetch(url).text


TOOLS = {"read_file": read_file, "write_file": write_file, "shell": shell, "fetch": fetch}
SCHEMAS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
        arg: {"type": "string"} for arg in args}, "required": list(args)}}}
    for name, args in [("read_file", ["path"]), ("write_file", ["path", "content"]),
                       ("shell", ["command"]), ("fetch", ["url"])]
]  # fmt: skip


def chat(messages):
    """One call to the cell's LLM endpoint (on the cell's loopback: no proxy)."""
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "mock-llm", "messages": messages, "tools": SCHEMAS}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"},
    )  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]


def main():
    messages = [{"role": "user", "content": "Do the task in task.md."}]
    for _ in range(30):
        message = chat(messages)
        messages.append(message)
        if not message.get("tool_calls"):
            print("model:", message.get("content"))
            return 0
        for call in message["tool_calls"]:
            name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
            try:
                result = str(TOOLS[name](**args))
                print(f"{name}({args}) -> ok")
            except (OSError, RuntimeError, BrokerError) as exc:
                result = f"error: {type(exc).__name__}: {exc}"
                print(f"{name}({args}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result[:4000]})
    return 1


if __name__ == "__main__":
    sys.exit(main())
