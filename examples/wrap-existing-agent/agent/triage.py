"""Label each open issue as bug, feature or question, with a model.

An ordinary program, written before anyone thought of containing it: it reads
issues.json, asks an OpenAI-compatible chat API (OPENAI_BASE_URL, with the key
in OPENAI_API_KEY, as the OpenAI SDK does) for a label per issue, and writes
labels.json. Standard library only.
"""

import json
import os
import urllib.request

BASE_URL = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
API_KEY = os.environ["OPENAI_API_KEY"]
MODEL = os.environ.get("TRIAGE_MODEL", "gpt-4o-mini")


def ask(prompt):
    request = urllib.request.Request(
        BASE_URL.rstrip("/") + "/chat/completions",
        data=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}]}).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]["content"].strip().lower()


def main():
    with open("issues.json", encoding="utf-8") as f:
        issues = json.load(f)
    labels = {}
    for issue in issues:
        answer = ask(
            "Label this issue with one word: bug, feature or question.\n\n"
            f"Title: {issue['title']}\n\n{issue['body']}"
        )
        labels[str(issue["number"])] = answer if answer in ("bug", "feature", "question") else "question"
        print(f"#{issue['number']} {labels[str(issue['number'])]}: {issue['title']}")
    with open("labels.json", "w", encoding="utf-8") as f:
        json.dump(labels, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
