"""Delayed labels in training (issue 16): one rank's online join of its events and their labels.

Partition p of `<topic>.labels` holds the labels of partition p's events (a label is sent with
its event's key: streamlearn/loadgen/labels.py), and a window with labels gives both topics' ranges of a
partition to the same rank, so each partition is joined on one rank, in a JoinState of its own,
and no label crosses ranks. On a resize the states move with their partitions, through the
checkpoint (`snapshot`, `restore`).

Time is the messages' own Kafka timestamps, never the trainer's clock. An event and its label
join only if the label is at most the TTL after the event. After each window a partition's clock
is the older of its two topics' newest timestamps, and what has waited more than the TTL before
it leaves: an event as expired (counted: never labelled in time), or learned with the pipeline's
`unlabelled_as` target where it has one (only frauds are ever reported: silence within the TTL
says "legitimate"; counted as `defaulted`), and a label to the dead-letter topic (no event for it
within the TTL). An event whose label comes after the TTL is treated alike whichever is read
first (the clock expires it, or its late label finds it), so that choice does not depend on
how windows cut the two topics either. An event the cap pushes out is treated as one whose TTL
passed (its label may yet come, and then goes to the dead-letter topic): with labels weeks late
the state sits at its cap, every event leaves through it, and leaving those unlearned would
teach the model the reported class alone; the cap then is the reporting window, shortened.

A label within the TTL of its event is always read before that clock passes the event's
expiry, whichever topic the windows read further ahead, so a replay of the same offsets cut
into other windows makes the same decisions, as long as timestamps rise with offsets in each
partition of each topic (one producer per key, as the generator writes them). The cap is the
exception: what it evicts depends on how windows interleave the two topics, so a crash while
the cap evicts can leave the dead letter of a label that the replay then joins (with
`unlabelled_as`: an event the lost run learned with its label, the replay with that target;
each is still learned once) (docs/DECISIONS.md §20).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from streamlearn.ingest.decode import Batch, Decoded
from streamlearn.ingest.join import JoinState, by_partition, join_keys
from streamlearn.ingest.reader import Message
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import JoinedLabels, Pipeline

LABEL_WITHOUT_EVENT = "label_without_event: no event with this id within the TTL ({ttl:g} s)"
DUPLICATE_LABEL = "duplicate_label: a label for this event id is already waiting"
DUPLICATE_EVENT = "duplicate_event: an event with this id is already waiting for its label"


class Events(NamedTuple):
    """One partition's decoded events of a window: join keys, features, fingerprints, times (s)
    and, for the rare dead letter, a function from a row to its message."""

    keys: np.ndarray
    features: np.ndarray
    crcs: np.ndarray
    t: np.ndarray
    message: Callable[[int], Message]


class Labels(NamedTuple):
    """One partition's decoded label messages of a window. `offsets` and `values` are arrays or
    functions of the rows wanted (only labels that wait or leave unjoined need them)."""

    keys: np.ndarray
    targets: np.ndarray
    offsets: Any
    values: Any
    t: np.ndarray


@dataclass
class Outcome:
    """What one window of one rank gives the trainer: joined events to learn, dead letters."""

    features: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    crcs: list[np.ndarray] = field(default_factory=list)
    dead_events: list[tuple[Message, str]] = field(default_factory=list)
    dead_labels: list[tuple[Message, str]] = field(default_factory=list)
    expired: int = 0  # events that left without their label, unlearned
    defaulted: int = 0  # events learned with `unlabelled_as`: no label within the TTL (among those learned)


class LabelJoin:
    def __init__(self, spec: JoinedLabels, n_features: int, partitions_total: int):
        self.spec, self.n_features = spec, n_features
        self.cap = max(1, spec.max_pending // max(1, partitions_total))  # per side, per partition
        self.states: dict[int, JoinState] = {}
        self.clocks: dict[int, np.ndarray] = {}  # partition -> [newest event time, newest label time]
        self.written: dict[int, dict[str, int]] = {}  # partition -> side -> arrivals before it are on disk
        self._late_reason = LABEL_WITHOUT_EVENT.format(ttl=spec.ttl_s)

    def batch(self, pipeline: Pipeline, window: Window, events: Decoded, label_messages: list) -> Batch:
        """A slice's events wait for their labels and its labels find their events; the batch is
        what joined, with the bad and unjoined labels, and at a checkpoint window the join state
        right after it."""
        spec = pipeline.labels
        keys = join_keys(list(map(itemgetter(spec.key), events.events)))
        label_values = [m.value() for m in label_messages]
        found, lkept, lbad = spec.schema.decode_columns(label_values)
        bad_labels = [(Message(label_messages[i].partition(), label_messages[i].offset(), label_values[i]), reason)
                      for i, reason in sorted(lbad)]
        labels = _labels_by_partition(label_messages, label_values, lkept, join_keys(found[spec.key]),
                                      pipeline.label_targets(found))
        out = self.window(_events_by_partition(events.messages, events.values, events.kept, keys, events.x,
                                               events.crcs), labels)
        features = np.concatenate([events.x[:0], *out.features])
        targets = np.concatenate([np.empty(0, np.float32), *out.targets])
        crcs = np.concatenate([np.empty(0, np.uint32), *out.crcs])
        return Batch(window, features, targets, crcs, events.dead + out.dead_events,
                     bad_labels=bad_labels + out.dead_labels, expired=out.expired, defaulted=out.defaulted,
                     join_delta=self.delta() if window.checkpoint else None)

    def window(self, events: dict[int, Events], labels: dict[int, Labels]) -> Outcome:
        out = Outcome()
        for p in sorted(set(events) | set(labels)):
            state, clock = self._state(p)
            if p in events and len(events[p].keys):
                e = events[p]
                joined = state.add_events(e.keys, e.features, e.crcs, e.t)
                self._learn(out, joined, p)
                out.dead_events.extend((e.message(i), DUPLICATE_EVENT) for i in joined.refused_events.tolist())
                clock[0] = max(clock[0], float(e.t.max()))
            if p in labels and len(labels[p].keys):
                lab = labels[p]
                joined = state.add_labels(lab.keys, lab.targets, np.full(len(lab.keys), p, np.int32), lab.offsets,
                                          lab.t, lab.values)
                self._learn(out, joined, p)
                out.dead_labels.extend(_messages(joined.duplicate, DUPLICATE_LABEL))
                clock[1] = max(clock[1], float(lab.t.max()))
            gone = state.expire(float(clock.min()))
            for g in gone["labels"]:
                out.dead_labels.extend(_messages(g.rows, self._late_reason))
            for g in gone["events"]:
                self._unlabelled(out, g.rows)
        return out

    def _learn(self, out: Outcome, joined, p: int) -> None:
        if joined.size:
            out.features.append(joined.features)
            out.targets.append(joined.targets)
            out.crcs.append(joined.crcs)
        out.dead_labels.extend(_messages(joined.late, self._late_reason))
        # An event whose label came after the TTL is the same event as one the clock expired
        # first (which of the two happens depends on how windows cut the topics): it is unlabelled.
        self._unlabelled(out, joined.late_events)

    def _unlabelled(self, out: Outcome, rows: dict[str, np.ndarray]) -> None:
        """Events that left without a label (TTL, cap, a label too late): learned with
        `unlabelled_as` where the pipeline has one, else counted as expired."""
        n = len(rows.get("key", ()))
        if not n:
            return
        if self.spec.unlabelled_as is None:
            out.expired += n
            return
        out.features.append(rows["features"])
        out.targets.append(np.full(n, self.spec.unlabelled_as, np.float32))
        out.crcs.append(rows["crc"])
        out.defaulted += n

    def _state(self, p: int) -> tuple[JoinState, np.ndarray]:
        if p not in self.states:
            self.states[p] = JoinState(self.n_features, self.spec.ttl_s, self.cap)
            self.clocks[p] = np.full(2, -np.inf)
        return self.states[p], self.clocks[p]

    @property
    def pending(self) -> dict[str, int]:
        return {side: sum(s.pending[side] for s in self.states.values()) for side in ("events", "labels")}

    def snapshot(self) -> dict[str, np.ndarray]:
        """Every partition's pending rows and clock, as flat arrays named `p<partition>/...`."""
        out = {}
        for p, state in self.states.items():
            out[f"p{p}/clock"] = self.clocks[p].copy()
            out.update({f"p{p}/{name}": array for name, array in state.snapshot().items()})
        return out

    def delta(self) -> dict[str, np.ndarray]:
        """What a checkpoint writes of every partition (`JoinState.delta`, named `p<partition>/...`,
        with its clock), given that the checkpoints before it hold every row that arrived before
        the last delta: each row is written once, by the first checkpoint it waits at."""
        out = {}
        for p, state in self.states.items():
            written = self.written.setdefault(p, {})
            out[f"p{p}/clock"] = self.clocks[p].copy()
            out.update({f"p{p}/{name}": array for name, array in state.delta(written).items()})
            written.update(events=state.events.next_seq, labels=state.labels.next_seq)
        return out

    def restore(self, arrays: dict[str, np.ndarray], mine) -> None:
        """Take the states of the partitions `mine(p)` says this rank joins from a checkpoint's
        arrays (`snapshot`'s, or the ones `train/join_files.load` rebuilds, which say what the
        checkpoint's files hold already: `<side>.written`)."""
        for p, rows in by_partition(arrays).items():
            if mine(p):
                written = {side: int(rows.pop(f"{side}.written", 0)) for side in ("events", "labels")}
                self.states[p] = JoinState.restore(rows, self.n_features, self.spec.ttl_s, self.cap)
                self.clocks[p] = rows["clock"].astype(np.float64)
                self.written[p] = written

    def close(self) -> None:
        pass  # nothing of its own to let go (ReportFeedback has a reader)


def _messages(rows: dict[str, np.ndarray], reason: str) -> list[tuple[Message, str]]:
    if not rows or not len(rows.get("offset", ())):
        return []
    columns = (rows["partition"].tolist(), rows["offset"].tolist(), rows["value"].tolist())
    return [(Message(int(p), int(o), bytes(v)), reason) for p, o, v in zip(*columns, strict=True)]


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
