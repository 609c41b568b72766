"""A tool loop written against the OpenAI Python SDK, whose tools ask stockade's broker.

It runs in a cell under the daemon with ``/usr/bin/python3``. With the
``openai`` package installed it uses ``openai.OpenAI()``, which reads
``$OPENAI_BASE_URL`` and ``$OPENAI_API_KEY`` (in the cell: the LLM endpoint and
the run's token). Without it, ``MiniOpenAI`` below stands in: the same calls
and the same shapes, in the standard library, so the loop reads the same
either way.

Every call the model asks for is recorded with the model's own call id
(``broker.tool_call``), and a denial goes back to the model as text, so it
can change course: each repeat would count toward the run's tripwire.
"""

import json
import os
import sys
import urllib.request
from types import SimpleNamespace

from stockade_agent import Broker, BrokerError, Denied, RunHalted

try:
    from openai import OpenAI
except ImportError:
    OpenAI = None


class MiniOpenAI:
    """``client.chat.completions.create(...)`` over urllib; answers as attribute objects."""

    def __init__(self):
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **body):
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                     "Content-Type": "application/json"},
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the endpoint is on loopback
        with opener.open(request, timeout=120) as response:
            return json.load(response, object_hook=lambda d: SimpleNamespace(**d))


broker = Broker.connect()
client = OpenAI() if OpenAI is not None else MiniOpenAI()


def list_docs(path):
    return " ".join(entry.name for entry in broker.list(path))


def read_doc(path):
    return broker.read(path).decode("utf-8", "replace")


def write_summary(content):
    with open("summary.md", "w", encoding="utf-8") as f:
        f.write(content)
    return f"wrote {len(content)} characters to summary.md"


TOOLS = {f.__name__: f for f in (list_docs, read_doc, write_summary)}
SCHEMAS = [
    {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}
    for name, arg, description in [
        ("list_docs", "path", "The names of the files in a directory (an absolute path)."),
        ("read_doc", "path", "A document's text (an absolute path)."),
        ("write_summary", "content", "Write summary.md."),
    ]
]  # fmt: skip


def main():
    print("client:", "openai" if OpenAI is not None else "MiniOpenAI (the openai package is not installed)")
    task = "Which licenses in /usr/share/common-licenses are permissive? Write summary.md."
    messages = [{"role": "user", "content": task}]
    for _ in range(20):
        reply = client.chat.completions.create(model="mock-llm", messages=messages, tools=SCHEMAS)
        message = reply.choices[0].message
        calls = getattr(message, "tool_calls", None) or []
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name,
             "arguments": c.function.arguments}} for c in calls]} if calls else
            {"role": "assistant", "content": message.content})  # fmt: skip
        if not calls:
            print("model:", message.content)
            return 0
        for call in calls:
            args = json.loads(call.function.arguments or "{}")
            # The model's own call id goes into the record with the call.
            with broker.tool_call(call.function.name, args, call_id=call.id) as recorded:
                try:
                    output = str(TOOLS[call.function.name](**args))
                except Denied as exc:
                    output = f"denied by the policy: {exc.reason}"  # tell the model; do not retry
                except RunHalted:
                    raise  # the run is over: every further intent is refused
                except (BrokerError, OSError) as exc:
                    output = f"failed: {exc}"
                recorded.result = output
            shown = output if len(output) < 200 else f"{len(output)} characters"
            print(f"{call.function.name}({json.dumps(args)}) -> {shown.strip()}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return 1


if __name__ == "__main__":
    sys.exit(main())
