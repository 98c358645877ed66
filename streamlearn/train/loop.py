"""The training loop every Ray Train worker runs, top-down.

Each window: rank 0 plans it and every rank gets the plan; each rank reads its slice
(one window ahead, in the background), learns it predict-then-learn in the same number
of DDP steps as every other rank, and at checkpoint windows all ranks sum their counters
and rank 0 reports model + optimizer + offsets. Offsets are committed to the consumer
group only after the checkpoint is durable. `Worker.run` is that loop; `Worker.start` all
that comes before it; `Worker.checkpoint` what a checkpoint window adds.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from streamlearn import faults, heap
from streamlearn.collectives import broadcast, exchange
from streamlearn.config import TrainConfig
from streamlearn.errors import StreamlearnError
from streamlearn.ingest.decode import Batch, feature_width
from streamlearn.ingest.feedback import held_back
from streamlearn.ingest.rowstore import ROWS_DIR
from streamlearn.ingest.stream import Stream, WorkerStream
from streamlearn.ingest.windows import Window, WindowPlanner
from streamlearn.logs import bind, log
from streamlearn.metrics import dead_by_reason, record_checkpoint, record_drift, record_join, record_window
from streamlearn.phases import Phases, trace_allreduce
from streamlearn.pipeline import DelayedFeedback, Pipeline, load_pipeline
from streamlearn.prequential import summarize
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.runfiles import append_jsonl, read_last_jsonl
from streamlearn.train.averaging import same_start
from streamlearn.train.coordinator import Coordinator, await_handover
from streamlearn.train.drift import Alarm, Watch, for_pipeline
from streamlearn.train.evidence import EvidenceSampler
from streamlearn.train.inputs import WorkerInputs
from streamlearn.train.learner import Learner
from streamlearn.train.lineage import Counters, Lineage
from streamlearn.train.optim import keep_dynamo_out
from streamlearn.train.writer import CheckpointWriter, Reporter

GIL_SWITCH_S = 0.0005
# Ray's Train view gets a group's first and last checkpoint's metrics and one checkpoint's in
# this // checkpoint_every_s: this far apart at most (checkpoints by step count come sooner).
# Each report is a barrier across ranks, and our own checkpoints already carry every version's.
REPORT_EVERY_S = 10.0


def train_loop_per_worker(config: dict) -> None:
    worker = Worker.start(config["inputs"])
    if worker is None:
        return  # a warm group whose resize was called off
    try:
        worker.run()
    except StreamlearnError as e:  # a failure we diagnosed: why Ray Train restarts the group
        worker.record_failure(e)
        raise
    finally:
        worker.close()
    log("worker_stopped", rank=worker.rank, version=worker.lineage.version)


@dataclass
class Accrued:
    """What the windows since the last checkpoint add up to, on this rank."""

    counters: Counters = field(default_factory=Counters)
    loss: float = 0.0
    overhead_ms: list[float] = field(default_factory=list)  # each window's plan + the collective carrying it


@dataclass
class Worker:
    """One rank's state through a group's life: what it learns with, where the lineage stands,
    and (rank 0) who plans windows and writes checkpoints."""

    inputs: WorkerInputs
    rank: int
    world: int
    pipeline: Pipeline
    phases: Phases
    startup: Startup
    stream: Stream
    learner: Learner
    lineage: Lineage | None = None
    restored_from: int | None = None  # the checkpoint version this group started from, if any
    coordinator: Coordinator | None = None  # rank 0
    writer: CheckpointWriter | None = None  # rank 0
    reporter: Reporter | None = None
    accrued: Accrued = field(default_factory=Accrued)

    @property
    def cfg(self) -> TrainConfig:
        return self.inputs.train

    @classmethod
    def start(cls, inputs: WorkerInputs) -> Worker | None:
        """Everything before the first window; None if this warm group's resize was called off."""
        cfg, startup = inputs.train, Startup(inputs.started_at)
        # The reader thread decodes in Python while this one trains; each step's allreduce returns
        # into Python and waits for the GIL, by default up to 5 ms (the switch interval): 4.5 ms per
        # step measured with 2 ranks. A shorter interval hands it back within a fraction of that.
        sys.setswitchinterval(GIL_SWITCH_S)
        # Ray sets OMP_NUM_THREADS from the worker's CPUs as the actor starts, and torch reads it when
        # imported: a process that imported torch before (train/preload.py) would keep one thread per
        # core, every rank's threads fighting over the same cores.
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        ctx = ray.train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        pipeline = load_pipeline(cfg.pipeline)
        bind(pipeline=pipeline.name, rank=rank)  # on every log line from this worker, reader thread too
        torch.manual_seed(cfg.seed)
        faults.arm(inputs.fault, rank, _run_dir(cfg))
        # Later groups trace to their own files: a resize's two groups run side by side.
        phases = Phases(rank if not inputs.gen else 1000 * inputs.gen + rank, cfg.timeline,
                        process=f"rank{rank}.group{inputs.gen}" if inputs.gen else "")
        # All that is slow to start comes before a warm group's wait: Kafka clients, the model
        # wrapped for DDP (its first use imports much of torch.distributed), the optimizer.
        stream = _stream_class(cfg, inputs.gen)(inputs.kafka, cfg.topic, cfg.dlq_topic, cfg.group_id, pipeline,
                                                rank, world, phases,
                                                rows_dir=_run_dir(cfg) / ROWS_DIR if cfg.feedback_rows else None)
        startup.mark("kafka_clients")
        # --sync window: no DDP wrapper, each rank steps alone and the learner averages (averaging.py).
        model = ray.train.torch.prepare_model(pipeline.build_model(),
                                              parallel_strategy="ddp" if cfg.sync == "step" else None)
        keep_dynamo_out()  # torch.optim would import torch._dynamo: 1.2-2 s of a core (train/optim.py)
        optimizer = pipeline.make_optimizer(model.parameters())
        trace_allreduce(model, phases)  # only with --timeline: DDP keeps its default reduction otherwise
        startup.mark("model_ready")
        heap.quiet_for_streaming()  # what start-up built stays: collections walk only the stream's objects
        if inputs.warm and not await_handover(inputs.controller, inputs.gen, rank):
            stream.close()
            phases.close()
            log("warm_group_called_off", rank=rank, gen=inputs.gen)
            return None
        # On rank 0 the scored events also feed the drift monitor and the gate's evidence.
        drift = for_pipeline(pipeline, feature_width(pipeline)) if rank == 0 and cfg.drift else None
        evidence = EvidenceSampler(cfg.gate_evidence) if rank == 0 and cfg.gate_evidence else None
        # With delayed feedback those judge on matured labels only (drift.Watch, ingest/maturing.py).
        # Every rank judges its own slice's matured rows; the matured metric gathers them all.
        silent = pipeline.labels.unlabelled_as if isinstance(pipeline.labels, DelayedFeedback) else None
        recent = Watch(cfg.metric_window, drift, lambda alarm: _drift_alarm(pipeline, alarm), evidence, silent)
        learner = Learner(model, optimizer, pipeline, ray.train.torch.get_device(), recent, phases,
                          per_window=cfg.sync == "window")
        worker = cls(inputs, rank, world, pipeline, phases, startup, stream, learner)
        if world > 1 and cfg.sync == "window":
            same_start(model)  # before a restore overwrites it: one place where DDP's wrapper would be
        worker.resume()
        return worker

    def resume(self) -> None:
        """Restore the lineage's newest checkpoint (every rank the same), start the stream where it
        left off, and (rank 0) the coordinator and the checkpoint writer."""
        cfg, rank, stream, inputs = self.cfg, self.rank, self.stream, self.inputs
        restore_t = time.monotonic()
        restored = _restore(cfg, rank)
        if restored:  # the same state on every rank, loaded in place under DDP
            _unwrapped(self.learner.model).load_state_dict(restored[0])
            if restored[1]:
                self.learner.optimizer.load_state_dict(restored[1])
        self.lineage = lineage = broadcast(_lineage(cfg, stream, restored) if rank == 0 else None, rank)
        # Each checkpoint names the version its group started from: a restore shows in the lineage.
        self.restored_from = int(restored[2]["version"]) if restored else None
        if restored and rank == 0:
            _complete_restored(cfg, stream, restored[2])
        self.startup.mark("restored")
        stream.start(lineage.dlq_positions, restored[3] if restored else None)
        self.startup.mark("stream_started")
        bind(version=lineage.version)
        if rank == 0:
            self.coordinator = _coordinator(cfg, stream, lineage, self.world, inputs.controller,
                                            inputs.consumed_at_start, _holds_reports(self.pipeline))
            self.writer = CheckpointWriter(_run_dir(cfg), cfg.keep_checkpoints, stream.reader.commit,
                                           resumed_from=restored[4] if restored else None,
                                           whole_join=isinstance(self.pipeline.labels, DelayedFeedback))
        self.reporter = Reporter(lambda metrics: ray.train.report(metrics, checkpoint=None),
                                 every=int(REPORT_EVERY_S // cfg.checkpoint_every_s))
        log("worker_started", pipeline=self.pipeline.name, rank=rank, world=self.world,
            threads=torch.get_num_threads(), version=lineage.version, positions=lineage.positions,
            restore_s=round(time.monotonic() - restore_t, 2))

    def run(self) -> None:
        """Window after window, each read while the one before it trains, until one says stop."""
        readahead = ReadAhead(self.stream, self.coordinator, self.rank, self.phases, self.startup,
                              self.cfg.window_for(self.world))
        readahead.fill()
        self.startup.mark("first_window_planned")
        while True:
            window, batch, sizes = readahead.next()
            self.learn(window, batch, sizes)
            if window.checkpoint:
                with self.phases("checkpoint"):
                    self.checkpoint(batch.join_delta)
            if window.stop:
                break
        if self.writer:
            self.writer.drain()  # everything this group saved is published before it ends or hands over
        if self.coordinator:
            self.coordinator.stopped()  # a resize's next group restores what this one just saved
        self.reporter.close()  # Ray's record of the last metrics, after the hand-over: not in its pause

    def learn(self, window: Window, batch: Batch, sizes: list[int]) -> None:
        """Learn this rank's slice, dead-letter its bad events, and move the lineage past the window."""
        cfg, rank, phases = self.cfg, self.rank, self.phases
        if self.learner.recent.silent is not None:  # delayed feedback, rank 0: before the window is learned
            self.learner.judge_matured(batch)
        steps, batch_loss, learned_fp = self.learner.learn(batch, sizes, cfg.batch_size, cfg.seed, rank)
        # What a window costs beyond reading and learning it: its plan and the collective carrying it.
        self.accrued.overhead_ms.append(1e3 * (phases.last.get("plan", 0.0) + phases.last.get("sync", 0.0)))
        self.stream.dead_letter(batch)
        record_window(self.pipeline.name, batch.size, dead_by_reason(batch.bad + batch.bad_labels),
                      steps if rank == 0 else 0)
        self.accrued.counters.add(Counters(batch.size, batch.dead_lettered, learned_fp, steps, expired=batch.expired,
                                           labels_dead_lettered=len(batch.bad_labels), defaulted=batch.defaulted,
                                           ignored=batch.ignored))
        if steps and self.startup.mark("first_step_done"):
            self.startup.marks["first_window_events"] = window.size  # learned before the steady rate's clock starts
        self.accrued.loss += batch_loss
        self.lineage.positions.update(window.end_positions())
        if self.lineage.label_positions is not None:
            self.lineage.label_positions.update(window.label_end_positions())
        if self.coordinator:
            self.coordinator.learned(window)

    def checkpoint(self, join_delta: dict[str, np.ndarray] | None) -> None:
        """All ranks: flush dead letters, sum counters, gather metric windows (and with joined labels
        what changed in each rank's join state). Rank 0 snapshots the model and hands it to the
        writer, which publishes, commits offsets and prunes behind training."""
        accrued, lineage, phases, recent = self.accrued, self.lineage, self.phases, self.learner.recent
        faults.point("before_dead_letter_flush")
        with phases("checkpoint.flush_dead_letters"):
            self.stream.dead_letters.flush()
        with phases("checkpoint.sum_counters"):
            summed = _sum_counters(accrued.counters, accrued.loss)
            matured = (*recent.matured.arrays(), recent.matured_age_s) if recent.matured is not None else None
            windows = _gather((*recent.arrays(), matured, self.stream.dead_letters.written))
        with phases("checkpoint.join_state"):  # every rank's join-state delta, pickled to rank 0
            join_state = _gather_to_rank0(join_delta) if self.pipeline.labels else None
        lineage.totals.add(summed[0])
        lineage.version += 1
        bind(version=lineage.version)
        extra = {"startup_s": self.startup.take(),
                 "window_overhead_ms": round(float(np.median(accrued.overhead_ms)), 3)}
        metrics = {"version": lineage.version, "learned": lineage.totals.learned, "phases_s": phases.take(),
                   "dead_lettered": lineage.totals.dead_lettered, "steps": lineage.totals.steps,
                   "train_loss": summed[1] / max(summed[0].learned, 1),
                   **{k: v for k, v in extra.items() if v is not None}}
        self.accrued = Accrued()
        if self.writer is not None:
            self._publish(metrics, windows, join_state)
        self.reporter.submit(metrics)

    def _publish(self, metrics: dict, windows: list, join_state: list | None) -> None:
        """Rank 0: the checkpoint's meta from every rank's windows, and the model to the writer."""
        pipeline, lineage, recent, cfg = self.pipeline, self.lineage, self.learner.recent, self.cfg
        scores = np.concatenate([w[0] for w in windows])
        targets = np.concatenate([w[1] for w in windows])
        metrics["online"] = summarize(pipeline.task, scores, targets)
        if recent.matured is not None:
            metrics["matured"] = _matured(pipeline.task, [w[2] for w in windows])
        # every rank's join state, one dict: its arrays are named by partition
        join = {name: a for part in join_state for name, a in (part or {}).items()} if join_state is not None else None
        if recent.silent is not None and recent.evidence is not None and join is not None:
            self.learner.judge_pool(held_back(join))  # every rank's held reports, scored by the candidate itself
        evidence = recent.take_evidence()
        metrics["ingest"] = {**self.stream.ingest_stats(), "why": cfg.ingest_why}
        if alarms := recent.take_alarms():
            metrics["drift"] = [alarm.as_dict() for alarm in alarms]
        lineage.dlq_positions = _dead_letter_positions(lineage.dlq_positions, [w[-1] for w in windows],
                                                       self.stream.dead_letters.end_at_start)
        meta = {**lineage.to_meta(), "pipeline": pipeline.describe(), "metrics": metrics, "written_at": time.time(),
                "workers": self.world, "restored_from": self.restored_from}
        if evidence is not None:  # events learned since the previous version, for the scorer's gate
            meta["evidence"] = {"events": len(evidence["targets"]), "after_version": lineage.version - 1}
        if join is not None:
            _join_meta(pipeline, meta, metrics, lineage, join)
        version, totals = lineage.version, dict(vars(lineage.totals))

        def published() -> None:  # in the writer's thread, once the checkpoint is durable and committed
            _append_row(cfg, "history", _history_row(meta))
            record_checkpoint(pipeline.name, version, metrics["train_loss"], metrics["online"], meta["written_at"])
            if "join" in metrics:  # expiry is counted and shown, never silent
                record_join(pipeline.name, meta["join"]["pending"], metrics["join"]["expired"],
                            metrics["join"].get("unlabelled"))
            log("checkpoint", pipeline=pipeline.name, rank=0, version=version, learned=totals["learned"],
                dead_lettered=totals["dead_lettered"], online=metrics["online"], train_loss=metrics["train_loss"])

        # Our store, not Ray Train's (DECISIONS §17): Ray gets the metrics only.
        model, optimizer = _unwrapped(self.learner.model), self.learner.optimizer
        with self.phases("checkpoint.snapshot"):
            self.writer.submit(version, model.state_dict(), optimizer.state_dict(), meta, lineage.positions,
                               then=published, join=join, evidence=evidence)

    def record_failure(self, e: StreamlearnError) -> None:
        _append_row(self.cfg, "failures", {"t": time.time(), "rank": self.rank, "gen": self.inputs.gen,
                                           "version": self.lineage.version if self.lineage else None,
                                           "error": type(e).__name__, "message": str(e)[:2000]})

    def close(self) -> None:
        if self.coordinator:
            self.coordinator.close()
        self.reporter.close(wait=False)  # a failing worker must not wait on the other ranks' barrier
        if self.writer:
            self.writer.close()
        self.stream.close()
        self.phases.close()


class ReadAhead:
    """The windows planned and reading beyond the one being learned, oldest first: the stream's
    lookahead (the direct path reads one window ahead; Ray Data's pipeline needs several in flight
    to not wait on its own latency), and none past the window that stops the run. Behind a
    backlog (the last window planned came out full) the stream's `lookahead`; caught up, its
    `lookahead_at_pace`, as there more windows ahead only hold new events back longer. The same
    on every rank: each gets every plan from rank 0."""

    def __init__(self, stream: Stream, coordinator: Coordinator | None, rank: int, phases: Phases,
                 startup: Startup, full_window: int):
        self.stream, self.coordinator, self.rank, self.phases, self.startup = stream, coordinator, rank, phases, startup
        self.full_window = full_window  # events in a window planned behind a backlog (cfg.window_for)
        self.ahead: deque[tuple[Window, Any]] = deque()  # (window, its read under way)
        self.last: Window | None = None

    def fill(self) -> None:
        """Plan (rank 0) and start reading windows while the lookahead wants more (at start, Ray Data's)."""
        while self._due():
            with self.phases("plan"):
                self._read(broadcast(self.coordinator.next_window() if self.coordinator else None, self.rank))

    def next(self) -> tuple[Window, Batch, list[int]]:
        """The oldest window, read; every rank's size of it; and the next window planned and reading
        while this one trains (its plan and the sizes in one collective)."""
        window, pending = self.ahead.popleft()
        with self.phases("wait_data"):
            batch = pending.result()
        self.startup.mark("first_batch_read")
        more = self._due()
        with self.phases("plan"):
            planned = self.coordinator.next_window() if self.coordinator and more else None
        with self.phases("sync"):
            planned, sizes = exchange(planned, batch.size, self.rank)
        if more:
            self._read(planned)
        self.fill()
        return window, batch, sizes

    def _due(self) -> bool:
        if self.last is None:
            return True
        if self.last.stop:
            return False
        behind = self.last.size >= self.full_window
        return len(self.ahead) < (self.stream.lookahead if behind else self.stream.lookahead_at_pace)

    def _read(self, planned: Window) -> None:
        self.ahead.append((planned, self.stream.prefetch(planned)))
        self.last = planned


def _join_meta(pipeline: Pipeline, meta: dict, metrics: dict, lineage: Lineage, join: dict) -> None:
    """With joined labels: the join state's counts in the meta and metrics."""
    meta["join"] = {"ttl_s": pipeline.labels.ttl_s, "max_pending": pipeline.labels.max_pending,
                    "pending": {side: sum(int(a[3]) for name, a in join.items() if name.endswith(f"/{side}.range"))
                                for side in ("events", "labels")}}
    # Delayed feedback's reports held until their events are learned, or held back from learning
    # for the gate's evidence (ingest/feedback.py), wait too.
    meta["join"]["pending"]["labels"] += sum(len(a) for name, a in join.items()
                                             if name.endswith(("/held.length", "/waiting.y")))
    metrics["join"] = {**meta["join"]["pending"], "expired": lineage.totals.expired}
    if pipeline.labels.unlabelled_as is not None:  # learned with it: counted apart, never silent
        metrics["join"]["unlabelled"] = lineage.totals.defaulted
    if isinstance(pipeline.labels, DelayedFeedback):  # reports applied, and those that changed nothing
        metrics["join"]["reports"] = lineage.totals.learned - lineage.totals.defaulted
        metrics["join"]["ignored"] = lineage.totals.ignored


class Startup:
    """Where a group's first seconds go, as seconds since `streamlearn train` started (or since
    the worker process started, when the driver's clock is not known): reported once, with
    the group's first checkpoint, and drawn from by load/bench/ingest.py's time-to-first-step."""

    def __init__(self, started_at: float | None):
        process = psutil.Process().create_time()
        self.origin, self._taken = started_at or process, False
        self.marks: dict[str, float] = {"worker_process": process - self.origin}
        self.mark("loop_entered")

    def mark(self, name: str) -> bool:
        """Record `name` the first time it is reached; True then."""
        if name in self.marks or self._taken:
            return False
        self.marks[name] = round(time.time() - self.origin, 3)
        return True

    def take(self) -> dict[str, float] | None:
        """The marks, the first time only."""
        if self._taken:
            return None
        self._taken = True
        return dict(self.marks)


def _drift_alarm(pipeline: Pipeline, alarm: Alarm) -> None:
    """Rank 0, as a detector fires: logged and counted now, in the next checkpoint's history row."""
    record_drift(pipeline.name, alarm.signal, time.time())
    log("drift_detected", pipeline=pipeline.name, rank=0, **alarm.as_dict())


def _stream_class(cfg: TrainConfig, gen: int):
    if cfg.ingest == "ray-data":
        from streamlearn.ingest.raydata_stream import RayDataStream  # Ray Data's import is seconds: only when used

        return functools.partial(RayDataStream, gen=gen, lanes=cfg.read_lanes)
    return WorkerStream


def _matured(task: str, ranks: list[tuple[np.ndarray, np.ndarray, float | None]]) -> dict:
    """Delayed feedback: every rank's newest matured rows (reports, and a sample of the events that
    matured unreported), each scored by the model of its window, and the oldest of the ranks' ages
    of them. AUC only: the sample's fraud share is not the stream's, so log loss and calibration
    on it would mislead."""
    scores, targets = np.concatenate([r[0] for r in ranks]), np.concatenate([r[1] for r in ranks])
    summary = summarize(task, scores, targets)
    ages = [r[2] for r in ranks if r[2] is not None]
    return {"window": summary["window"], "positives": int((targets > 0.5).sum()), "auc": summary.get("auc"),
            "age_s": round(max(ages), 1) if ages else None}


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def _history_row(meta: dict) -> dict:
    """A checkpoint's row of history.jsonl, from its meta: counters, loss, phases, join and drift,
    start-up marks where the group had them, and the online metrics flattened."""
    metrics = meta["metrics"]
    return {"version": meta["version"], "t": meta["written_at"], "workers": meta.get("workers"),
            **{k: meta["counters"][k] for k in ("learned", "dead_lettered", "steps")},
            **{k: v for k, v in metrics.items() if k not in _NOT_IN_HISTORY}, **metrics["online"]}


_NOT_IN_HISTORY = ("version", "learned", "dead_lettered", "steps", "online", "ingest")


def _complete_restored(cfg: TrainConfig, stream: Stream, meta: dict) -> None:
    """Rank 0, restoring: a group killed between a checkpoint's publish and its commit (the aimed
    fault `after_publish_before_commit`) left the consumer group's offsets and the checkpoint's
    history row behind it, and with nothing left to learn no later checkpoint would bring them
    level. The checkpoint is durable, so committing its offsets again is always right."""
    stream.reader.commit({int(p): o for p, o in meta["offsets"].items()})
    newest = read_last_jsonl(_run_dir(cfg) / "history.jsonl") or {}  # rows come in version order
    if "metrics" in meta and newest.get("version", 0) < meta["version"]:
        _append_row(cfg, "history", _history_row(meta))


def _append_row(cfg: TrainConfig, name: str, row: dict) -> None:
    """One JSON line in <run dir>/<name>.jsonl: history (one per checkpoint, the curves `streamlearn
    report` draws) and failures (one per group failure a worker diagnosed; `streamlearn status`
    shows the newest: Ray Train restarts the group; a worker that died without a word gets its
    row from Ray Train's controller, train/failures.py)."""
    append_jsonl(_run_dir(cfg) / f"{name}.jsonl", row)


def _restore(cfg: TrainConfig, rank: int) -> tuple[dict, dict | None, dict, dict, Path] | None:
    """The lineage's newest complete checkpoint, verified (a corrupt one raises: an older one
    would learn events twice). From the run directory, not Ray Train's `get_checkpoint()`: a
    run's checkpoint is whatever the group before it stopped at, and that group may have been
    another Ray Train run still shutting down (a warm resize) or one killed before Ray
    registered its last report. Rank 0 picks; every rank loads that one."""
    path = ckpt.restore_point(_run_dir(cfg)) if rank == 0 else None
    path = broadcast(str(path) if path else None, rank)
    return (*ckpt.load(path), ckpt.load_arrays(path), Path(path)) if path else None


def _run_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.checkpoint_dir) / cfg.run_name


def _lineage(cfg: TrainConfig, stream: Stream, restored) -> Lineage:
    """Rank 0: continue the checkpoint's lineage, or start one at the topic's oldest events."""
    if restored:
        lineage = Lineage.from_meta(restored[2])
    else:
        lows = {p: low for p, (low, _high) in stream.reader.watermarks(stream.reader.partitions()).items()}
        lineage = Lineage(cfg.topic, start_offsets=dict(lows), positions=dict(lows))
    if getattr(stream, "label_reader", None) is not None and lineage.label_positions is None:
        # Joined labels start where the labels topic starts (a lineage may also switch to them).
        reader = stream.label_reader
        lows = {p: low for p, (low, _high) in reader.watermarks(reader.partitions()).items()}
        lineage.label_start_offsets, lineage.label_positions = dict(lows), dict(lows)
    # Versions only move forward, even past a checkpoint written but never registered by Ray.
    on_disk = ckpt.list_checkpoints(_run_dir(cfg))
    lineage.version = max([lineage.version, *(v for v, _ in on_disk)])
    return lineage


def _holds_reports(pipeline: Pipeline) -> bool:
    """Delayed feedback that holds reports back from learning (ingest/feedback.py): the run's last
    window learns them all, so it is a checkpoint even if it planned nothing new (a resize's stop
    window, which keeps them held for the next group, checkpoints as every hand-over does)."""
    return isinstance(pipeline.labels, DelayedFeedback) and min(pipeline.labels.hold_events, pipeline.labels.hold_s) > 0


def _coordinator(cfg: TrainConfig, stream: Stream, lineage: Lineage, world: int, controller,
                 consumed_at_start: int, checkpoint_at_stop: bool = False) -> Coordinator:
    # --max-events bounds the whole run, not each group: take off what earlier groups consumed.
    consumed = lineage.consumed() - consumed_at_start
    budget = None if cfg.max_events is None else max(0, cfg.max_events - consumed)
    labels = dict(lineage.label_positions) if lineage.label_positions is not None else None
    planner = WindowPlanner(dict(lineage.positions), cfg.window_for(world), budget=budget, world=stream.read_lanes,
                            label_positions=labels)
    return Coordinator(cfg, stream.reader, planner, expected_steps_per_event=1.0 / (cfg.batch_size * world),
                       world=world, controller=controller, label_reader=getattr(stream, "label_reader", None),
                       checkpoint_at_stop=checkpoint_at_stop)


def _sum_counters(delta: Counters, loss_sum: float) -> tuple[Counters, float]:
    values = torch.tensor([delta.learned, delta.dead_lettered, delta.fingerprint, delta.steps, delta.expired,
                           delta.labels_dead_lettered, delta.defaulted, delta.ignored], dtype=torch.int64)
    loss = torch.tensor([loss_sum], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
        dist.all_reduce(loss)
    learned, dead, fp, _steps, expired, labels_dead, defaulted, ignored = values.tolist()
    # Steps are the same on every rank (lockstep), so take one rank's count rather than the sum.
    return Counters(learned, dead, fp, delta.steps, expired, labels_dead, defaulted, ignored), float(loss.item())


def _dead_letter_positions(last: dict[int, int], written: list[dict[int, int]],
                           end_at_start: dict[int, int]) -> dict[int, int]:
    """Where a replay's scan of the dead-letter topic for what it already wrote starts: any bound
    below every dead letter written after this checkpoint will do. Every rank flushed its dead
    letters before the checkpoint and its producer knows the offset after the last one it
    delivered, so the largest of those (and of the last positions) is such a bound, with no
    broker round trip: asking the broker for the topic's end cost ~15 ms of rank 0's training
    thread a checkpoint, which every rank then waited for. A lineage's first checkpoint has no
    last positions: it starts from the topic's end as this rank's scan read it at start
    (`DeadLetters.end_at_start`), which every later dead letter lies past."""
    out = dict(last or end_at_start)
    for ends in written:
        for p, end in ends.items():
            out[p] = max(out.get(p, 0), end)
    return out


def _gather_to_rank0(obj) -> list | None:
    """Every rank's `obj`, on rank 0 only (None elsewhere): a join state is for the checkpoint."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def _gather(arrays):
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [arrays]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, arrays)
    return out
