"""The Ray Data side of `--ingest ray-data`: one long-lived Dataset that reads the planner's
windows from Kafka, decodes them on Ray Data workers, and streams them to the ranks.

Ray Data 2.60 has no unbounded source, and one Dataset per window costs seconds per window
(docs/DECISIONS.md §1). So the Dataset is built once per worker group and never ends until
the run does: its read tasks are *lanes*, each a generator that takes window after window
from a `WindowFeed` actor (rank 0 puts each planned window there) and reads its share of the
window's offsets with the same long-lived `RangeReader` as the direct path, and decodes them
where it read them (`decode_events`, the direct path's decoder: parse, validate, featurize),
passing bad events on with their reasons (the ranks dead-letter them, as in the direct path).
The ranks receive decoded windows through `streaming_split(equal=False)`, in whatever order and
on whatever rank Ray Data hands them out. (A decode stage of its own, `map_batches`, which Ray
Data fused into the read, took the raw messages from the read as a pickled row: 0.78 us a
message to build, pickle and unpickle, ~12 % of a lane's CPU in py-spy, to hand them over
inside one process.)

With joined labels (`fraud_delayed`), a lane also reads its partitions of `<topic>.labels` and
joins them in the lane, in a `LabelJoin` (delayed feedback: a `ReportFeedback`) that lives as
long as the lane: windows with labels go by partition and the lanes are fixed for the Dataset's
life, so partition p of both topics is always joined by lane p % lanes, as a rank joins it in
the direct path. The lane takes the
checkpoint's join state from the feed before its first window, and puts its state into the
row of every checkpoint window (the ranks gather it into the checkpoint). A lane that Ray Data
ran again would start from a stale state: it rereads a window already delivered, and the ranks
refuse the duplicate rows, so the group restarts from its checkpoint instead.

A lane's slices travel as ONE row, one block: every window the feed already holds for the lane
(up to WINDOWS_PER_BLOCK) is read, decoded and sent together, as a pickled list of per-slice
dicts (`pack`/`unpack`, its feature matrix as bytes). Ray
Data's read operator buffers a generator's output until a block exceeds `target_max_block_size`
(128 MiB by default): a stream's small windows would never leave the read task. With the target
at one byte every yielded row is a block of its own; a row being a whole pack, nothing is ever
cut smaller. Ray Data's cost is per block, not per event (8 lanes were 6x slower than 2 on 16
cores), so a lane behind a backlog sends several windows a block, and one at the stream's pace.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from streamlearn import faults, heap
from streamlearn.config import KafkaSettings
from streamlearn.errors import KafkaUnavailable
from streamlearn.ingest.decode import Batch, decode_events
from streamlearn.ingest.feedback import make_join
from streamlearn.ingest.reader import RangeReader
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import Pipeline

# A lane reads its share of each window and decodes it (JSON parsing is its CPU cost). On two
# cores it must leave the trainers their share: a fraction, never Ray's 1 CPU.
LANE_CPUS = 0.25
# Windows fed ahead of the one being learned behind a backlog (RayDataStream.lookahead) and once
# caught up with the stream (train/loop.py: ReadAhead), and the recent windows the feed keeps: a
# lane is at most LOOKAHEAD behind the newest, the rest is margin.
LOOKAHEAD = 24
LOOKAHEAD_AT_PACE = 12
KEEP_WINDOWS = LOOKAHEAD + 20
# The most windows a lane reads and sends as one block: those the feed already holds, never
# waiting for more (at the stream's pace a block is one window). A third of the look-ahead, so a
# block in flight leaves the lane two more to read while the ranks learn it. With 2 workers on 2
# cores, 24 ahead and 8 a block learned at 1.30-1.61x direct where 12 and 4 did 0.79-0.93x (4
# alternating runs of 3 rounds, 2026-12-02; 24 and 4: 1.22x, 12 and 8: 0.86x; DECISIONS §1).
WINDOWS_PER_BLOCK = 8
# A lane that has waited this long on Kafka asks whether its group still lives before waiting
# on: a lane of a group that is gone (failed, resized away) ends instead of reading for minutes.
LANE_FETCH_TIMEOUT_S = 20.0


@ray.remote(num_cpus=0, max_concurrency=64)
class WindowFeed:
    """Rank 0 puts each planned window; every lane takes them in seq order (async: many waiters;
    the puts themselves may run in any order)."""

    def __init__(self, rows_dir: Path | None = None):
        self.rows_dir = rows_dir  # where delayed feedback's lanes keep the rows they learned
        self._windows: dict[int, Window] = {}
        self._changed = asyncio.Condition()
        self._asks: dict[int, tuple[int | None, float]] = {}  # lane -> (the seq it asked after, when)
        self._join_state: dict[str, np.ndarray] = {}

    def set_join_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Rank 0, before the first window: the checkpoint's join state, for the lanes to take."""
        self._join_state = arrays

    def join_state(self) -> dict[str, np.ndarray]:
        return self._join_state

    def row_store(self) -> Path | None:
        return self.rows_dir

    @ray.method(enable_task_events=False)  # per window: no task events piling up in the GCS
    async def put(self, window: Window) -> None:
        async with self._changed:
            self._windows[window.seq] = window
            for seq in [s for s in self._windows if s <= window.seq - KEEP_WINDOWS]:
                del self._windows[seq]
            self._changed.notify_all()

    @ray.method(enable_task_events=False)  # per block and lane
    async def take(self, after: int | None, most: int = 1, timeout_s: float = 1.0, lane: int = -1) -> list[Window]:
        """The window after seq `after` (the group's first, window 0, for None) and those held
        right after it, `most` in all; [] if none came in time. Waits for the first only. Never
        "the oldest held": Ray runs an async actor's calls out of order, so rank 0's puts of
        windows 0, 1, 2 may land 1 first, and lanes that started at the oldest then began at
        window 1 and never read window 0 ("Ray Data lost its slices", issue 47: the ingest
        benchmark's Ray Data runs after other runs, when the feed's process started cold)."""
        self._asks[lane] = (after, time.time())
        first = 0 if after is None else after + 1
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: first in self._windows), timeout_s)
            except TimeoutError:
                return []
            out = []
            while len(out) < most and (window := self._windows.get(first + len(out))) is not None:
                out.append(window)
                if window.stop:
                    break
            return out

    async def state(self) -> dict:
        """What a stalled group reports: the windows held, and where each lane last asked and when
        (a lane that stopped asking is stuck in a read or held back by Ray Data; one asking for
        a window the feed no longer holds fell behind it)."""
        now = time.time()
        return {"windows": sorted(self._windows),
                "lanes": {lane: {"after": after, "asked_s_ago": round(now - t, 1)}
                          for lane, (after, t) in sorted(self._asks.items())}}


