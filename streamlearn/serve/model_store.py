"""The serving model of one replica, and how a newer checkpoint replaces it.

A background thread polls the run directory. A candidate must pass, in this order:
its checksum (a corrupt file is never unpickled), the pipeline it was trained for, the
quality gate on its online metric, and a sanity check of its weights. Only then is it
built into a fresh model and published by ONE reference assignment of an immutable
`ServingModel`: a request reads `store.current` once and uses that object throughout,
so requests in flight finish on the old model while new ones get the new one, with no
lock on the request path.

Rollback is a file, `<run_dir>/PINNED`, holding a version: every replica (and the CLI)
sees the same pin without any coordination service.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from streamlearn import metrics
from streamlearn.errors import CheckpointError
from streamlearn.logs import bind, log
from streamlearn.pipeline import Pipeline, load_pipeline
from streamlearn.serve.config import ServeConfig
from streamlearn.train import checkpoint
from streamlearn.train.phases import Phases
from streamlearn.train.prequential import headline

PIN_FILE = "PINNED"


@dataclass(frozen=True)
class ServingModel:
    """Everything a request needs, published together so version and model never disagree."""

    model: nn.Module
    version: int
    meta: Mapping[str, Any]
    path: Path
    swapped_at: float

    @property
    def trained_through(self) -> dict[str, int]:
        return dict(self.meta.get("offsets") or {})

    def describe(self) -> dict[str, Any]:
        return {"version": self.version, "trained_through": self.trained_through,
                "metrics": self.meta.get("metrics"), "topic": self.meta.get("topic"),
                "written_at": self.meta.get("written_at"), "swapped_at": self.swapped_at, "path": str(self.path)}


@dataclass(frozen=True)
class Rejection:
    version: int
    kind: str  # integrity | pipeline | quality | weights
    reason: str
    at: float


class _Rejected(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


# ---- pin file: the rollback switch shared by every replica and the CLI -----------------

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


def pin_version(checkpoint_dir: str | Path, run_name: str, version: int) -> Path:
    """Make every replica serve `version` (a rollback) until `unpin`. The checkpoint must
    exist and pass its integrity check now, so a typo cannot pin the service to nothing."""
    run_dir = Path(checkpoint_dir) / run_name
    found = dict(checkpoint.list_checkpoints(run_dir))
    if version not in found:
        raise CheckpointError(f"no checkpoint version {version} under {run_dir}; "
                              f"available: {sorted(found)[-10:] or 'none'}")
    checkpoint.verify(found[version])
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


# ---- the gates -----------------------------------------------------------------------

def _online_metric(meta: Mapping[str, Any], name: str) -> float | None:
    value = ((meta.get("metrics") or {}).get("online") or {}).get(name)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan  # present but not a number: treat as broken, not as absent


def quality_problem(candidate: Mapping[str, Any], serving: Mapping[str, Any] | None, task: str,
                    tolerance: float) -> str | None:
    """Why the candidate must not replace the serving model, or None if it may.

    A candidate without the metric (e.g. AUC is undefined while the window holds one
    class) is not judged: blocking it would freeze the service on its first model."""
    name, higher_is_better = headline(task)
    new = _online_metric(candidate, name)
    if new is not None and not math.isfinite(new):
        return f"online {name} is {new}"
    old = _online_metric(serving, name) if serving is not None else None
    if new is None or old is None or not math.isfinite(old):
        return None
    worse_by = (old - new) if higher_is_better else (new - old)
    if worse_by > tolerance + 1e-12:
        return (f"online {name} {new:.4f} is worse than the serving model's {old:.4f} by {worse_by:.4f}, "
                f"more than the tolerance {tolerance}")
    return None


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


# ---- the store -----------------------------------------------------------------------

class ModelStore:
    def __init__(self, pipeline: Pipeline, run_dir: str | Path, *, quality_tolerance: float = 0.02,
                 max_abs_weight: float = 1e4, poll_interval_s: float = 0.5, timeline: str = ""):
        self.pipeline = pipeline
        bind(pipeline=pipeline.name)  # one store per replica process: its log lines say which pipeline
        self.run_dir = Path(run_dir)
        self.quality_tolerance = quality_tolerance
        self.max_abs_weight = max_abs_weight
        self.poll_interval_s = poll_interval_s
        self.current: ServingModel | None = None  # the one reference requests read
        self.pinned: int | None = None
        self.last_rejection: Rejection | None = None
        self.rejections: Counter[str] = Counter()
        # version -> (rejection, SHA256SUMS mtime): remembered so a bad checkpoint is not
        # re-hashed every poll, yet judged again if a writer replaces it in place.
        self._rejected: dict[int, tuple[Rejection, int | None]] = {}
        self._pin_problem: object = None  # last pin problem logged, so it is logged once, not every poll
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Opt-in trace of every swap and rejection: timeline files beside the training ranks'.
        self.timeline = Phases(os.getpid(), timeline, process=f"scorer {os.getpid()}") if timeline else None

    @classmethod
    def from_config(cls, cfg: ServeConfig) -> ModelStore:
        return cls(load_pipeline(cfg.pipeline), cfg.run_dir, quality_tolerance=cfg.quality_tolerance,
                   max_abs_weight=cfg.max_abs_weight, poll_interval_s=cfg.poll_interval_s, timeline=cfg.timeline)

    # -- polling --

    def poll_once(self) -> bool:
        """Look at the run directory once; swap in a newer (or the pinned) model. True if swapped."""
        with self._poll_lock:
            try:
                self.pinned = read_pin(self.run_dir)
            except CheckpointError as e:
                if self._pin_problem != str(e):
                    log("serve_bad_pin", level="error", error=str(e))
                    self._pin_problem = str(e)
                self.pinned = None
            available = checkpoint.list_checkpoints(self.run_dir)
            serving = self.current
            if self.pinned is not None:
                if serving is not None and serving.version == self.pinned:
                    return False
                # An operator's rollback overrides the quality gate, never the integrity checks.
                candidates = [(v, p) for v, p in available if v == self.pinned]
                if not candidates and self._pin_problem != self.pinned:
                    log("serve_pinned_missing", level="error", version=self.pinned, run_dir=str(self.run_dir))
                    self._pin_problem = self.pinned
                gate = False
            else:
                floor = serving.version if serving is not None else -1  # versions only move forward
                candidates = [(v, p) for v, p in available if v > floor]
                gate = True
            for version, path in reversed(candidates):  # newest first; a rejection falls back to the next
                if self._remembered(version, path, allow_quality=not gate):
                    continue
                wall, started = time.time(), time.perf_counter()
                try:
                    loaded = self._load(version, path, serving if gate else None)
                except _Rejected as r:
                    self._reject(version, path, r.kind, r.reason)
                    self._trace("rejected", wall, started, version=version, kind=r.kind)
                    continue
                except OSError as e:  # removed by checkpoint retention while we read it: not its fault
                    log("serve_candidate_vanished", level="warning", version=version, error=str(e))
                    continue
                self.current = loaded  # the atomic swap
                self._trace("swap", wall, started, version=version, previous=serving.version if serving else None)
                bind(version=version)
                metrics.record_swap(self.pipeline.name, version)
                log("serve_swapped", version=version, previous=serving.version if serving else None,
                    pinned=self.pinned is not None)
                return True
            return False

    def _trace(self, name: str, wall: float, started: float, **args) -> None:
        if self.timeline is not None:
            self.timeline.record(name, wall, time.perf_counter() - started, tid="model-store", **args)
            self.timeline.flush()  # swaps are rare and a replica runs for days: on disk now, not at exit

    def _remembered(self, version: int, path: Path, allow_quality: bool) -> bool:
        entry = self._rejected.get(version)
        if entry is None:
            return False
        rejection, signature = entry
        if signature != _signature(path):
            del self._rejected[version]
            return False
        return not (allow_quality and rejection.kind == "quality")

    def _reject(self, version: int, path: Path, kind: str, reason: str) -> None:
        rejection = Rejection(version, kind, reason, time.time())
        self._rejected[version] = (rejection, _signature(path))
        self.last_rejection = rejection
        self.rejections[kind] += 1
        metrics.record_rejection(self.pipeline.name, kind)
        log("serve_rejected", level="warning", version=version, kind=kind, reason=reason)

    def _load(self, version: int, path: Path, baseline: ServingModel | None) -> ServingModel:
        try:
            checkpoint.verify(path)
            meta = checkpoint.read_meta(path)
        except CheckpointError as e:
            raise _Rejected("integrity", str(e)) from None
        trained_for = (meta.get("pipeline") or {}).get("name")
        if trained_for != self.pipeline.name:
            raise _Rejected("pipeline", f"trained for pipeline {trained_for!r}, this service runs "
                                        f"{self.pipeline.name!r}")
        problem = quality_problem(meta, baseline.meta if baseline else None, self.pipeline.task,
                                  self.quality_tolerance)
        if problem:
            raise _Rejected("quality", problem)
        try:  # verified just above; hashing the file a second time would double the load time
            state, _optimizer, _meta = checkpoint.load(path, verify_first=False)
        except CheckpointError as e:
            raise _Rejected("integrity", str(e)) from None
        problem = weights_problem(state, self.max_abs_weight)
        if problem:
            raise _Rejected("weights", problem)
        model = self.pipeline.build_model()
        try:
            model.load_state_dict(state)
        except (RuntimeError, KeyError, TypeError) as e:
            raise _Rejected("pipeline", f"weights do not fit the pipeline's model: {str(e)[:300]}") from None
        model.eval().requires_grad_(False)
        return ServingModel(model, version, MappingProxyType(meta), path, time.time())

    # -- background thread --

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"model-store-{self.run_dir.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.timeline is not None:
            self.timeline.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as e:  # a bad poll must not stop later ones: the next checkpoint may be fine
                log("serve_poll_failed", level="error", error=f"{type(e).__name__}: {e}")
            self._stop.wait(self.poll_interval_s)

    # -- what GET /model shows --

    def status(self) -> dict[str, Any]:
        serving = self.current
        last = self.last_rejection
        return {
            "pipeline": self.pipeline.describe(),
            "run_dir": str(self.run_dir),
            **(serving.describe() if serving else {"version": None, "trained_through": None, "metrics": None,
                                                    "swapped_at": None}),
            "pinned": self.pinned,
            "serving_pinned": serving is not None and serving.version == self.pinned,
            "quality_tolerance": self.quality_tolerance,
            "rejections": dict(self.rejections),
            "last_rejection": None if last is None else
            {"version": last.version, "kind": last.kind, "reason": last.reason, "at": last.at},
        }


def _signature(path: Path) -> int | None:
    try:
        return (path / checkpoint.SUMS).stat().st_mtime_ns
    except OSError:
        return None
