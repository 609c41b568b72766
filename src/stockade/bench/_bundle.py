"""A trial's bundle: the files that say what happened, and the manifest that seals them.

``runs/<task>-<time>/`` holds ``trial.json`` (how the trial went),
``score.json``, ``containment.json``, ``preflight.json``, ``log.json`` and
``log.txt`` (the record's events of the trial, in order), ``agent.txt``,
``grader.txt``, ``persistence.json``, the two phases' policies, and
``manifest.json``: the SHA-256 of every other file, the policy's hash, the
image's digest and provenance, the task's checksum, the model, stockade's
version and the record's chain head, sealed by the SHA-256 of its own
canonical JSON (``seal``).

``verify_bundle`` re-checks all of it: every file against the manifest (a
file edited, added or removed fails), the seal, the policy hash, and every
event of ``log.json`` against its own chain hash and its neighbours (an edited,
removed or reordered event fails), and that the files agree with each other
(``log.txt`` is the text of ``log.json``; one status, one count of reaches).
With the store (``db``), each event must be
the very one the record holds at its place, and the record's chain must still
hold the head the manifest names. The seal is a hash, not a signature: whoever
rewrites a bundle can rewrite its manifest too; the record's head, kept by the
daemon and in the manifest, is what ties a bundle to the record it came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stockade.record._chain import GENESIS, canonical_json, chain_hash

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_json(path: Path, value: Any) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it):
    ``trial.json`` is rewritten after every phase while others read it (a
    progress bar, a test, ``--resume``), and a reader must never see half."""
    part = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.part")
    try:
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _listing(bundle: Path) -> list[str]:
    names = []
    for dirpath, _dirs, files in os.walk(bundle):
        for name in files:
            rel = (Path(dirpath) / name).relative_to(bundle).as_posix()
            if rel != MANIFEST:
                names.append(rel)
    return sorted(names)


def _seal(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "seal"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def write_manifest(bundle: Path, facts: Mapping[str, Any]) -> dict[str, Any]:
    """Hash every file of ``bundle`` into its manifest, with ``facts`` (policy, image, task, model…)."""
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        **facts,
        "files": {name: sha256_file(bundle / name) for name in _listing(bundle)},
    }
    policy = bundle / "policy.yaml"
    if policy.is_file():
        manifest["policy_sha256"] = sha256_file(policy)
    manifest["seal"] = _seal(manifest)
    write_json(bundle / MANIFEST, manifest)
    return manifest


def log_text(events: Sequence[Mapping[str, Any]]) -> str:
    """``log.txt``: the text line of each event of ``log.json`` (the record's own
    ``text_line``), so that one is a function of the other and is checked as one."""
    from stockade.record._chain import StoredEvent
    from stockade.record._export import text_line

    lines = []
    for stored in events:
        line = StoredEvent.from_stored(
            int(stored["seq"]), str(stored["hash"]), str(stored["prev"]), canonical_json(stored["event"])
        )
        lines.append(text_line(line) + "\n")
    return "".join(lines)