def read_lane(settings: KafkaSettings, topic: str, group_id: str, feed, lane: int, lanes: int,
              pipeline: Pipeline, fetch_timeout_s: float = LANE_FETCH_TIMEOUT_S):
    # Plain values, not an object: Ray Data pickles these arguments into each read task, and the
    # lane needs no more of the run than this (eight, where `_joined_lane` passes them on).
    """One lane, for the life of the Dataset: a generator of one-row Arrow tables of decoded
    window slices, one per block of windows that has events. It ends after the window that
    stops the run, or once its group is gone (the feed, owned by the group's rank 0, dies with
    it). With joined labels the lane reads, decodes and joins both topics."""
    if pipeline.labels is not None:
        yield from _joined_lane(settings, topic, group_id, feed, lane, lanes, fetch_timeout_s, pipeline)
        return
    reader = RangeReader(settings, topic, group_id, fetch_timeout_s=fetch_timeout_s)
    try:
        for windows in _taken(feed, lane):
            rows = []
            for window in windows:
                ranges = window.slice_for(lane, lanes)  # the planner plans for `lanes` readers
                if ranges:
                    started = time.perf_counter()
                    messages = _read(reader, ranges, feed)
                    if messages is None:
                        return
                    read_s = time.perf_counter() - started
                    batch = decode_events(pipeline, messages).batch(None)
                    rows.append(_decoded_row(window.seq, batch, len(messages), read_s,
                                             time.perf_counter() - started - read_s))
            if rows:
                yield pack(rows)
    finally:
        reader.close()


def _taken(feed, lane: int, first=None):
    """The windows the feed hands this lane, a block's worth at a time (`WindowFeed.take`), up to
    the window that stops the run; ends once the group is gone. `first()`, if given, runs before
    the first block is handed on (the joined lane's restore), its loss of the feed an end too."""
    seq = None
    while True:
        try:
            windows = ray.get(feed.take.remote(seq, WINDOWS_PER_BLOCK, lane=lane))
            if windows and seq is None and first is not None:
                first()
        except ray.exceptions.RayActorError:
            return
        if not windows:
            continue  # none came in time: ask again
        seq = windows[-1].seq
        yield windows
        if windows[-1].stop:
            return


