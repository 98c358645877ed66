"""One rank's view of the stream: read its slice of a window, decode, dead-letter, featurize.

Where the window is read and decoded depends on the group. A rank of several reads the next
window in a background thread while it trains: each step's allreduce waits for the slowest
rank, and the reader fills those waits. A lone rank has no such waits, and a reader beside it
only fights it for the GIL (JSON parsing holds it; each torch op that releases it waits to get
it back, and a step took ~3x longer), so it reads in the training thread when the loop asks,
while librdkafka keeps fetching ahead in its own threads. Measured both ways, docs/DECISIONS.md §1.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from streamlearn.config import KafkaSettings
from streamlearn.ingest.deadletter import DeadLetters
from streamlearn.ingest.decode import Batch, decode_events
from streamlearn.ingest.feedback import make_join
from streamlearn.ingest.reader import RangeReader
from streamlearn.ingest.windows import Window
from streamlearn.phases import Phases
from streamlearn.pipeline import Pipeline


class Pending(Protocol):
    def result(self) -> Batch: ...


class Stream(Protocol):
    """What the worker loop (train/loop.py) needs of an ingest mode: `WorkerStream` below (each rank
    reads Kafka itself) and `raydata_stream.RayDataStream` (--ingest ray-data) implement it. Rank 0's
    `reader` plans windows and commits offsets; the end of the stream is the plan's `Window.stop`."""

    reader: RangeReader | None
    dead_letters: DeadLetters
    lookahead: int  # windows planned and reading beyond the one being learned, behind a backlog
    lookahead_at_pace: int  # the same once caught up with the stream (train/loop.py: ReadAhead)

    @property
    def read_lanes(self) -> int: ...  # how many ways the planner cuts a window

    def start(self, dlq_positions: dict[int, int], join_state: dict[str, np.ndarray] | None = None) -> None: ...

    def prefetch(self, window: Window) -> Pending: ...

    def dead_letter(self, batch: Batch) -> None: ...

    def ingest_stats(self) -> dict: ...

    def close(self) -> None: ...


class WorkerStream:
    def __init__(self, settings: KafkaSettings, topic: str, dlq_topic: str, group_id: str, pipeline: Pipeline,
                 rank: int, world: int, phases: Phases | None = None, rows_dir: Path | None = None):
        # The ingest modes' one constructor (train/loop.py builds either): the run's topics, the
        # pipeline, where this rank stands, and where delayed feedback keeps the rows it learned
        # (ingest/rowstore.py; None: re-read every report's event); called once per group, never per window.
        self.pipeline, self.rank, self.world = pipeline, rank, world
        self.phases = phases or Phases(rank)
        self.reader = RangeReader(settings, topic, group_id)
        self.dead_letters = DeadLetters(settings, dlq_topic, topic)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"fetch-{rank}") if world > 1 else None
        # Joined labels or delayed feedback: this rank's partitions of the labels topic, and their join.
        spec = pipeline.labels
        self.label_topic = topic + spec.suffix if spec else None
        self.label_reader = RangeReader(settings, self.label_topic, group_id) if spec else None
        # Matured negatives on every rank: each judges its own partitions' (train/learner.py).
        self.join = make_join(pipeline, settings, topic, group_id, len(self.reader.partitions()),
                              rows_dir) if spec else None

    lookahead = lookahead_at_pace = 1  # windows planned and reading beyond the one being learned

    @property
    def read_lanes(self) -> int:
        return self.world  # each rank reads its own share of every window

    def start(self, dlq_positions: dict[int, int], join_state: dict[str, np.ndarray] | None = None) -> None:
        """After restore: remember the dead letters written past the checkpoint, to skip them,
        and take this rank's partitions' join state from the checkpoint."""
        self.dead_letters.skip_written_since(dlq_positions)
        if self.join is not None and join_state:
            self.join.restore(join_state, lambda p: p % self.world == self.rank)

    def ingest_stats(self) -> dict:
        return {"mode": "direct"}

    def prefetch(self, window: Window) -> Future | Deferred:
        return self._pool.submit(self.fetch, window) if self._pool else Deferred(self.fetch, window)

    def fetch(self, window: Window) -> Batch:
        """Two timeline spans: fetch (Kafka, waits on the network and broker) and decode (CPU: parse,
        validate, featurize), so a slow ingest shows which of the two it is."""
        started = time.perf_counter()
        with self.phases("fetch", window=window.seq):
            messages = self.reader.read_raw(window.slice_for(self.rank, self.world))
            labels = self.label_reader.read_raw(window.label_slice_for(self.rank, self.world)) if self.join else []
        with self.phases("decode", window=window.seq, messages=len(messages)):
            decoded = decode_events(self.pipeline, messages)
        if self.join is None:
            return decoded.batch(window, time.perf_counter() - started)
        with self.phases("join", window=window.seq, labels=len(labels)):
            batch = self.join.batch(self.pipeline, window, decoded, labels)
        batch.read_s = time.perf_counter() - started
        return batch

    def dead_letter(self, batch: Batch) -> None:
        """Called in window order after the window is learned. Sending from the read-ahead
        thread instead would put the next window's dead letters before this checkpoint's
        dead-letter positions, and a replay after a crash would then write them twice."""
        for message, reason in batch.bad:
            self.dead_letters.send(message, reason)
        for message, reason in batch.bad_labels:
            self.dead_letters.send(message, reason, source_topic=self.label_topic)

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.dead_letters.close()
        self.reader.close()
        if self.label_reader is not None:
            self.label_reader.close()
            self.join.close()


class Deferred:
    """A window's read, done in the caller's thread when its result is first asked for."""

    def __init__(self, read, window: Window):
        self._read, self._window, self._batch = read, window, None

    def result(self) -> Batch:
        if self._batch is None:
            self._batch = self._read(self._window)
        return self._batch

