"""The quickstart's agent: does its job in its workspace, then tries two things it may not.

Standard library only. It reads notes.txt, writes summary.txt, and then tries
to read the host's password hashes and to plant a program in the host's
/usr/bin: the cell refuses both, and stockade records each refusal.
"""

import sys

with open("notes.txt", encoding="utf-8") as f:
    lines = f.read().splitlines()
words = sum(len(line.split()) for line in lines)
with open("summary.txt", "w", encoding="utf-8") as f:
    f.write(f"{lines[0]}: {len(lines)} lines, {words} words\n")
print(f"wrote summary.txt ({len(lines)} lines, {words} words)")


def read_shadow():
    with open("/etc/shadow") as f:
        return f.read()


def plant_program():
    with open("/usr/bin/update-helper", "w") as f:
        f.write("#!/bin/sh\n")


refused = 0
for what, attempt in [("read /etc/shadow", read_shadow), ("plant /usr/bin/update-helper", plant_program)]:
    try:
        attempt()
        print(f"{what}: it worked (it should not have)")
    except PermissionError as exc:
        refused += 1
        print(f"{what}: refused ({exc.strerror})")
sys.exit(0 if refused == 2 else 1)