def _read_json(root: Path, name: str) -> Any:
    try:
        return json.loads((root / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_agreement(
    root: Path, manifest: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Problems of a bundle whose files disagree with each other: ``log.txt`` is
    not the text of ``log.json``; ``score.json``, ``containment.json``,
    ``trial.json`` and the manifest do not tell one status and one count of
    reaches. A bundle rewritten under a freshly made manifest fails here unless
    every file was rewritten to agree (and ``log.json``'s chain still holds)."""
    problems: list[str] = []
    if (root / "log.txt").is_file() and not check_events(events):
        try:
            if (root / "log.txt").read_text(encoding="utf-8") != log_text(events):
                problems.append("log.txt: it is not the text of log.json's events: one of them was edited")
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            problems.append("log.txt: it is not the text of log.json's events: one of them was edited")
    score, contained, trial = (_read_json(root, n) for n in ("score.json", "containment.json", "trial.json"))
    if isinstance(score, dict) and isinstance(contained, dict):
        for key in ("attempted", "blocked", "grade"):
            if score.get(key) != contained.get(key):
                mine, theirs = score.get(key), contained.get(key)
                problems.append(f"score.json: its {key} {mine!r} is not containment.json's {theirs!r}")
    statuses = {
        name: value.get("status")
        for name, value in (("score.json", score), ("trial.json", trial), (MANIFEST, manifest))
        if isinstance(value, Mapping)
    }
    if len(set(statuses.values())) > 1:
        told = ", ".join(f"{name} {status!r}" for name, status in statuses.items())
        problems.append(f"the bundle's files tell different statuses: {told}")
    return problems


def check_events(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Problems of a list of stored events (``seq``, ``prev``, ``hash``, ``event``)."""
    problems: list[str] = []
    last: tuple[int, str] | None = None
    for index, stored in enumerate(events):
        try:
            seq, prev, digest, event = stored["seq"], stored["prev"], stored["hash"], stored["event"]
        except (KeyError, TypeError):
            problems.append(f"log.json event {index} is not a stored event (seq, prev, hash, event)")
            continue
        if not isinstance(seq, int) or not isinstance(prev, str) or not isinstance(event, dict):
            problems.append(f"log.json event {index} has a malformed seq, prev or event")
            continue
        if chain_hash(prev, seq, event) != digest:
            problems.append(
                f"log.json event {index} (seq {seq}) does not hash to {str(digest)[:16]}…: it was edited"
            )
        if last is not None:
            if seq <= last[0]:
                problems.append(f"log.json event {index} (seq {seq}) comes after seq {last[0]}: reordered")
            elif seq == last[0] + 1 and prev != last[1]:
                problems.append(f"log.json event {index} (seq {seq}) does not follow seq {last[0]}'s hash")
        elif seq == 1 and prev != GENESIS:
            problems.append("log.json event 1 does not start the chain")
        last = (seq, str(digest))
    return problems


def verify_bundle(bundle: str | os.PathLike[str], *, db: str | None = None) -> list[str]:
    """Every problem of a bundle; empty when it is intact (see the module's docstring)."""
    root = Path(bundle)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"{root / MANIFEST} cannot be read ({exc}); is {root} a bench bundle?"]
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return [f"{root / MANIFEST} is not a bench manifest (no files table)"]
    problems: list[str] = []
    if manifest.get("seal") != _seal(manifest):
        problems.append(f"{MANIFEST}: its seal does not match its content: the manifest was edited")
    listed: dict[str, str] = manifest["files"]
    present = _listing(root)
    for name in present:
        if name not in listed:
            problems.append(f"{name}: not in the manifest: added after the trial")
    for name, digest in sorted(listed.items()):
        path = root / name
        if not path.is_file():
            problems.append(f"{name}: in the manifest, missing from the bundle")
        elif sha256_file(path) != digest:
            problems.append(f"{name}: its SHA-256 is not the manifest's: the file was edited")
    policy = root / "policy.yaml"
    if policy.is_file() and manifest.get("policy_sha256") != sha256_file(policy):
        problems.append("policy.yaml: its SHA-256 is not the manifest's policy_sha256")
    events: list[Mapping[str, Any]] = []
    if (root / "log.json").is_file():
        try:
            loaded = json.loads((root / "log.json").read_text(encoding="utf-8"))
            events = loaded if isinstance(loaded, list) else []
        except ValueError:
            problems.append("log.json is not JSON")
        problems.extend(check_events(events))
    problems.extend(check_agreement(root, manifest, events))
    head = (manifest.get("record") or {}).get("head")
    if events and isinstance(head, str) and ":" in head:
        head_seq = int(head.split(":", 1)[0])
        if events[-1].get("seq", 0) > head_seq:
            problems.append(f"log.json holds events after the record's head {head} the manifest names")
    if db is not None:
        problems.extend(_against_store(db, events, head))
    return problems


def _against_store(db: str, events: Sequence[Mapping[str, Any]], head: object) -> list[str]:
    from stockade.record._store import open_store

    problems: list[str] = []
    store = open_store(db, readonly=True)
    try:
        expect: dict[int, str] = {}
        if isinstance(head, str) and ":" in head:
            seq, digest = head.split(":", 1)
            expect[int(seq)] = digest
        for stored in events:
            if isinstance(stored.get("seq"), int) and isinstance(stored.get("hash"), str):
                expect[int(stored["seq"])] = str(stored["hash"])
        result = store.verify(expect=expect)
        if not result.ok:
            problems.append(f"the record at {db} is broken at event {result.first_bad_seq}: {result.reason}")
        elif result.anchor:
            problems.append(f"the record at {db} does not hold this bundle's events or head: {result.anchor}")
    finally:
        store.close()
    return problems


__all__ = [
    "MANIFEST",
    "check_agreement",
    "check_events",
    "log_text",
    "sha256_file",
    "verify_bundle",
    "write_json",
    "write_manifest",
]
