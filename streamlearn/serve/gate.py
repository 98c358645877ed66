"""One quality-gate decision per checkpoint version, recorded beside the checkpoints and
followed by every replica.

A candidate is judged against the served version (the lineage's newest approval) on the same
events: the newest events the trainer learned since the version before the candidate, which
no older version has learned, with the scores the training model gave them before learning
them (the checkpoint's evidence, train/evidence.py); the served model scores the same rows
here, and serve/paired.py tests the difference with its noise. Judged on its own window
against the approved version's number from another window, a lucky window became a bar that
no later model passed, and serving froze on a stale model (issue 44).

Each replica used to judge candidates against its own serving model, so two replicas that
started at different moments accepted different versions, and a caller routed between them
saw v4, v7, v4 (issue 14). Now the first replica to look at a version decides it, judged
against the lineage's last approved version, and records the decision in
`<run_dir>/decisions/`; every other replica, and every later one, follows that record.

A record is created by hard-linking a finished temp file to its final name: the link is
atomic and fails if another replica got there first, so a version has one decision and
nobody reads half of one. An approval also announces its moment (`serve_at`, a swap delay
after the record is written): every replica loads the version before then and switches at
that moment, so replicas agree and a caller never sees the version go back.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamlearn.errors import CheckpointError
from streamlearn.logs import log
from streamlearn.train import checkpoint
from streamlearn.train.prequential import headline

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


def replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# ---- the checks a candidate must pass ---------------------------------------------------

def online_metric(meta: Mapping[str, Any] | None, task: str) -> float | None:
    """The headline online metric a checkpoint reports; NaN if present but not a number."""
    name, _higher_is_better = headline(task)
    value = (((meta or {}).get("metrics") or {}).get("online") or {}).get(name)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan  # present but not a number: treat as broken, not as absent


def metric_problem(meta: Mapping[str, Any] | None, task: str) -> str | None:
    """A candidate whose own online metric is not a number diverged while training."""
    name, _higher_is_better = headline(task)
    value = online_metric(meta, task)
    if value is not None and not math.isfinite(value):
        return f"online {name} is {value}"
    return None


def gather_evidence(paths: Mapping[int, Path], candidate: int, served: int, refused: Collection[int],
                    enough: Callable[[np.ndarray], bool]) -> dict[str, np.ndarray] | None:
    """The evidence to judge `candidate` against `served` on: the candidate's own, and, while it is
    not `enough` (too few frauds in one checkpoint's events), that of the versions before it back
    to the served one, newest first: none of those events was learned by the served version. A
    `refused` version's evidence is left out: its scores are those of a lineage the gate did not
    trust, and would count against a candidate that has recovered. None if the checkpoints carry
    none. Raises CheckpointError for a corrupt file of the candidate's."""
    parts = []
    for version in sorted((v for v in paths if served < v <= candidate and v not in refused), reverse=True):
        try:
            found = checkpoint.load_evidence(paths[version])
        except CheckpointError:
            if version == candidate:
                raise
            continue  # an older one's: passed over, the candidate's own decides
        if found is None:
            continue
        parts.append(found)
        if enough(found["targets"] if len(parts) == 1 else np.concatenate([p["targets"] for p in parts])):
            break
    if not parts:
        return None
    return {name: np.concatenate([p[name] for p in parts]) for name in ("features", "scores", "targets")}


def weights_problem(state: Mapping[str, Any], max_abs: float) -> str | None:
    """A diverged model (NaN/inf, or weights blown up by orders of magnitude) scores garbage
    while its meta may still look fine, so the tensors themselves are checked."""
    for name, tensor in state.items():
        if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel()):
            continue
        if not torch.isfinite(tensor).all():
            return f"parameter {name!r} has NaN or inf values"
        peak = float(tensor.abs().max())
        if peak > max_abs:
            return f"parameter {name!r} reaches |w| = {peak:.3g}, above the sanity limit {max_abs:g}"
    return None
