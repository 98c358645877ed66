"""The Ray Data side of `--ingest ray-data`: one long-lived Dataset that reads the planner's
windows from Kafka, decodes on Ray Data workers, and streams to the ranks.

Ray Data 2.60 has no unbounded source, and one Dataset per window costs seconds per window
(docs/DECISIONS.md §1). So the Dataset is built once per worker group and never ends until
the run does: its read tasks are *lanes*, each a generator that takes window after window
from a `WindowFeed` actor (rank 0 puts each planned window there) and reads its share of the
window's offsets with the same long-lived `RangeReader` as the direct path. The decode stage
(`map_batches`, fused by Ray Data into the lanes) parses, validates and featurizes, and passes
bad events on with their reasons (the ranks dead-letter them, as in the direct path); the ranks
receive decoded windows through `streaming_split(equal=False)`, in whatever order and on
whatever rank Ray Data hands them out.

One window slice travels as ONE row (its messages as list columns on the way in, its
feature matrix as bytes on the way out). Ray Data's read operator buffers a generator's
output until a block exceeds `target_max_block_size` (128 MiB by default): a stream's small
windows would never leave the read task. With the target at one byte every yielded row is a
block of its own, and since a row is a whole slice nothing is ever cut smaller than that.
"""

from __future__ import annotations

import asyncio
import time
import zlib

import numpy as np
import pyarrow as pa
import ray

from streamlearn import heap
from streamlearn.config import KafkaSettings
from streamlearn.errors import KafkaUnavailable
from streamlearn.ingest.reader import RangeReader
from streamlearn.ingest.stream import featurize
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import Pipeline

# A lane reads its share of each window and decodes it (JSON parsing is the stage's CPU cost).
# On two cores it must leave the trainers their share: a fraction, never Ray's 1 CPU. The read
# and the decode ask the same, so Ray Data fuses them into one task per lane (see `build`).
LANE_CPUS = 0.25
KEEP_WINDOWS = 8  # recent windows the feed keeps; a lane is at most the lookahead (3) behind it
# A lane that has waited this long on Kafka asks whether its group still lives before waiting
# on: a lane of a group that is gone (failed, resized away) ends instead of reading for minutes.
LANE_FETCH_TIMEOUT_S = 20.0


@ray.remote(num_cpus=0, max_concurrency=64)
class WindowFeed:
    """Rank 0 puts each planned window; every lane takes them in order (async: many waiters)."""

    def __init__(self):
        self._windows: dict[int, Window] = {}
        self._changed = asyncio.Condition()
        self._asks: dict[int, tuple[int | None, float]] = {}  # lane -> (the seq it asked after, when)

    async def put(self, window: Window) -> None:
        async with self._changed:
            self._windows[window.seq] = window
            for seq in [s for s in self._windows if s <= window.seq - KEEP_WINDOWS]:
                del self._windows[seq]
            self._changed.notify_all()

    async def next(self, after: int | None, timeout_s: float = 1.0, lane: int = -1) -> Window | None:
        """The window after seq `after` (the first one fed, for None); None if none came in time."""
        self._asks[lane] = (after, time.time())

        def ready() -> Window | None:
            if after is None:
                return self._windows[min(self._windows)] if self._windows else None
            return self._windows.get(after + 1)

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: ready() is not None), timeout_s)
            except TimeoutError:
                return None
            return ready()

    async def state(self) -> dict:
        """What a stalled group reports: the windows held, and where each lane last asked and when
        (a lane that stopped asking is stuck in a read or held back by Ray Data; one asking for
        a window the feed no longer holds fell behind it)."""
        now = time.time()
        return {"windows": sorted(self._windows),
                "lanes": {lane: {"after": after, "asked_s_ago": round(now - t, 1)}
                          for lane, (after, t) in sorted(self._asks.items())}}


def read_lane(settings: KafkaSettings, topic: str, group_id: str, feed, lane: int, lanes: int,
              fetch_timeout_s: float = LANE_FETCH_TIMEOUT_S):
    """One lane, for the life of the Dataset: a generator of one-row Arrow tables, one per window
    slice that has events. It ends after the window that stops the run, or once its group is
    gone (the feed, owned by the group's rank 0, dies with it)."""
    reader = RangeReader(settings, topic, group_id, fetch_timeout_s=fetch_timeout_s)
    seq = None
    try:
        while True:
            try:
                window = ray.get(feed.next.remote(seq, lane=lane))
            except ray.exceptions.RayActorError:
                return
            if window is None:
                continue
            seq = window.seq
            ranges = window.slice_for(lane, lanes)  # the planner plans for `lanes` readers
            if ranges:
                started = time.perf_counter()
                messages = _read(reader, ranges, feed)
                if messages is None:
                    return
                yield pa.table({
                    "window": [seq], "lane": [lane],
                    "partition": pa.array([[m.partition() for m in messages]], pa.list_(pa.int32())),
                    "offset": pa.array([[m.offset() for m in messages]], pa.list_(pa.int64())),
                    "value": pa.array([[m.value() for m in messages]], pa.list_(pa.binary())),
                    "read_s": [time.perf_counter() - started],
                })
            if window.stop:
                return
    finally:
        reader.close()


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

    def __init__(self, settings: KafkaSettings, topic: str, group_id: str, feed, lanes: int):
        self._args = (settings, topic, group_id, feed)
        self.lanes = lanes

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # unbounded

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ray.data.ReadTask]:
        from ray.data.block import BlockMetadata

        settings, topic, group_id, feed = self._args

        def task(lane: int):
            def stream():
                # A lane streams for the Dataset's life in one of Ray's pooled workers (heap.py).
                with heap.quiet_while_streaming():
                    yield from read_lane(settings, topic, group_id, feed, lane, self.lanes)
            return stream

        meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        return [ray.data.ReadTask(task(lane), meta) for lane in range(self.lanes)]


