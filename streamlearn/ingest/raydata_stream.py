"""One rank's view of the stream with `--ingest ray-data`: decoded window slices from Ray Data.

Rank 0 builds the group's Dataset (raydata_source.py) as the worker starts, splits it
`streaming_split(world, equal=False)` and hands each rank its iterator; a thread per rank
pulls decoded slices into a local queue. Slices of one window land on any
rank, so no rank can tell from its own rows that a window is complete. Completion is a
count across ranks: every rank polls its queue and joins a small allreduce of the rows it
holds for the window until the sum equals the window's offsets (valid and dead-lettered).
Slices of later windows wait in a stash, untouched: a checkpoint claims exactly the windows
learned, never a row beyond them.

Bad events come with their slices (bytes, reason, coordinates); the rank that learns a
window writes its dead letters after learning it, as the direct path does, so the
dead-letter contract is the direct path's, tested the same way.

With joined labels the lanes join (raydata_source.py) and every lane sends a row for every
window, so a window is complete at its messages plus one per lane; a checkpoint window's rows
carry each lane's join state, which the ranks gather into the checkpoint as the direct path's
ranks gather their own.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path

import numpy as np
import ray
import torch
import torch.distributed as dist
from ray.util.placement_group import remove_placement_group

from streamlearn import faults
from streamlearn.collectives import broadcast
from streamlearn.config import KafkaSettings
from streamlearn.errors import IngestError
from streamlearn.ingest import raydata_source as source
from streamlearn.ingest.deadletter import DeadLetters
from streamlearn.ingest.decode import Batch, featurize
from streamlearn.ingest.reader import Message, RangeReader
from streamlearn.ingest.windows import Window
from streamlearn.logs import log
from streamlearn.phases import Phases
from streamlearn.pipeline import Pipeline

LANES = 2  # read tasks (Kafka consumers) in the Dataset by default (TrainConfig.read_lanes); each reads and decodes
# whole partitions of every window
POLL_S = 0.005  # how long a rank waits for a slice before the next completion count
# No slice at all for this long while a window is incomplete: the pipeline stalled. The group
# fails, and Ray Train restarts it from the last checkpoint (exactly once either way), where
# waiting on would stop learning for good: a fresh-clone CI run saw a warm group's Dataset
# deliver its first slices and then nothing for 14 minutes. Far above a broker outage's wait
# (the lanes read again when the broker is back) and any slice's latency (~0.5 s on two cores).
STALL_S = 120.0
# Rows that are lost, not late: every lane has read past the window (the feed saw each ask for
# a later one), so each lane's slice of it was yielded, and Ray Data hands a lane's blocks out in
# the order they were yielded, yet the window is still incomplete this long after. Seen twice
# (DECISIONS §1: a read task's first blocks never reached a rank); failing here restarts the
# group ~90 s sooner than STALL_S. Far above a yielded slice's way to a rank (~0.5 s, two cores).
LOST_S = 30.0
LOST_CHECK_S = 5.0  # rank 0 asks the feed where the lanes are at most this often, only while waiting
_END = object()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
BEHIND_S = 0.5  # what the aimed fault `ray_data_rank_behind` holds each slice back on its rank


class RayDataStream:
    read_lanes = LANES  # the planner cuts windows for the lanes, not the ranks (set per run in __init__)
    # Windows fed ahead of the one being learned. With one, every window waited out the whole
    # pipeline's latency (feed, read task, then a decode actor, split coordinator: ~0.5 s a
    # window on two cores, measured) and training ran at 0.39x the direct path. The cost is per window and
    # block, not per event (8 lanes were 6x slower than 2 on 16 cores): one window a block, 3 ahead
    # gave 0.41x direct with 2 workers here, 12 0.66x, 32 about the same (2026-12-01); with blocks
    # of up to 8 windows, 24 ahead pays (raydata_source.WINDOWS_PER_BLOCK). Caught up with the
    # stream, 12: a window ahead there only holds new events back (train/loop.py: ReadAhead).
    lookahead = source.LOOKAHEAD
    lookahead_at_pace = source.LOOKAHEAD_AT_PACE

    def __init__(self, settings: KafkaSettings, topic: str, dlq_topic: str, group_id: str, pipeline: Pipeline,
                 rank: int, world: int, phases: Phases | None = None, rows_dir: Path | None = None,
                 gen: int = 0, lanes: int = LANES):
        # WorkerStream's constructor (once per group) and the group's number, which names its Dataset.
        self.settings, self.topic, self.dlq_topic, self.group_id = settings, topic, dlq_topic, group_id
        self.pipeline, self.rank, self.world = pipeline, rank, world
        self.gen = gen  # the run's group number: a warm resize runs two groups' Datasets at once
        self.read_lanes = lanes
        self.rows_dir = rows_dir  # the lanes' row store (delayed feedback), handed over by the feed
        self.phases = phases or Phases(rank)
        # Rank 0 plans, commits and scans the dead-letter topic; the other ranks only receive.
        self.reader = RangeReader(settings, topic, group_id) if rank == 0 else None
        # Joined labels: rank 0 plans the labels topic's windows too (its watermarks); lanes read it.
        self.label_topic = topic + pipeline.labels.suffix if pipeline.labels else None
        self.label_reader = RangeReader(settings, self.label_topic, group_id) if rank == 0 and pipeline.labels else None
        self.dead_letters = DeadLetters(settings, dlq_topic, topic)
        x0, y0, _, _ = featurize(pipeline, [], [], [])  # the empty shapes, for a rank that gets no slice
        self._empty = (np.asarray(x0), np.asarray(y0))
        self._queue: queue.Queue = queue.Queue()
        self._stash: dict[int, list[dict]] = {}
        self._ended = False
        self._feed = None
        self._room = None  # rank 0: the lanes' placement group
        self._split = None  # rank 0: every rank's iterator, which keeps the split coordinator alive
        self.stats = {"read_s": 0.0, "decode_s": 0.0, "slices": 0}
        self.dataset_name = f"streamlearn-{group_id}"
        self._open()

    def _open(self) -> None:
        """Rank 0 builds the group's Dataset and every rank starts pulling at once: Ray Data's
        workers (read lanes, the split coordinator) start while the trainers
        build the model and restore. Nothing flows before rank 0 feeds the first window."""
        iterators = None
        if self.rank == 0:
            self._feed = source.WindowFeed.remote(self.rows_dir)
            self._room = source.reserve_lanes(f"{self.dataset_name}-lanes-g{self.gen}", self.read_lanes)
            ds = source.build(self.settings, self.topic, self.group_id, self.pipeline,
                              self._feed, self.read_lanes, self.dataset_name, self._room)
            iterators = ds.streaming_split(self.world, equal=False)  # equal=True would drop rows
            # The other ranks' copies reach them through the process group, not through Ray, so
            # Ray does not count them: once rank 0's own iterator was done and dropped, the split
            # coordinator was destroyed under a rank still pulling its last slices (ActorDiedError,
            # "all references to the actor were removed", ingest benchmark 2026-11-28).
            self._split = iterators
        iterator = broadcast(iterators, self.rank)[self.rank]
        threading.Thread(target=self._pump, args=(iterator,), name=f"ray-data-{self.rank}", daemon=True).start()

    def start(self, dlq_positions: dict[int, int], join_state: dict[str, np.ndarray] | None = None) -> None:
        """After restore: remember the dead letters written past the checkpoint, to skip them;
        rank 0 hands the checkpoint's join state to the lanes (before the first window is put:
        this waits for it, and a lane takes the state with its first window)."""
        self.dead_letters.skip_written_since(dlq_positions)
        if self.rank == 0 and self.label_topic is not None:
            ray.get(self._feed.set_join_state.remote(join_state or {}))

    def _expected(self, window: Window) -> int:
        """Rows the ranks together hold once the window is complete."""
        return window.messages + self.read_lanes if self.label_topic is not None else window.size

    def _pump(self, iterator) -> None:
        try:
            # No prefetch window: with one, Ray Data holds a block back until the window fills, and
            # a rank that gets one slice of the last window fed would wait for a slice never coming.
            for table in iterator.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0):
                if faults.delays("ray_data_rank_behind"):  # only where a test aimed it
                    time.sleep(BEHIND_S)
                if not faults.drops("ray_data_slice_lost"):
                    self._queue.put(table)
        except BaseException as e:  # handed to the training thread, which raises it
            self._queue.put(e)
        else:
            self._queue.put(_END)

    def prefetch(self, window: Window) -> _Pending:
        """Rank 0 feeds the window to the Dataset's lanes; every rank collects it later."""
        if self.rank == 0:
            self._feed.put.remote(window)  # may run out of order (an async actor): lanes take windows by seq
        return _Pending(self, window)

    def collect(self, window: Window) -> Batch:
        started = time.perf_counter()
        with self.phases("fetch", window=window.seq):
            rows = self._rows_of(window)
        with self.phases("decode", window=window.seq, slices=len(rows)):
            batch = self._batch(window, rows)
        batch.read_s = time.perf_counter() - started
        return batch

    def _rows_of(self, window: Window) -> list[dict]:
        """This rank's slices of `window`, once all ranks together hold every one of its offsets."""
        mine = self._stash.pop(window.seq, [])
        held, expected = sum(r["rows"] for r in mine), self._expected(window)
        progress, warned = time.monotonic(), False
        lanes = _LanesPast(self, window.seq)
        while True:
            # With the count, how many ranks' streams have ended: one rank's end says only that
            # no more comes to it. Another rank may still have its last slices on the way (a
            # checkpoint window's slices carry the lanes' join state, 100+ MB at 1M pending).
            total, ended = _sum_across_ranks(held, int(self._ended)) if self.world > 1 else (held, int(self._ended))
            if total == expected:
                return mine
            if total > expected:
                raise IngestError(f"window {window.seq}: {total} rows arrived for {expected} expected")
            if ended == self.world:
                raise IngestError(f"window {window.seq}: the Ray Data stream ended on every rank with {total} of "
                                  f"its {expected} rows delivered. {self._diagnosis()}")
            if (lost_s := lanes.lost_for(progress)) > LOST_S:
                raise IngestError(f"window {window.seq}: {total} of its {expected} rows arrived, and every read lane "
                                  f"read past it {lost_s:.0f} s ago: Ray Data lost its slices (the "
                                  f"group restarts from its last checkpoint). {self._diagnosis()}")
            if not warned and time.monotonic() - progress > STALL_S / 2:
                # Whichever rank reaches the limit first fails the group, and only rank 0 holds the
                # feed: each says what it sees while the group still lives (a stall in the ingest
                # benchmark, 2026-11-26, failed on rank 1 and left no diagnosis).
                warned = True
                log("ray_data_window_waiting", level="warning", window=window.seq, arrived=total,
                    size=expected, stash=sorted(self._stash), diagnosis=self._diagnosis())
            if time.monotonic() - progress > STALL_S:
                raise IngestError(f"window {window.seq}: {total} of its {expected} rows arrived and no slice "
                                  f"came for {STALL_S:.0f} s; the Ray Data pipeline stalled (the group restarts "
                                  f"from its last checkpoint). {self._diagnosis()}")
            rows = self._take(POLL_S if self.world > 1 else 1.0)
            if rows:
                progress = time.monotonic()
            for row in rows:
                if row["window"] == window.seq:
                    mine.append(row)
                    held += row["rows"]
                elif row["window"] > window.seq:
                    self._stash.setdefault(row["window"], []).append(row)
                else:
                    raise IngestError(f"a slice of window {row['window']} arrived after it was learned")

    def feed_state(self) -> dict | None:
        """Rank 0: the feed's view of the lanes (`WindowFeed.state`); None where this rank has no
        feed or it did not answer in time."""
        if self._feed is None:
            return None
        try:
            return ray.get(self._feed.state.remote(), timeout=10)
        except Exception:  # noqa: BLE001 -- a diagnosis must not hide the stall it describes
            return None

    def _diagnosis(self) -> str:
        """Rank 0: what the feed saw of the lanes, and what the cluster had left (for the log a
        stall leaves behind; its cause is still open, DECISIONS §1)."""
        if self._feed is None:
            return ""
        try:
            free = ray.available_resources()
        except Exception:  # noqa: BLE001 -- as above
            free = "unavailable"
        return f"Feed: {self.feed_state() or 'unavailable'}; stash: {sorted(self._stash)}; available: {free}"

    def _take(self, timeout: float) -> list[dict]:
        if self._ended:  # nothing more comes here; the others may still be receiving theirs
            time.sleep(timeout)
            return []
        try:
            items = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        rows = []
        for item in items:
            if item is _END:
                self._ended = True
            elif isinstance(item, BaseException):
                said = _ANSI.sub("", str(item))  # Ray colours its task errors for a terminal
                raise IngestError(f"Ray Data stream failed: {type(item).__name__}: {said[:500]}") from item
            else:
                rows.extend(source.unpack(item))
        return rows

    def _batch(self, window: Window, rows: list[dict]) -> Batch:
        x0, y0 = self._empty
        xs, ys, crcs, bad, bad_labels, join = [x0], [y0], [np.empty(0, np.uint32)], [], [], None
        expired = defaulted = ignored = 0
        matured, ages = [], []
        for r in rows:
            y = np.frombuffer(r["y"], dtype=r["y_dtype"])
            xs.append(np.frombuffer(r["x"], dtype=r["x_dtype"]).reshape(len(y), *x0.shape[1:]))
            ys.append(y)
            crcs.append(np.frombuffer(r["crc"], dtype=np.uint32))
            bad.extend(_dead(r, "bad"))
            bad_labels.extend(_dead(r, "bad_label"))
            expired += r["expired"]
            defaulted += r["defaulted"]
            ignored += r["ignored"]
            if r["matured"]:
                matured.append(np.frombuffer(r["matured"], dtype=r["x_dtype"]).reshape(-1, *x0.shape[1:]))
            if r["matured_age_s"] is not None:
                ages.append(r["matured_age_s"])
            if (state := source.read_join_state(r)) is not None:  # a checkpoint window: each lane's state
                join = {**(join or {}), **state}
            self.stats["read_s"] += r["read_s"]
            self.stats["decode_s"] += r["decode_s"]
            self.stats["slices"] += 1
        # Copies: frombuffer views are read-only, and torch wants writable arrays.
        return Batch(window, np.concatenate(xs), np.concatenate(ys), np.concatenate(crcs), bad,
                     bad_labels=bad_labels, expired=expired, defaulted=defaulted, ignored=ignored,
                     join_delta=(join or {}) if window.checkpoint and self.label_topic is not None else None,
                     matured=np.concatenate(matured) if matured else None, matured_age_s=max(ages, default=None))

    def ingest_stats(self) -> dict:
        """Since the last checkpoint, for its metrics and `streamlearn status`: the Ray Data stage's
        work on the slices this rank learned (read, parsed and featurized in the lanes)."""
        stats, self.stats = self.stats, {"read_s": 0.0, "decode_s": 0.0, "slices": 0}
        return {"mode": "ray-data", "dataset": self.dataset_name, "lanes": self.read_lanes,
                **{k: round(v, 3) for k, v in stats.items()}}

    def dead_letter(self, batch: Batch) -> None:
        """After the window is learned, in window order: the same contract as the direct path."""
        for message, reason in batch.bad:
            self.dead_letters.send(message, reason)
        for message, reason in batch.bad_labels:
            self.dead_letters.send(message, reason, source_topic=self.label_topic)

    def close(self) -> None:
        if self._feed is not None:
            ray.kill(self._feed)  # the lanes' next ask fails and the Dataset ends with the group
        if self._room is not None:
            remove_placement_group(self._room)  # ends what is left of the lanes
        self._split = None
        self.dead_letters.close()
        for reader in (self.reader, self.label_reader):
            if reader is not None:
                reader.close()


