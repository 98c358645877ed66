"""The serving model of one replica, and how a newer checkpoint replaces it.

A background thread polls the run directory. Each new version is judged once for the
whole lineage (streamlearn/serve/gate.py): its checksum (a corrupt file is never
unpickled), the pipeline it was trained for, a sanity check of its weights, and the
quality gate: the candidate against the served version on the same events (serve/paired.py),
unless the served version's own answers fail callers (below the served-quality floor). Every replica
follows the recorded decision: it loads an approved version ahead of the moment the
decision announced, then publishes it by ONE reference assignment of an immutable
`ServingModel`. A request calls `store.serving()` once and uses that object throughout,
so requests in flight finish on the old model while new ones get the new one, with no
lock on the request path.

Rollback is a file, `<run_dir>/PINNED`, holding a version: every replica (and the CLI)
sees the same pin without any coordination service, and switches at the same moment
(the file's mtime plus the swap delay).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from streamlearn import faults, metrics
from streamlearn.errors import CheckpointError
from streamlearn.logs import bind, log
from streamlearn.phases import Phases
from streamlearn.pipeline import Pipeline, load_pipeline
from streamlearn.rundir import checkpoint
from streamlearn.rundir.ledger import (
    PIN_FILE,
    STAMP_SLACK,
    Decision,
    Ledger,
    held_versions,
    pin_version,
    read_pin,
    unpin,
)
from streamlearn.runfiles import read_last_jsonl
from streamlearn.serve import paired
from streamlearn.serve.config import ServeConfig
from streamlearn.serve.gate import (
    gather_evidence,
    metric_problem,
    online_metric,
    replica_id,
    weights_problem,
)

__all__ = ["ModelStore", "ServingModel", "held_versions", "pin_version", "read_pin", "unpin"]


@dataclass(frozen=True)
class ServingModel:
    """Everything a request needs, published together so version and model never disagree."""

    model: nn.Module
    version: int
    meta: Mapping[str, Any]
    path: Path
    swapped_at: float  # the announced moment it serves from (wall clock)
    pinned: bool = False  # served because of PINNED, not because the gate approved it
    load_s: float = 0.0

    @property
    def trained_through(self) -> dict[str, int]:
        return dict(self.meta.get("offsets") or {})

    def describe(self) -> dict[str, Any]:
        return {"version": self.version, "trained_through": self.trained_through,
                "metrics": self.meta.get("metrics"), "topic": self.meta.get("topic"),
                "written_at": self.meta.get("written_at"), "swapped_at": self.swapped_at, "path": str(self.path)}


class _Rejected(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason

# ---- pin file: the rollback switch shared by every replica and the CLI -----------------

# ---- the store -----------------------------------------------------------------------

# How long the evaluator's newest served.jsonl row counts as what callers get now.
SERVED_QUALITY_FRESH_S = 120.0
SERVED_QUALITY_MIN_ANSWERS = 200


class ModelStore:
    def __init__(self, pipeline: Pipeline, run_dir: str | Path, *, quality_tolerance: float = 0.02,
                 quality_alpha: float = 0.02, served_auc_floor: float = 0.7, max_abs_weight: float = 1e4,
                 poll_interval_s: float = 0.5, swap_delay_s: float = 0.0, max_behind_versions: int = 10,
                 max_behind_s: float = 300.0, timeline: str = ""):
        # Keyword settings, one per ScorerConfig field (serve/config.py builds the store from it), once per replica.
        self.pipeline = pipeline
        bind(pipeline=pipeline.name)  # one store per replica process: its log lines say which pipeline
        self.run_dir = Path(run_dir)
        self.quality_tolerance, self.quality_alpha, self.served_auc_floor = \
            quality_tolerance, quality_alpha, served_auc_floor
        self.max_behind = (max_behind_versions, max_behind_s)
        self.behind: dict[str, Any] = {"versions": None, "seconds": None, "newest": None, "why": None}
        self._reference: ServingModel | None = None  # the served version, loaded to score evidence
        self._written: dict[int, float] = {}  # version -> written_at of the newest checkpoints seen
        self.max_abs_weight = max_abs_weight
        self.poll_interval_s = poll_interval_s
        self.swap_delay_s = swap_delay_s
        # A poll that started longer ago than this may have missed an approval that is due now
        # (rundir/ledger.py: STAMP_SLACK); 0 (no swap delay) turns the request-path check off.
        self._fresh_for_s = swap_delay_s * (1 - STAMP_SLACK)
        self.ledger = Ledger(run_dir)
        self.current: ServingModel | None = None  # the one reference requests read (via serving())
        # Loaded, waiting for their announced moments (in moment order). Only the poll thread
        # writes it; requests only read it.
        self._queue: tuple[ServingModel, ...] = ()
        self.pinned: int | None = None
        self.last_rejection: Decision | None = None
        self.rejections: Counter[str] = Counter()  # kinds of the refused versions this replica has seen
        self.late_swaps = 0  # approvals this replica saw only after their moment had passed
        self.request_polls = 0  # polls a request made because the poller was late (serving())
        self._polled_at = 0.0  # wall clock at the start of the last finished poll: every record older is known
        self._decisions: dict[int, Decision] = {}  # the ledger, as read so far
        self._judged: dict[int, ServingModel] = {}  # built while judging: not loaded twice
        # version -> SHA256SUMS mtime of a checkpoint that failed to load here (corrupt after its
        # approval, or pinned while corrupt): not re-hashed every poll, tried again if rewritten.
        self._unloadable: dict[int, int | None] = {}
        self._announced: ServingModel | None = None
        self._pin_problem: object = None  # last pin problem logged, so it is logged once, not every poll
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Opt-in trace of every swap and rejection: timeline files beside the training ranks'.
        self.timeline = Phases(os.getpid(), timeline, process=f"scorer {os.getpid()}") if timeline else None

    @classmethod
    def from_config(cls, cfg: ServeConfig) -> ModelStore:
        return cls(load_pipeline(cfg.pipeline), cfg.run_dir, quality_tolerance=cfg.quality_tolerance,
                   quality_alpha=cfg.quality_alpha, served_auc_floor=cfg.served_auc_floor,
                   max_abs_weight=cfg.max_abs_weight, poll_interval_s=cfg.poll_interval_s,
                   swap_delay_s=cfg.swap_delay_s, max_behind_versions=cfg.max_behind_versions,
                   max_behind_s=cfg.max_behind_s, timeline=cfg.timeline)

    # -- the request path --

    def serving(self) -> ServingModel | None:
        """The model a request uses. A loaded version whose moment has come replaces the old
        one here, on the request path, so no replica answers with the old version after
        another has answered with the new one, whatever its poll thread is doing: if that thread
        has not read the ledger for (1 - STAMP_SLACK) of the swap delay, an approval it has not
        seen may be due, and the request reads the ledger itself first."""
        if self._fresh_for_s and time.time() >= self._polled_at + self._fresh_for_s:
            self._poll_late()
        return self._switch_if_due()

    def _switch_if_due(self) -> ServingModel | None:
        queue = self._queue
        if queue and queue[0].swapped_at <= time.time():
            now = time.time()
            due = [m for m in queue if m.swapped_at <= now][-1]
            if self.current is not due and (self.current is None or due.swapped_at >= self.current.swapped_at):
                self.current = due
        return self.current

    def _poll_late(self) -> None:
        """Poll for a request, because the poller is late (a thread starved of CPU on a loaded host,
        a slow judgement). Waits for a poll already under way, then polls only if that one is
        stale too. Costs a request a poll only when the alternative was a possibly stale answer."""
        asked, last = time.time(), self._polled_at
        with self._poll_lock:
            if time.time() < self._polled_at + self._fresh_for_s:
                return  # the poll we waited for started recently enough
            try:
                self._poll()
            except Exception as e:  # the answer goes out on what is loaded; the poller tries again
                log("serve_poll_failed", level="error", error=f"{type(e).__name__}: {e}", on_request=True)
                # Not every request again: a checkpoint directory that fails (a storage outage)
                # would cost each request a failed poll and a log line. Once a poll interval.
                self._polled_at = time.time() - self._fresh_for_s + self.poll_interval_s
                return
        self.request_polls += 1
        log("serve_poll_on_request", level="warning", poller_late_s=round(asked - last, 3))

    # -- polling --

    def poll_once(self) -> bool:
        """Look at the run directory once: decide new versions, load what is to be served next,
        switch if its moment has come. True if the served model changed."""
        with self._poll_lock:
            return self._poll()

    def _poll(self) -> bool:
        started = time.time()
        before = self.current
        pin = self._read_pin()
        available = checkpoint.list_checkpoints(self.run_dir)
        self._forget_pruned({v for v, _ in available})
        self._decide(available)
        self._prepare(self._targets(available, pin), dict(available))
        self._judged.clear()  # built while judging but not the target (e.g. pinned meanwhile): let it go
        served = self._switch_if_due()  # superseded and served entries leave the queue, due ones stay till served
        self._queue = tuple(m for m in self._queue if served is None or m.swapped_at > served.swapped_at)
        self._announce()
        self._measure_behind(available)
        self._polled_at = started
        return self.current is not before

    def _read_pin(self) -> tuple[int, float] | None:
        """(pinned version, the moment every replica switches to it) or None."""
        try:
            self.pinned = read_pin(self.run_dir)
            if self.pinned is None:
                return None
            return self.pinned, (self.run_dir / PIN_FILE).stat().st_mtime + self.swap_delay_s
        except FileNotFoundError:  # unpinned between the read and the stat
            self.pinned = None
        except CheckpointError as e:
            if self._pin_problem != str(e):
                log("serve_bad_pin", level="error", error=str(e))
                self._pin_problem = str(e)
            self.pinned = None
        return None

    def _decide(self, available: list[tuple[int, Path]]) -> None:
        """Judge the versions newer than every decided one, newest first, until one is approved
        (the older ones are superseded, never served). Versions decided by others are followed."""
        decided = {v: self._decision(v, p) for v, p in available}
        floor = max((v for v, d in decided.items() if d is not None), default=-1)
        judged = False
        paths = dict(available)
        for version, path in reversed(available):
            if version < floor:
                break
            if decided[version] is not None:
                continue
            decision, judged = self._judge(version, path, paths), True
            if decision is not None and decision.approved:
                break
        if judged:  # decisions of checkpoints retention deleted go too, except the newest approval (a baseline)
            newest = self._approved_below(float("inf"))
            self.ledger.prune(below=min([available[0][0]] + ([newest.version] if newest else [])))

    def _decision(self, version: int, path: Path) -> Decision | None:
        """The standing decision on this checkpoint, or None if there is none or it judged an
        earlier file under the same version (rewritten in place: judged again)."""
        signature = _signature(path)
        decision = self._decisions.get(version)
        if decision is None or decision.signature != signature:
            decision = self.ledger.read(version)  # decided by another replica, or decided again
        if decision is None or decision.signature != signature:
            return None
        self._remember(decision)
        return decision

    def _judge(self, version: int, path: Path, paths: dict[int, Path]) -> Decision | None:
        baseline = self._approved_below(version)
        wall, started = time.time(), time.perf_counter()
        signature = _signature(path)
        against = baseline.version if baseline else None
        comparison = None
        try:
            loaded = self._load(version, path, gate=True)
            comparison = self._compare(version, baseline, paths) if baseline else None
            if comparison is not None and comparison.hold:
                raise _Rejected("quality", comparison.why)
        except _Rejected as r:
            loaded, decision = None, Decision(version, False, r.kind, r.reason, None, against, wall, wall,
                                              replica_id(), signature, _described(comparison))
        except OSError as e:  # removed by checkpoint retention while we read it: not its fault
            log("serve_candidate_vanished", level="warning", version=version, error=str(e))
            return None
        else:
            decision = Decision(version, True, None, None, online_metric(loaded.meta, self.pipeline.task),
                                against, wall, time.time(),  # stamped by record
                                replica_id(), signature, _described(comparison))
        existing = self.ledger.read(version)  # only a record of an earlier file under this version is replaced
        stale = existing is not None and existing.signature != signature
        standing, ours = self.ledger.record(decision, overwrite=stale, swap_delay_s=self.swap_delay_s)
        if ours:  # this replica speaks for the lineage
            self._announce_decision(standing, wall, time.perf_counter() - started)
        if loaded is not None and standing.approved:
            self._judged[version] = loaded
        self._remember(standing)
        return standing

    def _compare(self, version: int, baseline: Decision, paths: dict[int, Path]) -> paired.Comparison | None:
        """The candidate against the served version on the same events, or None where the lineage
        carries no evidence (a trainer before evidence, or gate_evidence 0) or the served version
        no longer loads: then integrity, pipeline and weights decide alone."""
        try:
            refused = {v for v, d in self._decisions.items() if not d.approved}
            evidence = gather_evidence(paths, version, baseline.version, refused, self._enough)
        except CheckpointError as e:
            raise _Rejected("integrity", str(e)) from None
        reference = self._reference_model(baseline.version, paths)
        if evidence is None or reference is None:
            return None
        with torch.inference_mode():
            served = self.pipeline.score(reference.model(torch.from_numpy(evidence["features"]))).numpy()
        comparison = paired.compare(self.pipeline.task, evidence["scores"], served, evidence["targets"],
                                    tolerance=self.quality_tolerance, alpha=self.quality_alpha)
        callers = self._callers_auc(baseline.version)
        if comparison.hold and callers is not None and callers < self.served_auc_floor:
            # What callers get counts: a served version whose own answers are below the floor is
            # no model to defend, whatever it scores on the trainer's events.
            comparison = replace(comparison, hold=False, why=(
                f"{comparison.why}; but the served v{baseline.version}'s answers to callers score auc "
                f"{callers:.4f}, below the floor {self.served_auc_floor}: replaced"))
        return comparison

    def _enough(self, targets: np.ndarray) -> bool:
        if self.pipeline.task == "classification":
            positives = int((targets > 0.5).sum())
            return min(positives, len(targets) - positives) >= 3 * paired.MIN_EACH_CLASS
        return len(targets) >= 10 * paired.MIN_EVENTS

    def _reference_model(self, version: int, paths: dict[int, Path]) -> ServingModel | None:
        """The served version's model, to score the evidence with: the one this replica serves, or
        loaded once and kept until the served version changes."""
        for model in (self.current, self._reference, *self._queue):
            if model is not None and model.version == version:
                self._reference = model
                return model
        if version not in paths:
            return None
        try:
            self._reference = self._load(version, paths[version], gate=False)
        except (_Rejected, OSError) as e:
            log("serve_reference_unloadable", level="warning", version=version, error=str(e))
            return None
        return self._reference

    def _callers_auc(self, version: int) -> float | None:
        """The evaluator's AUC of `version`'s answers to callers (served.jsonl), if it is fresh and
        rests on enough labelled answers; None otherwise (no evaluator runs, or a regression task)."""
        if self.pipeline.task != "classification":
            return None
        try:
            row = read_last_jsonl(self.run_dir / "served.jsonl") or {}
        except (OSError, ValueError):
            return None
        figures = (row.get("versions") or {}).get(str(version)) or {}
        fresh = time.time() - float(row.get("t") or 0) <= SERVED_QUALITY_FRESH_S
        if not fresh or (figures.get("window") or 0) < SERVED_QUALITY_MIN_ANSWERS or figures.get("auc") is None:
            return None
        return float(figures["auc"])

    def _measure_behind(self, available: list[tuple[int, Path]]) -> None:
        """How far the served version is behind the newest checkpoint, and why: GET /model, status,
        and the gauges StreamlearnServingStale watches."""
        served = self.current
        if not available or served is None:
            self.behind = {"versions": None, "seconds": None, "newest": None, "why": None}
            return
        newest, path = available[-1]
        if newest not in self._written:
            try:
                self._written = {newest: float(checkpoint.read_meta(path).get("written_at") or 0.0)}
            except CheckpointError:
                return
        versions = max(0, newest - served.version)
        written = float(served.meta.get("written_at") or self._written[newest])
        seconds = max(0.0, self._written[newest] - written) if versions else 0.0
        self.behind = {"versions": versions, "seconds": round(seconds, 1), "newest": newest,
                       "why": self._why_behind(served, newest) if versions else None,
                       "bound": {"versions": self.max_behind[0], "seconds": self.max_behind[1]}}
        metrics.record_behind(self.pipeline.name, versions, seconds, *self.max_behind, self.served_auc_floor)

    def _why_behind(self, served: ServingModel, newest: int) -> str:
        if served.pinned:
            return f"pinned to v{served.version} ({PIN_FILE}); `streamlearn serve unpin` follows the gate again"
        upcoming = [m for m in self._queue if m.version > served.version]
        if upcoming:
            return f"v{upcoming[-1].version} approved, every replica switches at its moment"
        newer = [d for v, d in self._decisions.items() if v > served.version]
        refused = max((d for d in newer if not d.approved), key=lambda d: d.version, default=None)
        if refused is not None:
            return f"holding v{served.version}: v{refused.version} refused ({refused.kind}): {refused.reason}"
        return f"v{newest} not judged yet"

    def _announce_decision(self, decision: Decision, wall: float, seconds: float) -> None:
        if decision.approved:
            log("serve_approved", version=decision.version, compared_with=decision.compared_with,
                serve_at=decision.serve_at)
            return
        metrics.record_rejection(self.pipeline.name, decision.kind)
        self._trace("rejected", wall, seconds, version=decision.version, kind=decision.kind)
        log("serve_rejected", level="warning", version=decision.version, kind=decision.kind, reason=decision.reason)

    def _remember(self, decision: Decision) -> None:
        known = self._decisions.get(decision.version)
        self._decisions[decision.version] = decision
        if decision.approved or known == decision:
            return
        self.rejections[decision.kind] += 1
        if self.last_rejection is None or decision.version >= self.last_rejection.version:
            self.last_rejection = decision

    def _forget_pruned(self, versions: set[int]) -> None:
        """Bound the cache by the checkpoints retention keeps, and the newest approval (the baseline)."""
        newest = self._approved_below(float("inf"))
        for version in [v for v in self._decisions if v not in versions and (newest is None or v != newest.version)]:
            del self._decisions[version]

    def _approved_below(self, version: float) -> Decision | None:
        approved = [d for v, d in self._decisions.items() if v < version and d.approved]
        return max(approved, key=lambda d: d.version, default=None)

    def _targets(self, available: list[tuple[int, Path]], pin: tuple[int, float] | None
                 ) -> list[tuple[int, float, bool]] | None:
        """What is to be served from now on, in moment order: (version, its moment, pinned?), or
        None to keep what is queued (a pin on a missing checkpoint)."""
        versions = {v for v, _ in available}
        if pin is None:
            return self._steps(versions)
        version, moment = pin
        if version not in versions:
            if self._pin_problem != version:
                log("serve_pinned_missing", level="error", version=version, run_dir=str(self.run_dir))
                self._pin_problem = version
            return None
        if self.current is not None and self.current.pinned:
            return [(version, moment, True)]
        # What was announced for earlier is served in its turn; what was announced for later is
        # overruled by the pin.
        return [s for s in self._steps(versions) if s[1] < moment] + [(version, moment, True)]

    def _steps(self, versions: set[int]) -> list[tuple[int, float, bool]]:
        """The approvals still to serve: at any moment every replica serves the highest version
        approved with a moment already come, so a caller never sees a version go back. Every such
        step is kept, not only the newest approval: two replicas that judged v36 and v37 at once
        announce two moments, and a replica that queued only v37 answered v35 after the other had
        answered v36 (CI, under a loaded suite). A replica that serves nothing yet takes the step
        due now (what the others serve) and those to come; versions never move below the served one."""
        current, now = self.current, time.time()
        top = current.version if current is not None and not current.pinned else -1
        steps = []
        for d in sorted((d for v, d in self._decisions.items() if d.approved and v in versions),
                        key=lambda d: (d.serve_at, d.version)):
            if d.version > top:
                steps.append((d.version, d.serve_at, False))
                top = d.version
        due = [s for s in steps if s[1] <= now]
        return due[-1:] + [s for s in steps if s[1] > now]

    def _prepare(self, targets: list[tuple[int, float, bool]] | None, paths: dict[int, Path]) -> None:
        """Load each target ahead of its moment; `serving()` switches to it when the moment comes.
        A replica with nothing served and nothing due answers 503 like the others until the first
        moment: serving the lineage's first model early answered 200 here while a replica that had
        not polled yet said 503."""
        if targets is None:
            return
        current = self.current
        queued = {(m.version, m.pinned): m for m in self._queue}
        queue = []
        for version, moment, pinned in targets:
            if current is not None and (current.version, current.pinned) == (version, pinned):
                continue  # e.g. a pin back to the version being served
            model = queued.get((version, pinned))
            if model is None:
                model = self._build(version, paths[version], max(moment, time.time()), pinned)  # past: now
                if model is None:
                    continue
                late = time.time() - moment
                if current is not None and not (pinned or current.pinned) and late > self.poll_interval_s:
                    # Others may have answered with it already while this replica still served the old one.
                    self.late_swaps += 1
                    log("serve_swap_late", level="warning", version=version, late_s=round(late, 3))
                if moment > time.time():
                    faults.point("serve_mid_swap")
            queue.append(model)
        self._queue = tuple(queue)

    def _build(self, version: int, path: Path, moment: float, pinned: bool) -> ServingModel | None:
        """The checkpoint as a ServingModel, checked on this replica (integrity, pipeline, weights),
        or None if it does not load here."""
        signature = _signature(path)
        if version in self._unloadable and self._unloadable[version] == signature:
            return None
        model = self._judged.pop(version, None)
        try:
            model = model or self._load(version, path, gate=False)
        except (_Rejected, OSError) as e:
            self._unloadable[version] = signature
            log("serve_load_failed", level="error", version=version, pinned=pinned,
                kind=getattr(e, "kind", "vanished"), error=str(e))
            return None
        self._unloadable.pop(version, None)
        return replace(model, swapped_at=moment, pinned=pinned)

    def _announce(self) -> None:
        """Log, count and trace each switch once, whichever thread made it."""
        served = self.current
        if served is None or served is self._announced:
            return
        previous, self._announced = self._announced, served
        bind(version=served.version)
        metrics.record_swap(self.pipeline.name, served.version)
        self._trace("swap", served.swapped_at, served.load_s, version=served.version,
                    previous=previous.version if previous else None)
        log("serve_swapped", version=served.version, previous=previous.version if previous else None,
            pinned=served.pinned)

    def _trace(self, name: str, wall: float, seconds: float, **args) -> None:
        if self.timeline is not None:
            self.timeline.record(name, wall, seconds, tid="model-store", **args)
            self.timeline.flush()  # swaps are rare and a replica runs for days: on disk now, not at exit

    def _load(self, version: int, path: Path, gate: bool) -> ServingModel:
        """Check and build one checkpoint: integrity, pipeline and weights, and when judging (`gate`)
        its own online metric is a number; the paired comparison follows in `_judge`."""
        started = time.perf_counter()
        try:
            checkpoint.verify(path, checkpoint.MODEL)  # the join state is the trainer's
            meta = checkpoint.read_meta(path)
        except CheckpointError as e:
            raise _Rejected("integrity", str(e)) from None
        trained_for = (meta.get("pipeline") or {}).get("name")
        if trained_for != self.pipeline.name:
            raise _Rejected("pipeline", f"trained for pipeline {trained_for!r}, this service runs "
                                        f"{self.pipeline.name!r}")
        if gate and (problem := metric_problem(meta, self.pipeline.task)):
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
        return ServingModel(model, version, MappingProxyType(meta), path, time.time(),
                            load_s=time.perf_counter() - started)

    # -- background thread --

    def await_first_moment(self) -> None:
        """Nothing served yet but a model announced: wait for its moment (at most swap_delay_s),
        so a replica starting beside a fresh checkpoint takes traffic serving it, not saying 503."""
        queue = self._queue
        if self.current is None and queue:
            time.sleep(max(0.0, min(queue[0].swapped_at - time.time(), self.swap_delay_s)))

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
            self._stop.wait(self._next_wait())

    def _next_wait(self) -> float:
        """Until the next poll, or until a pending swap's moment if sooner, so the swap is logged
        and counted on time even when no request comes to make it."""
        queue = self._queue
        if not queue:
            return self.poll_interval_s
        return min(self.poll_interval_s, max(0.0, queue[0].swapped_at - time.time()) + 0.001)

    # -- what GET /model shows --

    def status(self) -> dict[str, Any]:
        serving = self.serving()
        queue = self._queue
        last = self.last_rejection
        decision = self._decisions.get(serving.version) if serving else None
        return {
            "pipeline": self.pipeline.describe(),
            "replica": replica_id(),  # which replica answered: the proxy picks one per request
            "run_dir": str(self.run_dir),
            **(serving.describe() if serving else {"version": None, "trained_through": None, "metrics": None,
                                                    "swapped_at": None}),
            "decision": decision.describe() if decision else None,
            "next": [{"version": m.version, "serve_at": m.swapped_at} for m in queue if m is not serving],
            "swap_delay_s": self.swap_delay_s,
            "late_swaps": self.late_swaps,
            "request_polls": self.request_polls,
            "pinned": self.pinned,
            "serving_pinned": serving is not None and serving.pinned,
            "quality_tolerance": self.quality_tolerance,
            "quality_alpha": self.quality_alpha,
            "behind": self.behind,
            "rejections": dict(self.rejections),
            "last_rejection": None if last is None else
            {"version": last.version, "kind": last.kind, "reason": last.reason, "at": last.decided_at},
        }


def _described(comparison: paired.Comparison | None) -> dict[str, Any] | None:
    return comparison.describe() if comparison is not None else None


def _signature(path: Path) -> int | None:
    try:
        return (path / checkpoint.SUMS).stat().st_mtime_ns
    except OSError:
        return None
