"""Aimed faults: named places where a test makes a training worker die as a crash would.

A timer-driven kill lands wherever it happens to fall; exactly-once breaks in narrow places
(after a checkpoint is published but before offsets are committed, in the middle of a write).
`STREAMLEARN_FAULT=<point>[@rank<r>][#<n>]` on the driver arms one point: the n-th time rank r
(default: any rank, the first time) passes it, the worker SIGKILLs itself. Several specs, comma
separated, arm several points: one fault after another in one run (a hand-over whose old group
and new group both die). The driver hands the spec to its workers (the train loop's config, every
group of a run), rank 0 to the Ray Data read lanes it starts (`given`), and `streamlearn serve`
to its replicas (their runtime environment). Each kill
first creates a mark in the run directory, exclusively: one process fires a spec, and the group
Ray Train restarts (or the replica Serve starts) runs past the point: one fault per spec and
lineage. Unset, every point costs a truth test.
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
    "handover_stop_published": "rank 0 of a group stopping for a warm resize: its last checkpoint durable, "
                               "the waiting group not yet told to take over",
    "handover_go": "a warm group's worker, told to take over, before it restores the checkpoint",
    "serve_mid_swap": "a Serve replica with the next approved version loaded, before the moment every "
                      "replica switches to it",
    # Not a kill: the one place a fault drops data instead, as Ray Data twice lost a slice
    # between a read lane and the ranks (DECISIONS §1). The rank throws the slice away unseen.
    "ray_data_slice_lost": "a rank's Ray Data pump, a window slice received: dropped, never held",
    # Ray Data's read lane (a task of rank 0's Dataset), a slice yielded: its process dies, as a
    # lane's worker killed by the OOM killer or Ray's memory monitor would.
    "ray_data_lane_dies": "a Ray Data read lane, the n-th slice yielded: its process killed",
    # Not a kill either: a rank that falls behind its peers (a slow consumer, a large slice).
    "ray_data_rank_behind": "a rank's Ray Data pump, from the n-th slice on: each held back before it is queued",
}
_SPEC = re.compile(r"^(?P<point>[a-z_]+)(@rank(?P<rank>\d+))?(#(?P<nth>\d+))?$")

_armed: list[dict] = []
_given: tuple[str, Path] | None = None  # this process's spec and run directory, for the processes it starts


def spec_from_env() -> str:
    """The driver's spec, checked here so a typo fails at start, not silently never fires."""
    spec = os.environ.get(ENV, "").strip()
    parse(spec)
    return spec


def parse(spec: str) -> list[dict]:
    faults = []
    for one in filter(None, (s.strip() for s in spec.split(","))):
        m = _SPEC.match(one)
        if not m or m["point"] not in POINTS:
            raise ConfigError(f"{ENV}={spec!r}: expected <point>[@rank<r>][#<n>][,<another>...] with points among "
                              f"{', '.join(sorted(POINTS))}")
        faults.append({"spec": one, "point": m["point"], "rank": int(m["rank"]) if m["rank"] else None,
                       "nth": int(m["nth"] or 1)})
    return faults


def mark_of(run_dir: Path, spec: str) -> Path:
    """The file a fired spec leaves in the run directory (tests look for it)."""
    return run_dir / ".faults" / re.sub(r"[^a-z0-9_]", "-", spec)


def arm(spec: str, rank: int | None, run_dir: Path) -> None:
    """In a worker (rank None: a process with no rank, a Serve replica): arm each spec meant for
    it, unless it already fired in this lineage."""
    global _given
    _given = (spec, run_dir) if spec else None
    _armed[:] = [{**fault, "mark": mark_of(run_dir, fault["spec"]), "seen": 0} for fault in parse(spec)
                 if fault["rank"] in (None, rank) and not mark_of(run_dir, fault["spec"]).exists()]


def given() -> tuple[str, Path] | None:
    """The spec and run directory this process was armed with (None: none), for a Ray Data
    read lane it starts: `arm(*given, None)` there arms the specs meant for no rank in particular."""
    return _given


def point(name: str) -> None:
    """A place where an armed fault kills this process."""
    if _fires(name):
        os.kill(os.getpid(), signal.SIGKILL)


def drops(name: str) -> bool:
    """A place where an armed fault loses what passes (True: drop it)."""
    return _fires(name)


def delays(name: str) -> bool:
    """A place where an armed fault slows what passes (True: hold it back), from the n-th
    passage on in the process that fired it: a rank that falls behind stays behind."""
    return _fires(name) or any(fault["point"] == name and fault.get("fired_here") for fault in _armed)


def _fires(name: str) -> bool:
    if not _armed:
        return False
    for fault in _armed:
        if fault["point"] != name or fault.get("spent"):
            continue
        fault["seen"] += 1
        if fault["seen"] == fault["nth"]:
            fault["mark"].parent.mkdir(parents=True, exist_ok=True)
            fault["spent"] = True
            try:
                with open(fault["mark"], "x") as mark:
                    mark.write(f"{name} pid {os.getpid()}")
            except FileExistsError:  # another process fired it first: once per lineage
                continue
            fault["fired_here"] = True
            return True
    return False
