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
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Protocol

import numpy as np

from streamlearn.config import KafkaSettings
from streamlearn.ingest.deadletter import DeadLetters
from streamlearn.ingest.join import join_keys
from streamlearn.ingest.labelled import Events, LabelJoin, Labels
from streamlearn.ingest.reader import Message, RangeReader
from streamlearn.ingest.windows import Window
from streamlearn.phases import Phases
from streamlearn.pipeline import Pipeline

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
    # With joined labels (labelled.py): the rows are the events whose labels came in this
    # window, whenever the events did, and the events learned with the pipeline's `unlabelled_as`
    # (`defaulted` of them); labels to dead-letter; events that left unlabelled and unlearned;
    # at a checkpoint window, what the checkpoint writes of the join state right after this
    # window (`LabelJoin.delta`: the read of the next one may already be under way when the
    # checkpoint is taken).
    bad_labels: list[tuple[Message, str]] = field(default_factory=list)
    expired: int = 0
    defaulted: int = 0
    join_delta: dict[str, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return len(self.targets)

    @property
    def dead_lettered(self) -> int:
        return len(self.bad) + len(self.bad_labels)


class Pending(Protocol):
    def result(self) -> Batch: ...


class Stream(Protocol):
    """What the worker loop (train/loop.py) needs of an ingest mode: `WorkerStream` below (each rank
    reads Kafka itself) and `raydata_stream.RayDataStream` (--ingest ray-data) implement it. Rank 0's
    `reader` plans windows and commits offsets; the end of the stream is the plan's `Window.stop`."""

    reader: RangeReader | None
    dead_letters: DeadLetters
    lookahead: int  # windows planned and reading beyond the one being learned

    @property
    def read_lanes(self) -> int: ...  # how many ways the planner cuts a window

    def start(self, dlq_positions: dict[int, int], join_state: dict[str, np.ndarray] | None = None) -> None: ...

    def prefetch(self, window: Window) -> Pending: ...

    def dead_letter(self, batch: Batch) -> None: ...

    def ingest_stats(self) -> dict: ...

    def close(self) -> None: ...


class WorkerStream:
    def __init__(self, settings: KafkaSettings, topic: str, dlq_topic: str, group_id: str, pipeline: Pipeline,
                 rank: int, world: int, phases: Phases | None = None):
        self.pipeline, self.rank, self.world = pipeline, rank, world
        self.phases = phases or Phases(rank)
        self.reader = RangeReader(settings, topic, group_id)
        self.dead_letters = DeadLetters(settings, dlq_topic, topic)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"fetch-{rank}") if world > 1 else None
        # Joined labels: this rank's partitions of the labels topic, and their join.
        spec = pipeline.labels
        self.label_topic = topic + spec.suffix if spec else None
        self.label_reader = RangeReader(settings, self.label_topic, group_id) if spec else None
        self.join = LabelJoin(spec, feature_width(pipeline), len(self.reader.partitions())) if spec else None

    lookahead = 1  # windows planned and reading beyond the one being learned

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
            return Batch(window, decoded.x, decoded.y, decoded.crcs, decoded.dead, time.perf_counter() - started)
        with self.phases("join", window=window.seq, labels=len(labels)):
            batch = join_window(self.pipeline, self.join, window, decoded, labels)
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


@dataclass
class Decoded:
    """A slice's events, decoded: features and targets of the valid ones, their fingerprints,
    the bad ones' dead letters; and what the join needs (the messages, their bytes, the valid
    events and their rows)."""

    messages: list
    values: list[bytes]
    events: list[dict]
    kept: list[int]
    x: np.ndarray
    y: np.ndarray
    crcs: np.ndarray
    dead: list[tuple[Message, str]]


def decode_events(pipeline: Pipeline, messages: list) -> Decoded:
    """Parse, validate, featurize and fingerprint a slice's messages (the direct path's ranks and
    the Ray Data lanes with joined labels: one decoder, one set of dead-letter reasons)."""
    values = [m.value() for m in messages]
    events, decoded, bad = pipeline.schema.decode_many(values)
    x, y, kept, bad = featurize(pipeline, events, decoded, bad)
    crc32 = zlib.crc32
    crcs = np.fromiter((crc32(values[i]) for i in kept), dtype=np.uint32, count=len(kept))
    dead = [(Message(messages[i].partition(), messages[i].offset(), values[i]), reason) for i, reason in sorted(bad)]
    if len(kept) < len(decoded):  # the pipeline refused some: keep the events that have rows
        rows = set(kept)
        events = [e for e, i in zip(events, decoded, strict=True) if i in rows]
    return Decoded(messages, values, events, kept, x, y, crcs, dead)


