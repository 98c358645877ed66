"""Aimed faults: named places where a test makes a training worker die as a crash would.

A timer-driven kill lands wherever it happens to fall; exactly-once breaks in narrow places
(after a checkpoint is published but before offsets are committed, in the middle of a write).
`STREAMLEARN_FAULT=<point>[@rank<r>][#<n>]` on the driver arms one point: the n-th time rank r
(default: any rank, the first time) passes it, the worker SIGKILLs itself. The driver hands the
spec to its workers (the train loop's config), and the first kill leaves a mark in the run
directory, so the group Ray Train restarts runs past the point: one fault per spec and lineage.
Unset, every point costs a dictionary lookup.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from streamlearn.errors import ConfigError

ENV = "STREAMLEARN_FAULT"
POINTS = {
    "step": "after an optimizer step, mid-window",
    "before_checkpoint_write": "rank 0, a checkpoint queued, nothing of it on disk yet",
    "mid_checkpoint_write": "rank 0, model.pt written, the checksum file (its completion mark) not yet",
    "after_publish_before_commit": "rank 0, the checkpoint durable, the consumer-group offsets not committed",
    "before_dead_letter_flush": "every dead letter of the windows learned sent, none yet flushed",
}
_SPEC = re.compile(r"^(?P<point>[a-z_]+)(@rank(?P<rank>\d+))?(#(?P<nth>\d+))?$")

_armed: dict | None = None


def spec_from_env() -> str:
    """The driver's spec, checked here so a typo fails at start, not silently never fires."""
    spec = os.environ.get(ENV, "").strip()
    if spec:
        parse(spec)
    return spec


def parse(spec: str) -> dict:
    m = _SPEC.match(spec)
    if not m or m["point"] not in POINTS:
        raise ConfigError(f"{ENV}={spec!r}: expected <point>[@rank<r>][#<n>] with a point among "
                          f"{', '.join(sorted(POINTS))}")
    return {"point": m["point"], "rank": int(m["rank"]) if m["rank"] else None, "nth": int(m["nth"] or 1)}


def arm(spec: str, rank: int, run_dir: Path) -> None:
    """In a worker: arm the spec for this rank, unless it already fired in this lineage."""
    global _armed
    _armed = None
    if not spec:
        return
    fault = parse(spec)
    mark = run_dir / ".faults" / re.sub(r"[^a-z0-9_]", "-", spec)
    if (fault["rank"] is None or fault["rank"] == rank) and not mark.exists():
        _armed = {**fault, "mark": mark, "seen": 0}


def point(name: str) -> None:
    """A place where an armed fault kills this process."""
    if _armed is None or _armed["point"] != name:
        return
    _armed["seen"] += 1
    if _armed["seen"] == _armed["nth"]:
        _armed["mark"].parent.mkdir(parents=True, exist_ok=True)
        _armed["mark"].write_text(name)
        os.kill(os.getpid(), signal.SIGKILL)
