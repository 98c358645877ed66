"""`streamlearn timeline merge`: the per-rank trace files as one, so one viewer shows all ranks.

chrome://tracing and Perfetto open one file at a time; each rank writes its own (no shared
file across machines). Events keep their pid (= rank), so ranks stay separate rows. A file
from a run still going, or one that crashed, lacks its closing bracket: it is read anyway.
"""

from __future__ import annotations

import json
from pathlib import Path

from streamlearn.errors import StreamlearnError


def read_trace(path: str | Path) -> list[dict]:
    text = Path(path).read_text().strip()
    if text.startswith("{"):  # the object form: {"traceEvents": [...]}
        return list(json.loads(text).get("traceEvents", []))
    body = text.removeprefix("[").removesuffix("]").strip().rstrip(",")
    events = []
    for line in body.splitlines():  # one event per line, as Phases writes them
        line = line.strip().rstrip(",")
        if not line:
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # the half-written last event of a live or killed run
    return events


def merge(paths: list[str | Path], out: str | Path) -> int:
    """Writes {"traceEvents": [...]} with every file's events, sorted by time; returns the count."""
    if not paths:
        raise StreamlearnError("give the trace files to merge, e.g. `streamlearn timeline merge /tmp/tl.rank*.json`")
    events = []
    for path in paths:
        try:
            events.extend(read_trace(path))
        except OSError as e:
            raise StreamlearnError(f"cannot read trace {path}: {e.strerror}") from e
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))  # names first, then in time order
    Path(out).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return len(events)