def decode(slices: pa.Table, pipeline: Pipeline) -> pa.Table:
    """The decode stage, run in the lane that read the slices: parse, validate, featurize and
    fingerprint. Bad events travel on with their bytes and reason; the rank that learns their
    window writes them to the dead-letter topic, in window order, as the direct path does.
    Written here, a stage running windows ahead of training, retried by Ray Data, or outliving a
    killed group by a moment wrote one dead letter twice in 1,185 under two worker kills (CI)."""
    out: dict[str, list] = {name: [] for name in DECODED.names}
    for row in slices.to_pylist():
        started = time.perf_counter()
        values = row["value"]
        events, kept, bad = pipeline.schema.decode_many(values)
        x, y, kept, bad = featurize(pipeline, events, kept, bad)
        crcs = np.fromiter((zlib.crc32(values[i]) for i in kept), dtype=np.uint32, count=len(kept))
        bad = sorted(bad)
        x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
        decoded = {"window": row["window"], "rows": len(values), "x": x.tobytes(), "x_dtype": x.dtype.str,
                   "y": y.tobytes(), "y_dtype": y.dtype.str, "crc": crcs.tobytes(),
                   "bad_partition": [row["partition"][i] for i, _ in bad],
                   "bad_offset": [row["offset"][i] for i, _ in bad], "bad_reason": [r for _, r in bad],
                   "bad_value": [values[i] for i, _ in bad],
                   "read_s": row["read_s"], "decode_s": time.perf_counter() - started}
        for name, value in decoded.items():
            out[name].append(value)
    return pa.table(out, schema=DECODED)


# One decoded window slice: its matrices as raw bytes (the rank rebuilds them with np.frombuffer;
# Arrow tensor columns cost a conversion each way), its dead letters by coordinates and reason.
DECODED = pa.schema([("window", pa.int64()), ("rows", pa.int64()), ("x", pa.large_binary()),
                     ("x_dtype", pa.string()), ("y", pa.large_binary()), ("y_dtype", pa.string()),
                     ("crc", pa.large_binary()), ("bad_partition", pa.list_(pa.int32())),
                     ("bad_offset", pa.list_(pa.int64())), ("bad_reason", pa.list_(pa.string())),
                     ("bad_value", pa.list_(pa.binary())),
                     ("read_s", pa.float64()), ("decode_s", pa.float64())])


def build(settings: KafkaSettings, topic: str, group_id: str, pipeline: Pipeline, feed, lanes: int,
          name: str) -> ray.data.Dataset:
    """The Dataset of decoded window slices. Built on rank 0 once per group; runs from the first pull.

    Read and decode are one task per lane: a task-pool `map_batches` with the read's size and
    CPUs, which Ray Data fuses into the read. A pool of decode actors (the first design) added
    two processes and an object-store hop per slice on the two cores the trainers use; fused,
    the mode learned at 0.95x the direct path instead of 0.72x (side run, DECISIONS.md §1).
    `test_raydata_lanes` checks the plan stays fused."""
    ctx = ray.data.DataContext.get_current()
    ctx.target_max_block_size = 1  # one row (a whole window slice) per block: see the module docstring
    ctx.enable_progress_bars = False  # worker logs are not a terminal; the dashboard's Data view shows progress
    source = KafkaWindows(settings, topic, group_id, feed, lanes)
    lane = {"num_cpus": LANE_CPUS, "compute": ray.data.TaskPoolStrategy(size=lanes)}  # the same both: fused
    ds = ray.data.read_datasource(source, override_num_blocks=lanes, **lane)
    ds = ds.map_batches(decode, batch_size=None, batch_format="pyarrow", **lane,
                        # The pipeline object itself (pickled by reference to its module), not its
                        # name: `--pipeline package.module:attribute` names no file under pipelines/.
                        fn_kwargs={"pipeline": pipeline})
    ds.set_name(name)  # what the dashboard's Data view and `streamlearn status` call it
    return ds