def join_window(pipeline: Pipeline, join: LabelJoin, window: Window, events: Decoded, label_messages: list) -> Batch:
    """Joined labels: a slice's events wait for their labels and its labels find their events
    (labelled.py); the batch is what joined, with the bad and unjoined labels, and at a
    checkpoint window the join state right after it."""
    spec = pipeline.labels
    keys = join_keys(list(map(itemgetter(spec.key), events.events)))
    label_values = [m.value() for m in label_messages]
    found, lkept, lbad = spec.schema.decode_columns(label_values)
    bad_labels = [(Message(label_messages[i].partition(), label_messages[i].offset(), label_values[i]), reason)
                  for i, reason in sorted(lbad)]
    labels = _labels_by_partition(label_messages, label_values, lkept, join_keys(found[spec.key]),
                                  pipeline.label_targets(found))
    out = join.window(_events_by_partition(events.messages, events.values, events.kept, keys, events.x, events.crcs),
                      labels)
    features = np.concatenate([events.x[:0], *out.features])
    targets = np.concatenate([np.empty(0, np.float32), *out.targets])
    crcs = np.concatenate([np.empty(0, np.uint32), *out.crcs])
    return Batch(window, features, targets, crcs, events.dead + out.dead_events,
                 bad_labels=bad_labels + out.dead_labels, expired=out.expired, defaulted=out.defaulted,
                 join_delta=join.delta() if window.checkpoint else None)


class Deferred:
    """A window's read, done in the caller's thread when its result is first asked for."""

    def __init__(self, read, window: Window):
        self._read, self._window, self._batch = read, window, None

    def result(self) -> Batch:
        if self._batch is None:
            self._batch = self._read(self._window)
        return self._batch


def _each(messages: list, method: str) -> list:
    """`[m.<method>() for m in messages]` in one C loop, through the messages' own class
    (confluent-kafka's, or a test's): partition() over 200k messages took 0.033 µs each this
    way against 0.064 µs in a generator expression (measured)."""
    return list(map(getattr(type(messages[0]), method), messages)) if messages else []


def _by_partition(messages: list, kept: list[int]):
    """Per partition: (partition, its rows of `kept`, their indexes in `messages`, their Kafka
    timestamps in s)."""
    kept_at = np.asarray(kept, np.int64)
    partitions = np.asarray(_each(messages, "partition"), np.int32)[kept_at]
    stamps = np.fromiter(map(itemgetter(1), _each(messages, "timestamp")), np.float64, len(messages))
    t = stamps[kept_at] / 1000.0
    for p in np.unique(partitions).tolist():
        rows = np.flatnonzero(partitions == p)
        yield p, rows, kept_at[rows], t[rows]


def _events_by_partition(messages: list, values: list[bytes], kept: list[int], keys: np.ndarray, x: np.ndarray,
                         crcs: np.ndarray) -> dict[int, Events]:
    """A window's valid events split by partition, with their Kafka timestamps (s)."""
    out = {}
    for p, rows, at, t in _by_partition(messages, kept):

        def message(row: int, at=at) -> Message:  # only for a dead letter: rare
            i = int(at[row])
            return Message(messages[i].partition(), messages[i].offset(), values[i])

        out[p] = Events(keys[rows], x[rows], crcs[rows], t, message)
    return out


def _labels_by_partition(messages: list, values: list[bytes], kept: list[int], keys: np.ndarray,
                         targets: np.ndarray) -> dict[int, Labels]:
    """A window's valid labels split by partition. Offsets and bytes are looked up only for the
    labels that wait or leave unjoined (most join at once)."""
    out = {}
    for p, rows, at, t in _by_partition(messages, kept):

        def offsets(wanted: np.ndarray, at=at) -> list[int]:
            return [messages[i].offset() for i in at[wanted].tolist()]

        def raw(wanted: np.ndarray, at=at) -> list[bytes]:
            return [values[i] for i in at[wanted].tolist()]

        out[p] = Labels(keys[rows], targets[rows], offsets, raw, t)
    return out


def feature_width(pipeline: Pipeline) -> int:
    """Columns of the pipeline's feature matrix (the join state's row width)."""
    x0, _, _, _ = featurize(pipeline, [], [], [])
    return int(np.asarray(x0).shape[1])


def _no_targets(events: list[dict]) -> np.ndarray:
    return np.zeros(len(events), np.float32)


def featurize(pipeline: Pipeline, events: list[dict], kept: list[int], bad: list[tuple[int, str]]):
    """Features and targets of decoded events. A pipeline that chokes on a valid event
    dead-letters that event, not the whole rank. With joined labels the targets come with the
    labels (labelled.py): zeros here."""
    features, targets = pipeline.features, pipeline.targets if pipeline.labels is None else _no_targets
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