class _LanesPast:
    """Rank 0, while a window waits: since when has every lane read past it? Asks the feed only
    once no slice has come for `LOST_CHECK_S`, and then at most that often."""

    def __init__(self, stream: RayDataStream, seq: int):
        self.stream, self.seq = stream, seq
        self.asked = self.since = None

    def lost_for(self, progress: float) -> float:
        """Seconds the window's slices have been lost for: every lane past it and no slice since."""
        now = time.monotonic()
        if self.stream._feed is None or now - progress < LOST_CHECK_S:
            return 0.0
        if self.asked is None or now - self.asked >= LOST_CHECK_S:
            self.asked = now
            state = self.stream.feed_state()
            lanes = (state or {}).get("lanes", {})
            past = len(lanes) == self.stream.read_lanes and all(
                ask["after"] is not None and ask["after"] >= self.seq for ask in lanes.values())
            self.since = (self.since or now) if past else None
        return now - max(self.since, progress) if self.since is not None else 0.0


class _Pending:
    """What `prefetch` returns: `result()` collects the window (a collective: every rank calls it)."""

    def __init__(self, stream: RayDataStream, window: Window):
        self.stream, self.window = stream, window

    def result(self) -> Batch:
        return self.stream.collect(self.window)


def _dead(row: dict, prefix: str) -> list[tuple[Message, str]]:
    """A decoded slice's dead letters of one kind ("bad": events, "bad_label": labels)."""
    columns = (row[f"{prefix}_partition"], row[f"{prefix}_offset"], row[f"{prefix}_reason"], row[f"{prefix}_value"])
    return [(Message(p, o, value), reason) for p, o, reason, value in zip(*columns, strict=True)]


def _sum_across_ranks(*counts: int) -> tuple[int, ...]:
    value = torch.tensor(counts, dtype=torch.int64)
    dist.all_reduce(value)
    return tuple(int(v) for v in value.tolist())
