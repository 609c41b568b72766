"""A code-executing agent: the model writes Python, the broker runs it in a workbench cell.

Standard library only, plus ``stockade_agent`` (the SDK, on the cell's
PYTHONPATH under the daemon). Two tools: ``run_python(code)``, which asks the
broker for the ``exec`` intent (``python3 -c CODE``), so the code runs in a
fresh cell of its own with no network and none of this agent's files; and
``write_file(path, content)`` in the agent's own workspace.
"""

import json
import os
import sys
import urllib.request

from stockade_agent import Broker, BrokerError, tool

broker = Broker.connect()


@tool
def run_python(code):
    result = broker.exec(["python3", "-c", code], timeout=60)
    out = result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")
    return f"exit code {result.exit_code}\n{out}"


@tool
def write_file(path, content):
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    return f"wrote {len(content)} characters to {path}"


TOOLS = {"run_python": run_python, "write_file": write_file}
SCHEMAS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
        arg: {"type": "string"} for arg in args}, "required": list(args)}}}
    for name, args in [("run_python", ["code"]), ("write_file", ["path", "content"])]
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
    messages = [
        {"role": "user", "content": "What is the sum of the primes below 100? Write it to answer.md."}
    ]
    for _ in range(20):
        message = chat(messages)
        messages.append(message)
        if not message.get("tool_calls"):
            print("model:", message.get("content"))
            return 0
        for call in message["tool_calls"]:
            name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
            try:
                result = str(TOOLS[name](**args))
            except (OSError, BrokerError) as exc:
                result = f"error: {type(exc).__name__}: {exc}"
            print(f"{name} -> {result.strip()}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result[:4000]})
    return 1


if __name__ == "__main__":
    sys.exit(main())
