"""The training loop every Ray Train worker runs, top-down.

Each window: rank 0 plans it and every rank gets the plan; each rank reads its slice
(one window ahead, in the background), learns it predict-then-learn in the same number
of DDP steps as every other rank, and at checkpoint windows all ranks sum their counters
and rank 0 reports model + optimizer + offsets. Offsets are committed to the consumer
group only after `ray.train.report` has persisted the checkpoint.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import psutil
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from streamlearn import faults, heap
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import StreamlearnError
from streamlearn.ingest.stream import FINGERPRINT_MOD, Batch, WorkerStream, feature_width
from streamlearn.ingest.windows import Window, WindowPlanner
from streamlearn.logs import bind, log
from streamlearn.metrics import dead_by_reason, record_checkpoint, record_drift, record_join, record_window
from streamlearn.observe.runfiles import append_jsonl, read_last_jsonl
from streamlearn.pipeline import Pipeline, load_pipeline
from streamlearn.train import checkpoint as ckpt
from streamlearn.train.coordinator import Coordinator, await_handover, broadcast, exchange
from streamlearn.train.drift import Alarm, Watch, for_pipeline
from streamlearn.train.evidence import EvidenceSampler
from streamlearn.train.lineage import Counters, Lineage
from streamlearn.train.phases import Phases, trace_allreduce
from streamlearn.train.prequential import summarize
from streamlearn.train.writer import CheckpointWriter, Reporter

GIL_SWITCH_S = 0.0005
Stream = WorkerStream  # or raydata_stream.RayDataStream (--ingest ray-data): the same methods


def train_loop_per_worker(config: dict) -> None:
    cfg: TrainConfig = config["train"]
    kafka: KafkaSettings = config["kafka"]
    startup = Startup(config.get("started_at"))
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
    device = ray.train.torch.get_device()
    gen, warm = config.get("gen", 0), config.get("warm", False)
    faults.arm(config.get("fault", ""), rank, _run_dir(cfg))
    # Later groups trace to their own files: a resize's two groups run side by side.
    phases = Phases(rank if not gen else 1000 * gen + rank, cfg.timeline,
                    process=f"rank{rank}.group{gen}" if gen else "")
    # All that is slow to start comes before a warm group's wait: Kafka clients, the model
    # wrapped for DDP (its first use imports much of torch.distributed), the optimizer (torch.optim's
    # first optimizer imports torch._dynamo: 3-4.5 s of one core here, measured).
    stream = _stream_class(cfg, gen)(kafka, cfg.topic, cfg.dlq_topic, cfg.group_id, pipeline, rank, world, phases)
    startup.mark("kafka_clients")
    model = ray.train.torch.prepare_model(pipeline.build_model())
    optimizer = pipeline.make_optimizer(model.parameters())
    trace_allreduce(model, phases)  # only with --timeline: DDP keeps its default reduction otherwise
    startup.mark("model_ready")
    heap.quiet_for_streaming()  # what start-up built stays: collections walk only the stream's objects
    if warm and not await_handover(config["controller"], gen, rank):
        stream.close()
        phases.close()
        log("warm_group_called_off", rank=rank, gen=gen)
        return

    restore_t = time.monotonic()
    restored = _restore(cfg, rank)
    if restored:  # the same state on every rank, loaded in place under DDP
        _unwrapped(model).load_state_dict(restored[0])
        if restored[1]:
            optimizer.load_state_dict(restored[1])
    lineage = broadcast(_lineage(cfg, stream, restored) if rank == 0 else None, rank)
    if restored and rank == 0:
        _complete_restored(cfg, stream, restored[2])
    startup.mark("restored")
    stream.start(lineage.dlq_positions, restored[3] if restored else None)
    startup.mark("stream_started")
    bind(version=lineage.version)
    coordinator = _coordinator(cfg, stream, lineage, world, config.get("controller"),
                               config.get("consumed_at_start", 0)) if rank == 0 else None
    writer = CheckpointWriter(_run_dir(cfg), cfg.keep_checkpoints, stream.reader.commit,
                              resumed_from=restored[4] if restored else None) if rank == 0 else None
    reporter = Reporter(lambda metrics: ray.train.report(metrics, checkpoint=None))
    drift = for_pipeline(pipeline, feature_width(pipeline)) if rank == 0 and cfg.drift else None
    evidence = EvidenceSampler(cfg.gate_evidence) if rank == 0 and cfg.gate_evidence else None
    recent = Watch(cfg.metric_window, drift, lambda alarm: _drift_alarm(pipeline, alarm), evidence)
    delta, loss_sum, overhead_ms = Counters(), 0.0, []
    log("worker_started", pipeline=pipeline.name, rank=rank, world=world, threads=torch.get_num_threads(),
        version=lineage.version, positions=lineage.positions, restore_s=round(time.monotonic() - restore_t, 2))
    try:
        ahead: deque = deque()  # (window, its read under way), planned and not yet learned, oldest first
        last_planned: list[Window] = []

        def due() -> bool:
            # Keep the stream's lookahead of windows planned and reading (the direct path reads
            # one window ahead; Ray Data's pipeline needs several in flight to not wait on its
            # own latency), and none past the window that stops the run. The same on every
            # rank: `ahead` holds the same plans everywhere.
            return len(ahead) < stream.lookahead and not (last_planned and last_planned[0].stop)

        def start_reading(planned: Window) -> None:
            ahead.append((planned, stream.prefetch(planned)))
            last_planned[:] = [planned]

        def plan_ahead() -> None:
            while due():
                with phases("plan"):
                    start_reading(broadcast(coordinator.next_window() if coordinator else None, rank))

        plan_ahead()
        startup.mark("first_window_planned")
        while True:
            window, pending = ahead.popleft()
            with phases("wait_data"):
                batch = pending.result()
            startup.mark("first_batch_read")
            # Plan the next window (read while this one trains) and tell every rank every rank's
            # size of this one, in one collective.
            more = due()
            with phases("plan"):
                planned = coordinator.next_window() if coordinator and more else None
            with phases("sync"):
                planned, sizes = exchange(planned, batch.size, rank)
            if more:
                start_reading(planned)
            plan_ahead()  # only where the lookahead still wants more (at start, Ray Data's)
            steps, batch_loss, learned_fp = learn(model, optimizer, pipeline, batch, sizes, cfg, rank, device,
                                                  recent, phases)
            # What a window costs beyond reading and learning it: its plan and the collective carrying it.
            overhead_ms.append(1e3 * (phases.last.get("plan", 0.0) + phases.last.get("sync", 0.0)))
            stream.dead_letter(batch)
            record_window(pipeline.name, batch.size, dead_by_reason(batch.bad + batch.bad_labels),
                          steps if rank == 0 else 0)
            delta.add(Counters(batch.size, batch.dead_lettered, learned_fp, steps, expired=batch.expired,
                               labels_dead_lettered=len(batch.bad_labels), defaulted=batch.defaulted))
            if steps and startup.mark("first_step_done"):
                startup.marks["first_window_events"] = window.size  # learned before the steady rate's clock starts
            loss_sum += batch_loss
            lineage.positions.update(window.end_positions())
            if lineage.label_positions is not None:
                lineage.label_positions.update(window.label_end_positions())
            if coordinator:
                coordinator.learned(window)
            if window.checkpoint:
                with phases("checkpoint"):
                    extra = {"startup_s": startup.take(), "window_overhead_ms": round(float(np.median(overhead_ms)), 3)}
                    save(model, optimizer, pipeline, cfg, lineage, delta, loss_sum, recent, stream, writer, reporter,
                         phases, {k: v for k, v in extra.items() if v is not None}, batch.join_delta)
                delta, loss_sum, overhead_ms = Counters(), 0.0, []
            if window.stop:
                break
        if writer:
            writer.drain()  # everything this group saved is published before it ends or hands over
        if coordinator:
            coordinator.stopped()  # a resize's next group restores what this one just saved
        reporter.close()  # Ray's record of the last metrics, after the hand-over: not in its pause
    except StreamlearnError as e:  # a failure we diagnosed: why Ray Train restarts the group
        _append_row(cfg, "failures", {"t": time.time(), "rank": rank, "gen": gen, "version": lineage.version,
                                      "error": type(e).__name__, "message": str(e)[:2000]})
        raise
    finally:
        if coordinator:
            coordinator.close()
        reporter.close(wait=False)  # a failing worker must not wait on the other ranks' barrier
        if writer:
            writer.close()
        stream.close()
        phases.close()
    log("worker_stopped", rank=rank, version=lineage.version)


def learn(model, optimizer, pipeline: Pipeline, batch: Batch, sizes: list[int], cfg: TrainConfig, rank: int,
          device, recent: Watch, phases: Phases) -> tuple[int, float, int]:
    """Predict-then-learn over this rank's slice (`sizes`: every rank's, by rank), in exactly as
    many steps as every other rank. Returns (steps, summed loss, fingerprint of the rows learned)."""
    steps = max(math.ceil(n / cfg.batch_size) for n in sizes)
    if steps == 0:
        return 0, 0.0, 0
    world = len(sizes)
    # Seeded by the window's offsets, not the clock: a window replayed after a crash is
    # learned in the same order, so a resumed lineage ends with the same weights (bitwise).
    rng = np.random.default_rng([cfg.seed, rank, *(o for r in sorted(batch.window.ranges.items()) for o in r[1])])
    order = rng.permutation(batch.size)  # local shuffle across partitions
    # The window is put in its shuffled order once, and each step takes a contiguous slice of it:
    # gathering each step's rows of features, targets and fingerprints cost 60-100 us of a
    # 0.7-1.0 ms step (fraud MLP, one thread; measured).
    ends = np.cumsum([_split_size(batch.size, steps, s) for s in range(steps)]).tolist()
    totals = [sum(_split_size(n, steps, s) for n in sizes) for s in range(steps)]
    features, targets = torch.from_numpy(batch.features[order]), torch.from_numpy(batch.targets[order])
    with phases("train", events=batch.size, steps=steps):
        loss_sum, learned_fp = _steps(model, optimizer, pipeline, features, targets, batch.crcs[order], ends, totals,
                                      world, device, recent, phases)
    return steps, loss_sum, learned_fp


def _steps(model, optimizer, pipeline, features, targets, crcs, ends, totals, world, device, recent,
           phases: Phases) -> tuple[float, int]:
    """Step s learns rows [ends[s-1], ends[s]) of the shuffled window."""
    loss_sum, learned_fp, start = 0.0, 0, 0
    for end, total in zip(ends, totals, strict=True):
        rows, y_rows = features[start:end], targets[start:end]
        x, y = rows.to(device), y_rows.to(device)
        with phases("forward"):
            output = model(x)
            per_event = pipeline.loss(output, y)
            # Sum, scaled so DDP's mean over ranks equals the mean over the global batch,
            # however unevenly the window split (an empty rank still joins the allreduce).
            loss = per_event.sum() * (world / total)
        optimizer.zero_grad(set_to_none=True)
        with phases("backward"):  # DDP's allreduce overlaps this; the timeline shows it on its own track
            loss.backward()
        with phases("step"):
            optimizer.step()
        faults.point("step")
        if end > start:
            # Into the fingerprint only once the step that used them is taken: a row trained
            # twice, or skipped, shows in the lineage's fingerprint.
            learned_fp += int(crcs[start:end].sum(dtype=np.uint64))
            recent.observe(pipeline.score(output.detach()).cpu().numpy(), y_rows.numpy(), rows.numpy)
            loss_sum += float(per_event.detach().sum())
        start = end
    return loss_sum, learned_fp % FINGERPRINT_MOD


def save(model, optimizer, pipeline: Pipeline, cfg: TrainConfig, lineage: Lineage, delta: Counters,
         loss_sum: float, recent: Watch, stream: Stream, writer: CheckpointWriter | None,
         reporter: Reporter, phases: Phases, extra: dict | None = None,
         join_delta: dict[str, np.ndarray] | None = None) -> None:
    """All ranks: flush dead letters, sum counters, gather metric windows (and with joined labels
    what changed in each rank's join state). Rank 0 snapshots the model and hands it to the writer, which
    publishes, commits offsets and prunes behind training."""
    faults.point("before_dead_letter_flush")
    with phases("checkpoint.flush_dead_letters"):
        stream.dead_letters.flush()
    with phases("checkpoint.sum_counters"):
        summed = _sum_counters(delta, loss_sum)
        windows = _gather((*recent.arrays(), stream.dead_letters.written))
    with phases("checkpoint.join_state"):  # every rank's join-state delta, pickled to rank 0
        join_state = _gather_to_rank0(join_delta) if pipeline.labels else None
    lineage.totals.add(summed[0])
    lineage.version += 1
    bind(version=lineage.version)
    metrics = {"version": lineage.version, "learned": lineage.totals.learned, "phases_s": phases.take(),
               "dead_lettered": lineage.totals.dead_lettered, "steps": lineage.totals.steps,
               "train_loss": summed[1] / max(summed[0].learned, 1), **(extra or {})}
    if writer is None:
        reporter.submit(metrics)
        return
    scores = np.concatenate([w[0] for w in windows])
    targets = np.concatenate([w[1] for w in windows])
    metrics["online"] = summarize(pipeline.task, scores, targets)
    evidence = recent.take_evidence()
    metrics["ingest"] = stream.ingest_stats()
    if alarms := recent.take_alarms():
        metrics["drift"] = [alarm.as_dict() for alarm in alarms]
    lineage.dlq_positions = _dead_letter_positions(lineage.dlq_positions, [w[-1] for w in windows],
                                                   stream.dead_letters.end_at_start)
    meta = {**lineage.to_meta(), "pipeline": pipeline.describe(), "metrics": metrics, "written_at": time.time(),
            "workers": torch.distributed.get_world_size() if dist.is_initialized() else 1}
    if evidence is not None:  # events learned since the previous version, for the scorer's gate
        meta["evidence"] = {"events": len(evidence["targets"]), "after_version": lineage.version - 1}
    join = None
    if join_state is not None:
        join = {name: a for part in join_state for name, a in (part or {}).items()}
        meta["join"] = {"ttl_s": pipeline.labels.ttl_s, "max_pending": pipeline.labels.max_pending,
                        "pending": {side: sum(int(a[3]) for name, a in join.items() if name.endswith(f"/{side}.range"))
                                    for side in ("events", "labels")}}
        metrics["join"] = {**meta["join"]["pending"], "expired": lineage.totals.expired}
        if pipeline.labels.unlabelled_as is not None:  # learned with it: counted apart, never silent
            metrics["join"]["unlabelled"] = lineage.totals.defaulted
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
    with phases("checkpoint.snapshot"):
        writer.submit(version, _unwrapped(model).state_dict(), optimizer.state_dict(), meta, lineage.positions,
                      then=published, join=join, evidence=evidence)
    reporter.submit(metrics)


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

        return functools.partial(RayDataStream, gen=gen)
    return WorkerStream


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


def _coordinator(cfg: TrainConfig, stream: Stream, lineage: Lineage, world: int, controller,
                 consumed_at_start: int) -> Coordinator:
    # --max-events bounds the whole run, not each group: take off what earlier groups consumed.
    consumed = lineage.consumed() - consumed_at_start
    budget = None if cfg.max_events is None else max(0, cfg.max_events - consumed)
    labels = dict(lineage.label_positions) if lineage.label_positions is not None else None
    planner = WindowPlanner(dict(lineage.positions), cfg.window_events, budget=budget, world=stream.read_lanes,
                            label_positions=labels)
    return Coordinator(cfg, stream.reader, planner, expected_steps_per_event=1.0 / (cfg.batch_size * world),
                       world=world, controller=controller, label_reader=getattr(stream, "label_reader", None))


def _split_size(n: int, parts: int, index: int) -> int:
    """Size of part `index` when np.array_split cuts n items into `parts`."""
    return n // parts + (1 if index < n % parts else 0)


def _sum_counters(delta: Counters, loss_sum: float) -> tuple[Counters, float]:
    values = torch.tensor([delta.learned, delta.dead_lettered, delta.fingerprint, delta.steps, delta.expired,
                           delta.labels_dead_lettered, delta.defaulted], dtype=torch.int64)
    loss = torch.tensor([loss_sum], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
        dist.all_reduce(loss)
    learned, dead, fp, _steps, expired, labels_dead, defaulted = values.tolist()
    # Steps are the same on every rank (lockstep), so take one rank's count rather than the sum.
    return Counters(learned, dead, fp, delta.steps, expired, labels_dead, defaulted), float(loss.item())


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
