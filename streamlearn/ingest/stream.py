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
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from streamlearn.config import KafkaSettings
from streamlearn.ingest.deadletter import DeadLetters
from streamlearn.ingest.reader import Message, RangeReader
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import Pipeline
from streamlearn.train.phases import Phases

FINGERPRINT_MOD = 1 << 56  # ranks' partial sums must add up inside an int64


@dataclass
class Batch:
    """The learnable part of one rank's slice of one window."""

    window: Window
    features: np.ndarray
    targets: np.ndarray
    crcs: np.ndarray  # crc32 of each row's bytes, added to the fingerprint once its step is taken
    bad: list[tuple[Message, str]]  # dead-lettered once this window is learned, not when read
    read_s: float = 0.0

    @property
    def size(self) -> int:
        return len(self.targets)

    @property
    def dead_lettered(self) -> int:
        return len(self.bad)


class WorkerStream:
    def __init__(self, settings: KafkaSettings, topic: str, dlq_topic: str, group_id: str, pipeline: Pipeline,
                 rank: int, world: int, phases: Phases | None = None):
        self.pipeline, self.rank, self.world = pipeline, rank, world
        self.phases = phases or Phases(rank)
        self.reader = RangeReader(settings, topic, group_id)
        self.dead_letters = DeadLetters(settings, dlq_topic, topic)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"fetch-{rank}") if world > 1 else None

    lookahead = 1  # windows planned and reading beyond the one being learned

    @property
    def read_lanes(self) -> int:
        return self.world  # each rank reads its own share of every window

    def start(self, dlq_positions: dict[int, int]) -> None:
        """After restore: remember the dead letters written past the checkpoint, to skip them."""
        self.dead_letters.skip_written_since(dlq_positions)

    def dlq_positions(self) -> dict[int, int]:
        """At a checkpoint: where a replay's scan for already-written dead letters starts."""
        return self.dead_letters.positions()

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
        with self.phases("decode", window=window.seq, messages=len(messages)):
            values = [m.value() for m in messages]
            events, kept, bad = self.pipeline.schema.decode_many(values)
            x, y, kept, bad = featurize(self.pipeline, events, kept, bad)
            crc32 = zlib.crc32
            crcs = np.fromiter((crc32(values[i]) for i in kept), dtype=np.uint32, count=len(kept))
            dead = [(Message(messages[i].partition(), messages[i].offset(), values[i]), reason)
                    for i, reason in sorted(bad)]
        return Batch(window, x, y, crcs, dead, time.perf_counter() - started)

    def dead_letter(self, batch: Batch) -> None:
        """Called in window order after the window is learned. Sending from the read-ahead
        thread instead would put the next window's dead letters before this checkpoint's
        dead-letter positions, and a replay after a crash would then write them twice."""
        for message, reason in batch.bad:
            self.dead_letters.send(message, reason)

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.dead_letters.close()
        self.reader.close()


class Deferred:
    """A window's read, done in the caller's thread when its result is first asked for."""

    def __init__(self, read, window: Window):
        self._read, self._window, self._batch = read, window, None

    def result(self) -> Batch:
        if self._batch is None:
            self._batch = self._read(self._window)
        return self._batch


def featurize(pipeline: Pipeline, events: list[dict], kept: list[int], bad: list[tuple[int, str]]):
    """Features and targets of decoded events. A pipeline that chokes on a valid event
    dead-letters that event, not the whole rank."""
    features, targets = pipeline.features, pipeline.targets
    try:
        return features(events), targets(events), kept, bad
    except Exception:
        pass  # find the culprits one by one: rare, so the slow path is fine
    good_events, good_kept, bad = [], [], list(bad)
    for event, index in zip(events, kept, strict=True):
        try:
            features([event]), targets([event])
        except Exception as e:
            bad.append((index, f"featurize_error: {type(e).__name__}: {str(e)[:200]}"))
            continue
        good_events.append(event)
        good_kept.append(index)
    return features(good_events), targets(good_events), good_kept, bad
