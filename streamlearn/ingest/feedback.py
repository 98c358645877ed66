"""Delayed feedback in training (issue 45): every event learned at once, its report applied when it comes.

A bank hears of a fraud weeks after the payment and of a legitimate payment never. With a
pipeline whose labels are `DelayedFeedback` (pipelines/fraud_chargebacks.py), each event of a
window is learned in that window with the silent answer (`unlabelled_as`), and nothing waits:
no join state, so memory and checkpoints do not grow with the delay. A report (a chargeback)
names its event by id and by its place in the events topic (`partition`, `offset`); the rank
that reads partition p of the events also reads partition p of the reports (a report is sent
with its event's key), re-reads the reported events from Kafka through a consumer of its own,
and learns each again with the report's answer. The loss makes up for the double count
(train/feedback.py, FNW).

Measured choice (docs/DECISIONS.md §20): a report carrying its event's coordinates costs the
producer nothing it does not have (a delivery report names the offset); a report carrying the
whole event would trust the reporter with the features the model learns. The rank finds the
event's features in its own store of the rows it learned (rowstore.py: one `pread`), and only
where that misses (another rank's partition before a resize, a dead-lettered event, a lost
file) re-reads the event from Kafka: one ranged read per run of nearby reported offsets.

What a report can be, and what happens to it (each counted or dead-lettered, none blocks):
- the silent answer ("legitimate"): changes nothing, counted as `ignored`;
- for an event past the topic's retention, not (yet) in the topic, with another id at its
  offset, or that was itself dead-lettered: dead-lettered with the reason;
- a second report for an event already reported: dead-lettered as a duplicate. The offsets of
  the reported events are the one state kept (8 bytes a report, per partition, in each
  checkpoint's join.npz); those behind the topic's retention are dropped, as their reports
  could no longer be applied anyway.

Exactly once: the events topic's and the reports topic's offsets are both in the checkpoint
(the window carries both ranges, as with joined labels), and so are the reported offsets as
they stood after the checkpoint window: a replay re-reads the same reports, re-reads the same
events, and decides the same (but for retention, which may have moved on: a report the lost
run applied may then be dead-lettered as out of retention, never applied twice).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import deque
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import numpy as np
from confluent_kafka import KafkaException

from streamlearn.config import KafkaSettings
from streamlearn.ingest.decode import Batch, Decoded, decode_events, feature_width, featurize
from streamlearn.ingest.join import by_partition
from streamlearn.ingest.labelled import LabelJoin
from streamlearn.ingest.maturing import Maturing
from streamlearn.ingest.reader import Message, RangeReader
from streamlearn.ingest.rowstore import RowStore, row_ids
from streamlearn.ingest.windows import Window
from streamlearn.logs import log
from streamlearn.pipeline import DelayedFeedback, Pipeline

WRONG_PARTITION = ("wrong_partition: the report is on partition {got} but names an event of partition {want}; "
                   "send a report with its event's key")
NOT_YET = "unknown_event: no event at {p}:{o} (the topic ends at {high})"
OUT_OF_RETENTION = "out_of_retention: the event at {p}:{o} is past the topic's retention (it starts at {low})"
OTHER_EVENT = "unknown_event: the event at {p}:{o} is {found!r}, not {want!r}"
BAD_EVENT = "unknown_event: the event at {p}:{o} was dead-lettered ({why})"
DUPLICATE = "duplicate_report: the event at {p}:{o} was reported already"
RUN_GAP = 512  # reported offsets closer than this are re-read in one range (a fetch is ~850 events)
# ... but a range never spans more than this, so a re-read holds at most this many messages at
# once however dense the reports: gaps under RUN_GAP can chain a range over a whole partition.
RUN_SPAN = 4096
# A lookup reads a few events here and there: it must not prefetch 64 MB past each one as the
# window's reader does (reader.FETCH_CONFIG), and it seeks before nearly every read, so the
# fetch after a seek must go at once: the reader's 20 ms fetch-queue back-off made a re-read
# 4.0 ms, 0.55 ms without it (one re-read per report at a month's delay; measured, 1,200 reads).
LOOKUP_FETCH = {"queued.max.messages.kbytes": 1024, "queued.min.messages": 1, "fetch.queue.backoff.ms": 0}
# Where the topic starts (its retention) is asked of the broker at most this often while every
# report's event is found in the row store (a re-read asks anyway): retention moves by segments
# of hours, and the question is a broker round trip per partition.
LOW_REFRESH_S = 60.0
MAX_HELD = 100_000  # reports held for their events, at most, per rank (past it one is applied at once)


class EventLookup:
    """Events re-read by their coordinates, through a consumer of their own: the window's reader
    reads on in order and must never seek back."""

    def __init__(self, settings: KafkaSettings, topic: str, group_id: str, fetch_timeout_s: float = 60.0):
        self.reader = RangeReader(settings, topic, group_id, fetch_timeout_s=fetch_timeout_s, fetch=LOOKUP_FETCH,
                                  pause_between_reads=True)

    def watermarks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        return self.reader.watermarks(partitions)

    def read(self, p: int, offsets: list[int]) -> dict[int, object]:
        """offset -> the message there, for sorted `offsets` of partition p, every one below the
        high watermark: one ranged read per run of nearby offsets, each at most RUN_SPAN long."""
        out: dict[int, object] = {}
        start = 0
        for i in range(1, len(offsets) + 1):
            if (i == len(offsets) or offsets[i] - offsets[i - 1] > RUN_GAP
                    or offsets[i] - offsets[start] >= RUN_SPAN):
                lo, hi = offsets[start], offsets[i - 1] + 1
                wanted = set(offsets[start:i])
                out.update((m.offset(), m) for m in self.reader.read_raw({p: (lo, hi)}) if m.offset() in wanted)
                start = i
        return out

    def close(self) -> None:
        self.reader.close()


class Held(NamedTuple):
    """A report whose event this rank has not learned yet, with a Kafka message's accessors
    (ordered by the event it names, then its own place: compared as a tuple, in C; a dataclass's
    generated comparisons were a fifth of a catch-up's join)."""

    event: int  # the offset of the event it names (in the same partition of the events topic)
    at: int  # the report's own partition ...
    report: int  # ... and offset in the reports topic
    raw: bytes

    def partition(self) -> int:
        return self.at

    def offset(self) -> int:
        return self.report

    def value(self) -> bytes:
        return self.raw


class Waiting(NamedTuple):
    """A report applied (its event found and checked) and held back from learning for the spec's
    `hold_events`: meanwhile it is evidence no version has learned, for the quality gate."""

    due: int  # learned in the window whose end on the partition reaches this offset ...
    until: float  # ... or once the partition's clock (its learned events' Kafka time, s) reaches this
    event: int  # the offset of the event it names
    x: np.ndarray  # the event's features
    crc: int
    y: float  # the report's answer


class Pool(NamedTuple):
    """The reports held back from learning, as arrays (rows in partition order): what the
    checkpoint's gate evidence takes its positives from (train/learner.py)."""

    x: np.ndarray
    y: np.ndarray
    partition: np.ndarray
    offset: np.ndarray  # of each report's event


class ReportFeedback:
    """One rank's (or Ray Data lane's) delayed feedback: its partitions' reported offsets, the
    reports held until their event is learned, and the rows of the events it learned (`rows`;
    None: every report's event is re-read)."""

    def __init__(self, spec: DelayedFeedback, lookup: EventLookup, rows: RowStore | None = None):
        self.spec, self.lookup, self.rows = spec, lookup, rows
        # The events that matured unreported, for the quality signals (maturing.py): read back
        # from the row store, so none without one. The marks are in each checkpoint (a few KB),
        # so a partition a resize hands to another rank matures from its checkpoint, not one
        # whole attribution window later.
        self.maturing = Maturing(spec.ttl_s) if rows is not None else None
        self.clocks: dict[int, float] = {}  # event partition -> its newest learned event's Kafka time (s)
        self.reported: dict[int, set[int]] = {}  # event partition -> offsets whose report was applied
        # Event partition -> where its learned events end. A report for an event past it waits
        # (`held`) until a window learns that event: a run catching up reads the reports' backlog
        # at the events' pace (windows.py), which puts a report a median delay ahead of its event.
        self.learned_to: dict[int, int] = {}
        self.held: dict[int, list[Held]] = {}
        self.waiting: dict[int, deque[Waiting]] = {}  # event partition -> reports applied, not yet learned
        self._marks: dict[int, tuple[int, int, float]] = {}  # partition -> (oldest, end, when asked)
        self._nothing: Decoded | None = None  # no event decoded: its empty arrays, once

    @property
    def pending(self) -> dict[str, int]:
        """What waits, for the meta: reports held for their events or held back from learning (no
        event ever waits)."""
        return {"events": 0, "labels": sum(map(len, self.held.values())) + sum(map(len, self.waiting.values()))}

    def batch(self, pipeline: Pipeline, window: Window, events: Decoded, label_messages: list) -> Batch:
        """The window's events with the silent answer, and the events its reports (and the held
        reports whose events it learns) name with theirs."""
        spec = self.spec
        for p, (_, end) in window.ranges.items():
            self.learned_to[p] = max(end, self.learned_to.get(p, 0))
        if self.rows is not None:  # before the reports: one may name an event of this very window
            try:
                self._keep(events)
            except OSError as e:  # a full or failing disk: go on re-reading events, never stop learning
                log("feedback_rows_off", error=f"{type(e).__name__}: {e}", found=self.rows.hits,
                    re_read=self.rows.misses)
                self.rows.close()
                self.rows = self.maturing = None
        label_messages = self._due() + list(label_messages)
        values = [m.value() for m in label_messages]
        found, kept, bad = spec.schema.decode_columns(values)
        refused = [(i, reason) for i, reason in bad]
        targets = pipeline.label_targets(found)
        ignored = int(np.sum(targets == spec.unlabelled_as))
        named: dict[int, list[tuple[int, int]]] = {}  # event partition -> [(row of `kept`, offset)], in order
        for row, (i, p, o) in enumerate(zip(kept, found["partition"], found["offset"], strict=True)):
            if targets[row] == spec.unlabelled_as:
                continue
            if p != (got := label_messages[i].partition()):
                refused.append((i, WRONG_PARTITION.format(got=got, want=p)))
            elif self._ahead(p, o):
                m = label_messages[i]
                heapq.heappush(self.held.setdefault(p, []), Held(o, m.partition(), m.offset(), values[i]))
            else:
                named.setdefault(p, []).append((row, o))
        for p, reports in sorted(named.items()):
            features, fingerprints, dead = self._apply(pipeline, p, reports, found[spec.key])
            applied = [(row, o) for row, o in reports if row not in dead]
            due = self.learned_to.get(p, 0) + spec.hold_events
            until = self.clocks.get(p, math.inf) + spec.hold_s  # no clock (no row store): by events only
            self.waiting.setdefault(p, deque()).extend(
                Waiting(due, until, o, features[i], crc, float(targets[row]))
                for i, ((row, o), crc) in enumerate(zip(applied, fingerprints.tolist(), strict=True)))
            refused += [(kept[row], reason) for row, reason in dead.items()]
        x, y, crcs = [events.x], [np.full(len(events.y), spec.unlabelled_as, np.float32)], [events.crcs]
        for rows in self._release(window.stop and not window.hand_over):
            x.append(np.stack([r.x for r in rows]))
            y.append(np.array([r.y for r in rows], np.float32))
            crcs.append(np.array([r.crc for r in rows], np.uint32))
        bad_labels = [(Message(label_messages[i].partition(), label_messages[i].offset(), values[i]), reason)
                      for i, reason in sorted(refused)]
        matured = self.maturing.sample(self.rows, self.clocks, self.reported) if self.maturing is not None else None
        # No report applied: the window's own arrays, as inline labels give them, not a copy.
        joined = (x[0], y[0], crcs[0]) if len(x) == 1 else (np.concatenate(x), np.concatenate(y), np.concatenate(crcs))
        return Batch(window, *joined, events.dead,
                     bad_labels=bad_labels, defaulted=len(events.y), ignored=ignored,
                     join_delta=self.delta() if window.checkpoint else None, matured=matured,
                     matured_age_s=self.maturing.age_s(self.clocks) if self.maturing else None)

    def _release(self, everything: bool) -> list[list[Waiting]]:
        """Each partition's reports whose hold is over (`everything`: the run's last window, which
        learns them all; a resize's next group restores them still held), in partition order, each
        partition's in the order they came."""
        out = []
        for p in sorted(self.waiting):
            waiting, end, now, rows = self.waiting[p], self.learned_to.get(p, 0), self.clocks.get(p, -math.inf), []
            while waiting and (everything or waiting[0].due <= end or waiting[0].until <= now):
                rows.append(waiting.popleft())
            if rows:
                out.append(rows)
            if not waiting:
                del self.waiting[p]
        return out

    def _ahead(self, p: int, o: int) -> bool:
        """Does this report name an event in the topic that this rank has not learned yet? (Not
        known where partition p starts for this rank, or past the topic's end: no, it is judged now.)"""
        if o < self.learned_to.get(p, o + 1) or self.pending["labels"] >= MAX_HELD:
            return False
        return o < self._marks.get(p, (0, 0, 0.0))[1] or o < self._bounds(p, fresh=True)[1]

    def _due(self) -> list[Held]:
        """The held reports whose events are learned now (in this window or before), in their
        events' order (each partition's are a heap on the event's offset: a catch-up holds thousands)."""
        due = []
        for p, held in list(self.held.items()):
            end = self.learned_to.get(p, 0)
            while held and held[0].event < end:
                due.append(heapq.heappop(held))
            if not held:
                del self.held[p]
        return due

    def _keep(self, events: Decoded) -> None:
        """The window's learned events into the row store, for the reports still to come."""
        partitions, offsets, runs = positions(events.messages)
        if len(events.kept) < len(offsets):  # dead-lettered events have no row
            kept = np.asarray(events.kept, np.int64)
            partitions, offsets = partitions[kept], offsets[kept]
        ids = row_ids(list(map(itemgetter(self.spec.key), events.events)))
        self.rows.add(partitions, offsets, ids, events.crcs, events.x)
        for p, first, last, newest in runs:  # retention, asked once a minute: files below it go
            if self.maturing is not None:  # where the partition's learned events end, and when
                t = newest.timestamp()[1] / 1000.0
                self.clocks[p] = max(t, self.clocks.get(p, t))
                self.maturing.learned(p, first, last + 1, self.clocks[p])
            try:
                self._bounds(p, fresh=False)
            except KafkaException:  # the broker away: pruning can wait a minute, learning cannot
                low, high, _ = self._marks.get(p, (0, 0, 0.0))
                self._marks[p] = (low, high, time.monotonic())

    def _apply(self, pipeline: Pipeline, p: int, reports: list[tuple[int, int]], ids: list[str]):
        """Partition p's reports, in order: find their events (the row store, else a re-read) and
        judge each report -> (the features and fingerprints to learn, in the reports' order;
        {report row: reason} of the refused). A report is refused if its event was reported
        before, is past the topic's retention or end, was dead-lettered, or has another id."""
        stored = (self.rows.get(p, [o for _, o in reports], row_ids([ids[row] for row, _ in reports]))
                  if self.rows else [None] * len(reports))
        done = self.reported.setdefault(p, set())
        missed = {o for (_, o), hit in zip(reports, stored, strict=True) if hit is None and o not in done}
        low, high = self._bounds(p, fresh=bool(missed))
        readable = sorted(o for o in missed if low <= o < high)
        if readable:
            messages = self.lookup.read(p, readable)
            events = decode_events(pipeline, [messages[o] for o in readable])
        else:  # every event found in the row store: decoding nothing cost ~170 us (the pipeline's own)
            events = self._nothing = self._nothing or decode_events(pipeline, [])
        dead_at = {m.offset: why for m, why in events.dead}
        row_at = {readable[j]: row for row, j in enumerate(events.kept)}  # offset -> its decoded row
        x, crcs, refused = [], [], {}
        for (row, o), hit in zip(reports, stored, strict=True):
            if o in done:
                refused[row] = DUPLICATE.format(p=p, o=o)
            elif o < low:
                refused[row] = OUT_OF_RETENTION.format(p=p, o=o, low=low)
            elif hit is not None:
                done.add(o)
                x.append(hit[0])
                crcs.append(hit[1])
            elif o >= high:
                refused[row] = NOT_YET.format(p=p, o=o, high=high)
            elif o in dead_at:
                refused[row] = BAD_EVENT.format(p=p, o=o, why=dead_at[o])
            elif (got := events.events[row_at[o]][self.spec.key]) != ids[row]:
                refused[row] = OTHER_EVENT.format(p=p, o=o, found=got, want=ids[row])
            else:
                done.add(o)
                x.append(events.x[row_at[o]])
                crcs.append(events.crcs[row_at[o]])
        width = events.x.shape[1:]
        return (np.stack(x) if x else np.empty((0, *width), events.x.dtype),
                np.asarray(crcs, np.uint32), refused)

    def _bounds(self, p: int, fresh: bool) -> tuple[int, float]:
        """(the topic's oldest offset, the next to be written) of partition p. Asked of the broker
        when `fresh` (a re-read or a hold follows) or the last answer is old; otherwise the oldest
        as last asked and no end (every event sought was found in the row store, so is in the topic)."""
        low, high, asked = self._marks.get(p, (0, 0, float("-inf")))
        if not fresh and time.monotonic() - asked < LOW_REFRESH_S:
            return low, float("inf")
        now_low, high = self.lookup.watermarks([p])[p]
        low = max(low, now_low)  # never back: a pruned offset stays pruned
        self._marks[p] = (low, high, time.monotonic())
        self._forget(p, low)
        if self.rows is not None:
            self.rows.prune(p, low)
        return low, high

    def _forget(self, p: int, low: int) -> None:
        """Reported offsets behind retention: their reports could not be applied again anyway."""
        done = self.reported.get(p)
        if done and min(done) < low:
            self.reported[p] = {o for o in done if o >= low}

    def delta(self) -> dict[str, np.ndarray]:
        """The whole state (a few bytes a report): each partition's reported offsets, where its
        learned events end, and the reports held for their events (their bytes and places)."""
        out = {f"p{p}/reported": np.sort(np.fromiter(done, np.int64, len(done))) for p, done in self.reported.items()}
        out |= {f"p{p}/learned_to": np.array([end], np.int64) for p, end in self.learned_to.items()}
        for p, waiting in self.waiting.items():
            out[f"p{p}/waiting.x"] = np.stack([r.x for r in waiting])
            out[f"p{p}/waiting.place"] = np.array([(r.due, r.event, r.crc) for r in waiting], np.int64).reshape(-1, 3)
            out[f"p{p}/waiting.y"] = np.array([r.y for r in waiting], np.float32)
            out[f"p{p}/waiting.until"] = np.array([r.until for r in waiting], np.float64)
        for p, held in self.held.items():
            out[f"p{p}/held.place"] = np.array([(h.at, h.report, h.event) for h in held], np.int64).reshape(-1, 3)
            out[f"p{p}/held.length"] = np.array([len(h.raw) for h in held], np.int64)
            out[f"p{p}/held.bytes"] = np.frombuffer(b"".join(h.raw for h in held), np.uint8)
        return out | (self.maturing.state() if self.maturing else {})

    snapshot = delta

    def restore(self, arrays: dict[str, np.ndarray], mine) -> None:
        for p, named in by_partition(arrays).items():
            if not mine(p):
                continue
            if "reported" in named:
                self.reported[p] = set(named["reported"].tolist())
            if "learned_to" in named:
                self.learned_to[p] = int(named["learned_to"][0])
            if "held.place" in named:
                raw, ends = named["held.bytes"].tobytes(), np.cumsum(named["held.length"]).tolist()
                self.held[p] = [Held(event, at, report, raw[end - n:end]) for (at, report, event), n, end
                                in zip(named["held.place"].tolist(), named["held.length"].tolist(), ends, strict=True)]
                heapq.heapify(self.held[p])
            if "waiting.place" in named:
                self.waiting[p] = deque(Waiting(due, until, event, x, crc, y) for (due, event, crc), until, x, y in zip(
                    named["waiting.place"].tolist(), named["waiting.until"].tolist(), named["waiting.x"],
                    named["waiting.y"].tolist(), strict=True))
            if self.maturing is not None:
                self.maturing.restore(p, named)

    def close(self) -> None:
        self.lookup.close()
        if self.rows is not None:  # how often the store spared a re-read, in the worker's log
            log("feedback_rows", found=self.rows.hits, re_read=self.rows.misses, partitions=sorted(self.reported),
                waited_for_writes_s=round(self.rows.waited_s, 3))
            self.rows.close()


def positions(messages: list) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, object]]]:
    """(partition, offset) of each of a slice's messages, as arrays, and each partition's run:
    (partition, its first offset, its last, its last message). A slice is partition after
    partition, each in offset order (reader.read_raw): a partition's offsets are its first one
    onwards unless the topic has gaps (compaction, transactions), found by its last one. Asking
    every message cost ~0.4 us an event, a third of what keeping its row costs."""
    n = len(messages)
    partitions, offsets = np.empty(n, np.int64), np.empty(n, np.int64)
    runs = []
    i = 0
    while i < n:
        p = messages[i].partition()
        j = bisect.bisect_right(messages, p, lo=i, key=lambda m: m.partition())
        first, last = messages[i].offset(), messages[j - 1].offset()
        partitions[i:j] = p
        if last - first == j - 1 - i:
            offsets[i:j] = np.arange(first, last + 1)
        else:
            offsets[i:j] = [m.offset() for m in messages[i:j]]
        runs.append((p, first, last, messages[j - 1]))
        i = j
    return partitions, offsets, runs


