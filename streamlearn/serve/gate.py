"""One quality-gate decision per checkpoint version, recorded beside the checkpoints and
followed by every replica.

A candidate is judged against the served version (the lineage's newest approval) on the same
events: the newest events the trainer learned since the version before the candidate, which
no older version has learned, with the scores the training model gave them before learning
them (the checkpoint's evidence, train/evidence.py); the served model scores the same rows
here, and serve/paired.py tests the difference with its noise. Judged on its own window
against the approved version's number from another window, a lucky window became a bar that
no later model passed, and serving froze on a stale model (issue 44).

The first replica to look at a version decides it and records the decision beside the
checkpoints (rundir/ledger.py); every other replica, and every later one, follows that record,
so a caller routed between replicas never sees v4, v7, v4. This module holds the checks.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from streamlearn.errors import CheckpointError
from streamlearn.prequential import headline
from streamlearn.rundir import checkpoint


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
    none. Raises CheckpointError for a corrupt file of the candidate's.

    Delayed feedback's evidence (`pooled`: it names each report's event) is the candidate's alone:
    reports held back from learning, the same in every version that holds them, scored by the
    candidate itself. A report whose event came after the served version's checkpoint is left
    out: the candidate learned that event as legitimate and the served model did not know it,
    which would count against the candidate (load/bench/gate_feedback.py)."""
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
        if pooled(found):
            return _known_to(found, paths.get(served)) if version == candidate else None
        parts.append(found)
        if enough(found["targets"] if len(parts) == 1 else np.concatenate([p["targets"] for p in parts])):
            break
    if not parts:
        return None
    return {name: np.concatenate([p[name] for p in parts]) for name in ("features", "scores", "targets")}


def pooled(evidence: Mapping[str, np.ndarray]) -> bool:
    return "offset" in evidence


def _known_to(evidence: dict[str, np.ndarray], served: Path | None) -> dict[str, np.ndarray]:
    """The rows whose event the served version had learned: those it holds no place for (-1), or
    whose offset is below where the served checkpoint's learning stood on that partition."""
    try:
        ends = {int(p): int(o) for p, o in checkpoint.read_meta(served)["offsets"].items()} if served else {}
    except (CheckpointError, KeyError, ValueError, OSError):
        ends = {}
    partition, offset = evidence["partition"], evidence["offset"]
    end = np.array([ends.get(int(p), 0) for p in partition.tolist()], np.int64)
    keep = (partition < 0) | (offset < end)
    return {name: evidence[name][keep] for name in ("features", "scores", "targets")}


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
