"""What a lineage records beside its checkpoints for serving: one quality-gate decision per
version, and the pin an operator sets to roll back.

Both live in the run directory, below the trainer and the scorer, because both read them: every
scoring replica follows the decisions and the pin (serve/model_store.py), and the trainer's
checkpoint retention keeps what they name (`held_versions`), whatever its age.

A decision is created by hard-linking a finished temp file to its final name: the link is atomic
and fails if another replica got there first, so a version has one decision and nobody reads half
of one. An approval also announces its moment (`serve_at`, a swap delay after the record is
written): every replica loads the version before then and switches at that moment.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from streamlearn.errors import CheckpointError
from streamlearn.logs import log
from streamlearn.rundir import checkpoint

PIN_FILE = "PINNED"
DECISIONS_DIR = "decisions"
# An approval's moment is at most this share of the swap delay older than its link, so a replica
# that read the ledger just before the link still has the rest of the delay to see it
# (ModelStore.serving polls on the request path when its poller is that late).
STAMP_SLACK = 0.25


@dataclass(frozen=True)
class Decision:
    version: int
    approved: bool
    kind: str | None  # why refused: integrity | pipeline | quality | weights
    reason: str | None
    metric: float | None  # the candidate's online headline metric (its own window: shown, not compared)
    compared_with: int | None  # the approved version it was judged against
    decided_at: float
    serve_at: float  # approved: the wall-clock moment every replica switches to it
    by: str  # host:pid of the replica that decided
    signature: int | None  # SHA256SUMS mtime of the judged checkpoint: a rewrite is judged again
    evidence: dict[str, Any] | None = None  # the paired comparison with the served version (paired.Comparison)

    @property
    def at(self) -> float:
        return self.decided_at

    def describe(self) -> dict[str, Any]:
        return asdict(self)


class Ledger:
    """The decisions of one lineage, one small JSON file per version."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir) / DECISIONS_DIR

    def read(self, version: int) -> Decision | None:
        try:
            data = json.loads(self._path(version).read_text())
            return Decision(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:  # hand-edited or from another release: judge again
            log("serve_bad_decision", level="warning", version=version, error=str(e))
            return None

    def record(self, decision: Decision, *, overwrite: bool = False, swap_delay_s: float = 0.0
               ) -> tuple[Decision, bool]:
        """Record `decision` unless another replica recorded one first: (the one that stands, ours?).
        `overwrite` replaces a stale record (its checkpoint was rewritten in place). An approval's
        `serve_at` is stamped here, `swap_delay_s` after the write, and stamped again if the write
        took more than STAMP_SLACK of the delay (a stalled process): whoever read the ledger
        before the link has at least the rest of the delay to learn of it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".v{decision.version}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        stamp = decision.approved and swap_delay_s > 0
        while True:
            if stamp:
                decision = replace(decision, serve_at=time.time() + swap_delay_s)
            tmp.write_text(json.dumps(decision.describe()))
            if not stamp or time.time() <= decision.serve_at - swap_delay_s * (1 - STAMP_SLACK):
                break
        try:
            if overwrite:
                os.replace(tmp, self._path(decision.version))
                return decision, True
            os.link(tmp, self._path(decision.version))
            return decision, True
        except FileExistsError:
            return self.read(decision.version) or decision, False
        finally:
            tmp.unlink(missing_ok=True)

    def newest_approved(self) -> int | None:
        """The newest approved version on record (a few dozen small files at most: `prune`)."""
        for path in sorted(self.dir.glob("v*.json"), reverse=True):
            try:
                decision = self.read(int(path.stem[1:]))
            except ValueError:
                continue
            if decision is not None and decision.approved:
                return decision.version
        return None

    def prune(self, below: int) -> None:
        """Forget decisions of versions whose checkpoints retention has deleted."""
        for path in self.dir.glob("v*.json"):
            try:
                if int(path.stem[1:]) < below:
                    path.unlink(missing_ok=True)
            except ValueError:
                continue

    def _path(self, version: int) -> Path:
        return self.dir / f"v{version:09d}.json"


def pin_version(checkpoint_dir: str | Path, run_name: str, version: int) -> Path:
    """Make every replica serve `version` (a rollback) until `unpin`. The checkpoint must
    exist and pass its integrity check now, so a typo cannot pin the service to nothing."""
    run_dir = Path(checkpoint_dir) / run_name
    found = dict(checkpoint.list_checkpoints(run_dir))
    if version not in found:
        raise CheckpointError(f"no checkpoint version {version} under {run_dir}; "
                              f"available: {sorted(found)[-10:] or 'none'}")
    checkpoint.verify(found[version], checkpoint.MODEL)
    tmp = run_dir / (PIN_FILE + ".tmp")
    tmp.write_text(f"{version}\n")
    os.replace(tmp, run_dir / PIN_FILE)  # replicas never read a half-written pin
    log("serve_pinned", run_dir=str(run_dir), version=version)
    return run_dir / PIN_FILE


def unpin(checkpoint_dir: str | Path, run_name: str) -> bool:
    """Let replicas follow the newest good checkpoint again. False if nothing was pinned."""
    run_dir = Path(checkpoint_dir) / run_name
    try:
        (run_dir / PIN_FILE).unlink()
    except FileNotFoundError:
        return False
    log("serve_unpinned", run_dir=str(run_dir))
    return True


def read_pin(run_dir: str | Path) -> int | None:
    """The pinned version, or None. Raises CheckpointError if the file holds no version."""
    try:
        text = (Path(run_dir) / PIN_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{Path(run_dir) / PIN_FILE} holds {text[:20]!r}, not a version; "
                              "fix it with `pin_version` or delete it to unpin") from None


def held_versions(run_dir: str | Path) -> set[int]:
    """Checkpoints retention must keep whatever their age: the pinned one and the newest
    approved one, which a replica starting now loads to agree with the others. Without the
    hold, a gate refusing `keep_checkpoints` candidates in a row pruned the served version
    from under every replica started after that (at a checkpoint every 2 s: within a minute)."""
    try:
        pinned = read_pin(run_dir)
    except CheckpointError:
        pinned = None  # a broken pin file is reported by the replicas; retention goes on
    return {v for v in (pinned, Ledger(run_dir).newest_approved()) if v is not None}