def held_back(join: dict[str, np.ndarray]) -> Pool | None:
    """The reports every rank (or Ray Data lane) holds back from learning, read from the group's
    join state as gathered for a checkpoint (each partition's `waiting.*`, `delta`): the whole
    group's, where each rank's own pool would give the gate 1/W of them. None if there are none."""
    parts = [(p, named) for p, named in sorted(by_partition(join).items()) if "waiting.y" in named]
    if not parts:
        return None
    return Pool(np.concatenate([named["waiting.x"] for _, named in parts]),
                np.concatenate([named["waiting.y"] for _, named in parts]).astype(np.float32, copy=False),
                np.concatenate([np.full(len(named["waiting.y"]), p, np.int64) for p, named in parts]),
                np.concatenate([named["waiting.place"][:, 1] for _, named in parts]))


def make_join(pipeline: Pipeline, settings: KafkaSettings, topic: str, group_id: str, partitions: int,
              rows_dir: Path | None = None):
    """What a rank (or a Ray Data lane) joins its labels topic with: the join of labels that come
    within a TTL (LabelJoin), or delayed feedback's reports (ReportFeedback: events found in a row
    store under `rows_dir`, the run's, else re-read from `topic`; its windows carry matured
    negatives for the quality signals, maturing.py)."""
    spec = pipeline.labels
    if isinstance(spec, DelayedFeedback):
        x0 = np.asarray(featurize(pipeline, [], [], [])[0])
        rows = RowStore(rows_dir, x0.shape[1], x0.dtype) if rows_dir is not None else None
        return ReportFeedback(spec, EventLookup(settings, topic, group_id), rows)
    return LabelJoin(spec, feature_width(pipeline), partitions)