def _joined_lane(settings: KafkaSettings, topic: str, group_id: str, feed, lane: int, lanes: int,
                 fetch_timeout_s: float, pipeline: Pipeline):  # read_lane's own, passed on
    """`read_lane` with joined labels: every window gives one row per lane, even an empty one
    (its count is the messages read plus one), so that the ranks know every lane's join state
    at a checkpoint window and count a window complete only once every lane has spoken."""
    spec = pipeline.labels
    try:
        rows_dir = ray.get(feed.row_store.remote())
    except ray.exceptions.RayActorError:
        return  # the group is gone
    events = RangeReader(settings, topic, group_id, fetch_timeout_s=fetch_timeout_s)
    labels = RangeReader(settings, topic + spec.suffix, group_id, fetch_timeout_s=fetch_timeout_s)
    join = make_join(pipeline, settings, topic, group_id, len(events.partitions()), rows_dir)

    def restore() -> None:  # before the first block: the checkpoint's state of this lane's partitions
        join.restore(ray.get(feed.join_state.remote()), lambda p: p % lanes == lane)

    try:
        for windows in _taken(feed, lane, first=restore):
            rows = []
            for window in windows:
                seq = window.seq
                started = time.perf_counter()
                messages = _read(events, window.slice_for(lane, lanes), feed)
                label_messages = _read(labels, window.label_slice_for(lane, lanes), feed)
                if messages is None or label_messages is None:
                    return
                read_s = time.perf_counter() - started
                batch = join.batch(pipeline, window, decode_events(pipeline, messages), label_messages)
                rows.append(_decoded_row(seq, batch, len(messages) + len(label_messages) + 1, read_s,
                                         time.perf_counter() - started - read_s))
            if rows:
                yield pack(rows)
    finally:
        events.close()
        labels.close()
        join.close()


def _read(reader: RangeReader, ranges: dict[int, tuple[int, int]], feed) -> list | None:
    """The slice's messages, waiting through broker outages while the group lives; None once it is gone."""
    while True:
        try:
            return reader.read_raw(ranges)
        except KafkaUnavailable:
            try:
                ray.get(feed.state.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return None
            # The group lives: read the slice again (the reader seeks back to its start).


class KafkaWindows(ray.data.Datasource):
    """`lanes` read tasks, each `read_lane` over its share of every window the feed hands out."""

    def __init__(self, settings: KafkaSettings, topic: str, group_id: str, feed, lanes: int, pipeline: Pipeline):
        self._args = (settings, topic, group_id, feed, pipeline)
        self.lanes = lanes
        self._fault = faults.given()  # aimed faults reach the lanes too (tests only)

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # unbounded

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ray.data.ReadTask]:
        from ray.data.block import BlockMetadata

        settings, topic, group_id, feed, pipeline = self._args

        def task(lane: int):
            def stream():
                if self._fault:
                    faults.arm(self._fault[0], None, self._fault[1])
                # A lane streams for the Dataset's life in one of Ray's pooled workers (heap.py).
                with heap.quiet_while_streaming():
                    for piece in read_lane(settings, topic, group_id, feed, lane, self.lanes, pipeline):
                        yield piece
                        for _ in piece.column("windows")[0].values:  # a slice at a time, however packed
                            faults.point("ray_data_lane_dies")  # only where a test aimed it
            return stream

        meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        return [ray.data.ReadTask(task(lane), meta) for lane in range(self.lanes)]


def pack(rows: list[dict]) -> pa.Table:
    """A lane's slices (plain dicts) as one Arrow row: the block that carries them to a rank."""
    return pa.table({"windows": pa.array([[r["window"] for r in rows]], pa.list_(pa.int64())),
                     "pack": pa.array([pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)], pa.large_binary())})


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unpack(table: pa.Table) -> list[dict]:
    """Every slice the table's packs carry, in the order they were packed."""
    return [row for blob in table.column("pack").to_pylist() for row in pickle.loads(blob)]


def _decoded_row(seq: int, batch: Batch, rows: int, read_s: float, decode_s: float) -> dict:
    """One decoded slice, as a rank receives it: matrices as raw bytes (the rank rebuilds them with
    np.frombuffer), dead letters by coordinates and reason, and with joined labels the labels
    dead-lettered, the events expired or learned unlabelled and, at a checkpoint window, the
    lane's join state (an .npz; empty bytes between checkpoints)."""
    x, y = np.ascontiguousarray(batch.features), np.ascontiguousarray(batch.targets)
    join = _npz(batch.join_delta) if batch.join_delta is not None else b""
    row = {"window": seq, "rows": rows,
           "x": x.tobytes(), "x_dtype": x.dtype.str, "y": y.tobytes(), "y_dtype": y.dtype.str,
           "crc": np.ascontiguousarray(batch.crcs, np.uint32).tobytes(), "read_s": read_s, "decode_s": decode_s,
           "expired": batch.expired, "defaulted": batch.defaulted, "ignored": batch.ignored, "join": join,
           # delayed feedback's matured negatives (maturing.py), same dtype and width as x
           "matured": b"" if batch.matured is None else np.ascontiguousarray(batch.matured, x.dtype).tobytes(),
           "matured_age_s": batch.matured_age_s}
    for prefix, dead in (("bad", batch.bad), ("bad_label", batch.bad_labels)):
        row.update({f"{prefix}_partition": [m.partition for m, _ in dead],
                    f"{prefix}_offset": [m.offset for m, _ in dead],
                    f"{prefix}_reason": [r for _, r in dead], f"{prefix}_value": [m.value for m, _ in dead]})
    return row


def read_join_state(row: dict) -> dict[str, np.ndarray] | None:
    """The join state a decoded slice carries (a checkpoint window's), or None."""
    if not row["join"]:  # np.savez writes a zip even of no arrays: empty bytes means none
        return None
    with np.load(io.BytesIO(row["join"])) as arrays:
        return {name: arrays[name] for name in arrays.files}


def reserve_lanes(name: str, lanes: int) -> PlacementGroup:
    """The lanes' CPUs, reserved for the group's life in a placement group of their own, which
    the Dataset is then scheduled into (`build`).

    Without it, Ray Data sizes a Dataset's budget from what Ray's AutoscalingCoordinator
    reserved for it, and a group that died (a killed rank 0, a stopped job) leaves its Train and
    Data requests there for up to 180 s. The CPU left over is shared among Data requests in
    whole CPUs, so on a cluster of fractional CPUs the new Dataset's budget came out 0 and Ray
    Data started one lane only (its liveness minimum): the ranks waited 57 s for the other
    lane's slices (`test_faults` resubmit after the direct case, 2026-11-26). With a placement
    group strategy Ray Data takes its budget from the group's bundles (its
    PlacementGroupClusterAutoscaler), which Ray's scheduler really holds for the lanes.

    Named per group generation: a placement group outlives the actor that made it (only its
    job's end removes it), so the group Ray Train restarts after rank 0 dies removes its
    predecessor's here; rank 0 removes its own at close. Not waited for: the lanes' tasks wait
    for their bundles, as they waited for room before (the autoscaler sees the group's demand)."""
    try:
        remove_placement_group(get_placement_group(name))
    except ValueError:
        pass  # none left behind
    return placement_group([{"CPU": LANE_CPUS}] * lanes, name=name)


def build(settings: KafkaSettings, topic: str, group_id: str, pipeline: Pipeline, feed, lanes: int,
          name: str, room: PlacementGroup) -> ray.data.Dataset:  # once per group: the lanes' arguments, and where
    """The Dataset of decoded window slices. Built on rank 0 once per group; runs from the first pull.

    Read and decode are one task per lane, the read's: a pool of decode actors (the first design)
    added two processes and an object-store hop per slice on the two cores the trainers use
    (0.72x the direct path, against 0.95x in the lanes; DECISIONS.md §1). The pipeline object
    itself goes to the lanes (pickled by reference to its module), not its name: `--pipeline
    package.module:attribute` names no file under pipelines/. `test_raydata_lanes` checks that
    the plan is the read alone."""
    ctx = ray.data.DataContext.get_current()
    ctx.target_max_block_size = 1  # one row (a whole window slice) per block: see the module docstring
    ctx.enable_progress_bars = False  # worker logs are not a terminal; the dashboard's Data view shows progress
    # Both strategies: Ray Data sizes its budget from the placement group only when both are one
    # (deprecated in Ray Data after 2.60, which is pinned; see `reserve_lanes`).
    ctx.scheduling_strategy = ctx.scheduling_strategy_large_args = PlacementGroupSchedulingStrategy(room)
    source = KafkaWindows(settings, topic, group_id, feed, lanes, pipeline)
    # A lane is never retried. Ray retries a task whose process died, and Ray Data's default is
    # forever; but a lane is no pure function of its input: a new attempt asks the feed for its
    # oldest window and yields slices the ranks already learned or that Ray's stream of the first
    # attempt's outputs no longer takes, which the ranks saw as lost rows 35 s later at best. Not
    # retried, the lane's death ends the Dataset, every rank's stream raises it with its cause,
    # and the group restarts from its checkpoint at once (`test_aimed_faults`, a lane killed).
    once = {"max_retries": 0}
    ds = ray.data.read_datasource(source, override_num_blocks=lanes, ray_remote_args=once, num_cpus=LANE_CPUS)
    ds.set_name(name)  # what the dashboard's Data view and `streamlearn status` call it
    return ds
