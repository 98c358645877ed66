"""Delayed feedback's window (`ReportFeedback.batch`, what a direct-path rank and a Ray Data lane
both run) over an events topic held in memory: every event learned at once as legitimate, each
report's event found in the rank's row store or re-read by its coordinates and learned again as
a fraud, and every report that cannot be applied dead-lettered with its reason. Kafka itself,
through a worker kill: tests/integration/test_delayed_feedback.py."""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.ingest.decode import decode_events, feature_width
from streamlearn.ingest.feedback import LOW_REFRESH_S, RUN_SPAN, EventLookup, ReportFeedback, held_back
from streamlearn.ingest.rowstore import RowStore
from streamlearn.ingest.windows import Window
from streamlearn.loadgen.generator import BankingSimulator, encode_batch
from streamlearn.loadgen.labels import encode_label
from streamlearn.pipeline import DelayedFeedback, load_pipeline
from streamlearn.schema import reason_code

from .test_joined_stream import Msg

PIPELINE = load_pipeline("fraud_chargebacks")
# Reports learned in the window they come (the hold has tests of its own, below).
SPEC = replace(PIPELINE.labels, hold_events=0)


class Topic:
    """The events topic, partition by partition, with the oldest offset retention keeps."""

    def __init__(self, partitions: dict[int, list[Msg]], low: dict[int, int] | None = None):
        self.partitions, self.low = partitions, low or {}
        self.asked = self.reads = 0  # broker round trips a real lookup would make

    def watermarks(self, partitions):
        self.asked += len(partitions)
        return {p: (self.low.get(p, 0), len(self.partitions[p])) for p in partitions}

    def read(self, p, offsets):
        self.reads += len(offsets)
        return {o: self.partitions[p][o] for o in offsets}

    def close(self):
        pass


def _events(seed: int, n: int, partitions: int = 2):
    events = BankingSimulator(seed).events(n)
    raw = encode_batch(events, with_label=False)
    by_partition: dict[int, list[Msg]] = {p: [] for p in range(partitions)}
    placed = []
    for e, v in zip(events, raw, strict=True):
        p = len(placed) % partitions
        placed.append((e, v, p, len(by_partition[p])))
        by_partition[p].append(Msg(p, len(by_partition[p]), v, e["event_time"]))
    return placed, by_partition


def _report(e: dict, p: int, o: int, n: int, label: bool = True, on: int | None = None) -> Msg:
    return Msg(p if on is None else on, n, encode_label(e["event_id"], label, e["event_time"] + 1, at=(p, o)), 0)


def _batch(feedback: ReportFeedback, messages: list[Msg], reports: list[Msg], checkpoint: bool = False):
    return feedback.batch(PIPELINE, Window(0, {}, checkpoint=checkpoint), decode_events(PIPELINE, messages), reports)


def test_every_event_is_learned_at_once_as_legitimate_and_a_reported_one_again_as_a_fraud():
    placed, topic = _events(4, 200)
    feedback = ReportFeedback(SPEC, Topic(topic))
    messages = [m for p in sorted(topic) for m in topic[p]]
    frauds = [(e, v, p, o) for e, v, p, o in placed if e["is_fraud"]] or placed[:3]
    reports = [_report(e, p, o, n) for n, (e, _, p, o) in enumerate(frauds)]
    batch = _batch(feedback, messages, reports)
    assert batch.size == 200 + len(frauds) and batch.defaulted == 200 and not batch.bad_labels
    assert batch.targets.tolist() == [0.0] * 200 + [1.0] * len(frauds)
    assert sorted(batch.crcs[200:].tolist()) == sorted(zlib.crc32(v) for _, v, _, _ in frauds)
    # the re-read rows are the reported events' own features
    by_crc = dict(zip(batch.crcs[:200].tolist(), batch.features[:200], strict=True))
    assert all(np.array_equal(by_crc[c], x) for c, x in zip(batch.crcs[200:].tolist(), batch.features[200:],
                                                           strict=True))


def _stores(tmp_path):
    return RowStore(tmp_path, feature_width(PIPELINE))


def test_a_report_finds_its_event_in_the_row_store_and_learns_what_a_re_read_gives(tmp_path):
    placed, topic = _events(4, 200)
    messages = [m for p in sorted(topic) for m in topic[p]]
    frauds = [(e, v, p, o) for e, v, p, o in placed if e["is_fraud"]] or placed[:3]
    reports = [_report(e, p, o, n) for n, (e, _, p, o) in enumerate(frauds)]
    plain, stored_topic = Topic(topic), Topic(topic)
    re_read = ReportFeedback(SPEC, plain)
    stored = ReportFeedback(SPEC, stored_topic, _stores(tmp_path))
    for feedback in (re_read, stored):  # the events' window, then (later) their reports'
        _batch(feedback, messages, [])
    a, b = _batch(re_read, [], reports), _batch(stored, [], reports)
    assert b.size == len(frauds) and b.targets.tolist() == a.targets.tolist() and not b.bad_labels
    assert b.features.tobytes() == a.features.tobytes() and b.crcs.tolist() == a.crcs.tolist()
    assert plain.reads == len(frauds) and stored_topic.reads == 0  # not one event re-read
    assert stored_topic.asked == len({p for _, _, p, _ in frauds})  # retention, once per partition
    again = [_report(e, p, o, n) for n, (e, _, p, o) in enumerate(frauds)]
    assert {reason_code(r) for _, r in _batch(stored, [], again).bad_labels} == {"duplicate_report"}
    assert stored_topic.asked == len({p for _, _, p, _ in frauds})  # not again within LOW_REFRESH_S
    assert LOW_REFRESH_S >= 10


def test_a_report_whose_row_is_gone_re_reads_its_event(tmp_path):
    placed, topic = _events(4, 60)
    messages = [m for p in sorted(topic) for m in topic[p]]
    e, _, p, o = placed[9]
    store = _stores(tmp_path)
    feedback = ReportFeedback(SPEC, (lookup := Topic(topic)), store)
    _batch(feedback, messages, [])
    for f in store.dir.iterdir():  # lost (another node's disk, a wiped directory)
        f.unlink()
    store.close()
    batch = _batch(feedback, [], [_report(e, p, o, 0)])
    assert batch.size == 1 and lookup.reads == 1 and batch.crcs.tolist() == [zlib.crc32(placed[9][1])]


@pytest.mark.parametrize("stored", [False, True], ids=["re-read", "row-store"])
def test_reports_that_cannot_be_applied_are_dead_lettered_with_their_reason_and_the_silent_answer_is_counted(
        stored, tmp_path):
    placed, topic = _events(5, 40)
    topic[1].append(Msg(1, len(topic[1]), b"{not json", 0))  # a malformed event, dead-lettered when read
    feedback = ReportFeedback(SPEC, Topic(topic, low={0: 4}), _stores(tmp_path) if stored else None)
    if stored:  # every event's window first: the store holds each valid one
        assert _batch(feedback, [m for q in sorted(topic) for m in topic[q]], []).dead_lettered == 1
    (e0, _, _, o0), (e1, _, _, o1) = [x for x in placed if x[2] == 0][5:7]
    (e2, _, _, o2) = [x for x in placed if x[2] == 1][3]
    reports = [
        _report(e0, 0, o0, 0),  # applied
        _report(e0, 0, o0, 1),  # the same event again
        _report(e1, 0, 1, 2),  # behind retention (partition 0 starts at 4)
        _report(e1, 0, 999, 3),  # past the topic's end
        _report(e1, 0, o0 + 2, 4),  # someone else's event there
        _report(e2, 1, o2, 5, on=0),  # names partition 1, sent on partition 0
        _report(e2, 1, len(topic[1]) - 1, 6, on=1),  # the malformed event's offset
        _report(e1, 0, o1, 7, label=False),  # "legitimate": nothing to learn
        Msg(0, 8, b'{"event_id": "x", "label": true}', 0),  # malformed report
    ]
    batch = _batch(feedback, [], reports)
    assert batch.size == 1 and batch.targets.tolist() == [1.0] and batch.ignored == 1
    reasons = {m.offset: reason_code(r) for m, r in batch.bad_labels}
    assert reasons == {1: "duplicate_report", 2: "out_of_retention", 3: "unknown_event", 4: "unknown_event",
                       5: "wrong_partition", 6: "unknown_event", 8: "missing_field"}
    assert all(m.value == reports[m.offset].value() for m, _ in batch.bad_labels)  # each with its own bytes


def test_a_report_applied_before_a_checkpoint_stays_applied_after_a_restore():
    placed, topic = _events(6, 20)
    e, _, p, o = placed[7]
    feedback = ReportFeedback(SPEC, Topic(topic))
    first = _batch(feedback, [], [_report(e, p, o, 0)], checkpoint=True)
    assert first.size == 1 and first.join_delta == {f"p{p}/reported": np.array([o])}
    resumed = ReportFeedback(SPEC, Topic(topic))
    resumed.restore(first.join_delta, lambda q: q == p)
    again = _batch(resumed, [], [_report(e, p, o, 1)])
    assert again.size == 0 and [reason_code(r) for _, r in again.bad_labels] == ["duplicate_report"]


class RangeRecorder:
    """A reader that records the ranges asked of it and has a message at every offset."""

    def __init__(self):
        self.ranges: list = []

    def read_raw(self, ranges):
        self.ranges.append(ranges)
        (p, (lo, hi)), = ranges.items()
        return [Msg(p, o, b"", 0) for o in range(lo, hi)]


def _recording_lookup() -> EventLookup:
    lookup = EventLookup.__new__(EventLookup)
    lookup.reader = RangeRecorder()
    return lookup


def test_nearby_reported_offsets_are_re_read_in_one_range_and_far_ones_apart():
    lookup = _recording_lookup()
    wanted = [10, 12, 300, 5000, 5001]
    assert sorted(lookup.read(3, wanted)) == wanted
    assert lookup.reader.ranges == [{3: (10, 301)}, {3: (5000, 5002)}]


def test_dense_reports_are_re_read_in_bounded_ranges():
    # Reports every 300 offsets over 100k: chained by their gaps, one range held them all at once.
    lookup = _recording_lookup()
    wanted = list(range(0, 100_000, 300))
    assert sorted(lookup.read(0, wanted)) == wanted
    spans = [hi - lo for r in lookup.reader.ranges for lo, hi in r.values()]
    assert max(spans) <= RUN_SPAN and sum(spans) < 100_000 + len(spans)


def test_delayed_feedback_refuses_a_contract_it_cannot_keep():
    from pipelines.banking import LABEL, REPORT

    with pytest.raises(ConfigError, match="partition"):
        DelayedFeedback(LABEL, unlabelled_as=0.0)
    with pytest.raises(ConfigError, match="unlabelled_as"):
        DelayedFeedback(REPORT)
    with pytest.raises(ConfigError, match="correction"):
        DelayedFeedback(REPORT, unlabelled_as=0.0, correction="fnc")
    with pytest.raises(ConfigError, match="hold_events"):
        DelayedFeedback(REPORT, unlabelled_as=0.0, hold_events=-1)
    with pytest.raises(ConfigError, match="hold_s"):
        DelayedFeedback(REPORT, unlabelled_as=0.0, hold_s=float("nan"))


def _window(seq: int, ranges: dict, checkpoint: bool = False) -> Window:
    return Window(seq, ranges, checkpoint=checkpoint)


def test_a_report_read_before_its_event_waits_for_the_window_that_learns_it(tmp_path):
    # A run catching up reads the reports' backlog at the events' pace (windows.py), so a report
    # may come in a window before the one that learns its event.
    placed, topic = _events(7, 80)
    e, value, p, o = next(x for x in placed if x[3] >= 20)
    lookup = Topic(topic)
    feedback = ReportFeedback(SPEC, lookup, _stores(tmp_path))
    first = {q: (0, 10) for q in topic}
    batch = feedback.batch(PIPELINE, _window(0, first, checkpoint=True),
                           decode_events(PIPELINE, [m for q in sorted(topic) for m in topic[q][:10]]),
                           [_report(e, p, o, 0), _report(e, p, 10**6, 1)])
    assert batch.size == 20 and [reason_code(r) for _, r in batch.bad_labels] == ["unknown_event"]  # past the end
    assert feedback.pending == {"events": 0, "labels": 1} and batch.join_delta[f"p{p}/held.length"].size == 1

    # Through a checkpoint: a resumed rank holds it still, and applies it with its event's window.
    resumed = ReportFeedback(SPEC, lookup, _stores(tmp_path))
    resumed.restore(batch.join_delta, lambda q: True)
    assert resumed.pending == {"events": 0, "labels": 1}
    rest = {q: (10, len(topic[q])) for q in topic}
    later = resumed.batch(PIPELINE, _window(1, rest), decode_events(PIPELINE, [m for q in sorted(topic)
                                                                            for m in topic[q][10:]]), [])
    events_learned = sum(len(topic[q]) - 10 for q in topic)
    assert later.size == events_learned + 1 and later.targets.tolist()[-1] == 1.0 and not later.bad_labels
    assert later.crcs.tolist()[-1] == zlib.crc32(value)
    assert lookup.reads == 0 and resumed.pending["labels"] == 0  # from the row store, nothing held


def test_a_store_that_cannot_be_written_is_given_up_and_every_report_re_reads(tmp_path):
    placed, topic = _events(8, 40)
    (tmp_path / "rows").write_text("a file where the store's directory should be")  # writes fail
    lookup = Topic(topic)
    feedback = ReportFeedback(SPEC, lookup, RowStore(tmp_path / "rows", feature_width(PIPELINE)))
    e, value, p, o = placed[5]
    first = _batch(feedback, [m for q in sorted(topic) for m in topic[q]], [_report(e, p, o, 0)])
    assert first.size == 41 and feedback.rows is None and lookup.reads == 1
    assert first.crcs.tolist()[-1] == zlib.crc32(value)


def test_a_write_that_fails_in_the_stores_thread_gives_the_store_up_at_the_next_window(tmp_path, monkeypatch):
    from streamlearn.ingest import rowstore

    def full(fd, data, at):
        raise OSError(28, "No space left on device")

    placed, topic = _events(4, 60)
    e, value, p, o = placed[9]
    monkeypatch.setattr(rowstore.os, "pwrite", full)
    feedback = ReportFeedback(SPEC, (lookup := Topic(topic)), _stores(tmp_path))
    first = _batch(feedback, [m for q in sorted(topic) for m in topic[q]], [])  # its rows' write fails, unseen
    batch = _batch(feedback, [], [_report(e, p, o, 0)])  # this window sees it: the event is re-read
    assert first.size == 60 and batch.size == 1 and feedback.rows is None and lookup.reads == 1
    assert batch.crcs.tolist() == [zlib.crc32(value)] and not batch.bad_labels


def test_an_applied_report_is_held_back_from_learning_and_is_the_gates_evidence_meanwhile(tmp_path):
    """With `hold_events`, a report applied waits until its partition has learned that many more
    events: meanwhile no version has learned it, and each checkpoint window's join state carries it
    (the pool) for the gate. Learned once, with its event's features, through a checkpoint and a restore."""
    spec = replace(PIPELINE.labels, hold_events=20, hold_s=1e12)  # by events (the clock: its own test)
    placed, topic = _events(8, 120)
    e, value, p, o = next(x for x in placed if x[3] == 5)
    lookup = Topic(topic)
    feedback = ReportFeedback(spec, lookup, _stores(tmp_path))

    def window(seq: int, lo: int, hi: int, checkpoint: bool = False, stop: bool = False):
        return Window(seq, {q: (lo, hi) for q in topic}, checkpoint=checkpoint, stop=stop)

    def events(lo: int, hi: int):
        return decode_events(PIPELINE, [m for q in sorted(topic) for m in topic[q][lo:hi]])

    first = feedback.batch(PIPELINE, window(0, 0, 10, checkpoint=True), events(0, 10), [_report(e, p, o, 0)])
    assert first.size == 20 and first.targets.max() == 0.0  # applied, not learned: due at offset 30
    assert feedback.pending == {"events": 0, "labels": 1}
    pool = held_back(first.join_delta)
    assert pool.partition.tolist() == [p] and pool.offset.tolist() == [o]
    assert pool.y.tolist() == [1.0] and np.array_equal(pool.x[0], first.features[[
        i for i, c in enumerate(first.crcs.tolist()) if c == zlib.crc32(value)][0]])
    again = _batch(feedback, [], [_report(e, p, o, 1)])  # reported twice while it waits: still once
    assert [reason_code(r) for _, r in again.bad_labels] == ["duplicate_report"]

    resumed = ReportFeedback(spec, lookup, _stores(tmp_path))  # a restart at the checkpoint
    resumed.restore(first.join_delta, lambda q: True)
    assert resumed.pending["labels"] == 1
    waiting = resumed.batch(PIPELINE, window(1, 10, 29), events(10, 29), [])
    assert waiting.size == 38 and waiting.targets.max() == 0.0 and waiting.join_delta is None  # no checkpoint here
    due = resumed.batch(PIPELINE, window(2, 29, 30, checkpoint=True), events(29, 30), [])
    assert due.size == 3 and due.targets.tolist() == [0.0, 0.0, 1.0] and due.crcs.tolist()[-1] == zlib.crc32(value)
    assert held_back(due.join_delta) is None and resumed.pending["labels"] == 0 and lookup.reads == 0


def test_the_gates_pool_is_every_ranks_held_reports_in_partition_order(tmp_path):
    """Each rank reads its own partitions and holds their reports; the checkpoint gathers every
    rank's join state, and the pool read from it has them all (rank 0's own would be 1/W of them)."""
    spec = replace(PIPELINE.labels, hold_events=10**6, hold_s=1e12)
    placed, topic = _events(9, 80)
    states = []
    for rank, p in ((0, 1), (1, 0)):  # rank r reads partition 1 - r: the pool is ordered by partition
        mine = {p: topic[p]}
        reported = [x for x in placed if x[2] == p][3:5]
        feedback = ReportFeedback(spec, Topic(mine), RowStore(tmp_path / str(rank), feature_width(PIPELINE)))
        batch = feedback.batch(PIPELINE, Window(0, {p: (0, 40)}, checkpoint=True), decode_events(PIPELINE, mine[p]),
                               [_report(e, q, o, n) for n, (e, _, q, o) in enumerate(reported)])
        assert batch.targets.max() == 0.0 and not batch.bad_labels  # held back, none learned as a fraud
        states.append(batch.join_delta)
    pool = held_back({name: a for state in states for name, a in state.items()})
    assert pool.partition.tolist() == [0, 0, 1, 1] and pool.offset.tolist() == [3, 4, 3, 4]
    by_place = {(p, o): v for _, v, p, o in placed}
    fresh = decode_events(PIPELINE, [Msg(p, o, by_place[p, o], 0) for p, o in ((0, 3), (0, 4), (1, 3), (1, 4))])
    assert pool.x.tobytes() == fresh.x.tobytes() and pool.y.tolist() == [1.0] * 4
    assert held_back(states[0] | {"p5/reported": np.array([1])}).partition.tolist() == [1, 1]  # no waiting: none


def test_the_runs_last_window_learns_every_report_still_held_back_and_a_resizes_hands_them_over(tmp_path):
    spec = replace(PIPELINE.labels, hold_events=10**6)
    placed, topic = _events(8, 40)
    frauds = [(e, p, o) for e, _, p, o in placed[:6]]
    feedback = ReportFeedback(spec, Topic(topic), _stores(tmp_path))
    feedback.batch(PIPELINE, Window(0, {q: (0, 20) for q in topic}), decode_events(
        PIPELINE, [m for q in sorted(topic) for m in topic[q]]), [_report(e, p, o, n) for n, (e, p, o) in
                                                                  enumerate(frauds)])
    assert feedback.pending["labels"] == 6
    # A resize's stop window hands them over held: the next group restores them from its checkpoint.
    handed = feedback.batch(PIPELINE, Window(1, {}, checkpoint=True, stop=True, hand_over=True),
                            decode_events(PIPELINE, []), [])
    assert handed.size == 0 and feedback.pending["labels"] == 6
    next_group = ReportFeedback(spec, Topic(topic), _stores(tmp_path))
    next_group.restore(handed.join_delta, lambda q: True)
    assert held_back(handed.join_delta).offset.tolist() == sorted(o for _, _, o in frauds[::2]) + sorted(
        o for _, _, o in frauds[1::2])  # the gate's pool goes on in the next group
    last = next_group.batch(PIPELINE, Window(2, {}, stop=True), decode_events(PIPELINE, []), [])
    assert last.size == 6 and last.targets.tolist() == [1.0] * 6 and next_group.pending["labels"] == 0


def test_a_report_held_back_is_learned_once_its_partitions_event_time_moved_on_hold_s(tmp_path):
    """A slow stream takes long to learn `hold_events`: a report waits no longer than `hold_s` of its
    partition's events' Kafka time (the clock the rank learned them on, so a replay decides alike)."""
    placed, topic = _events(8, 120)
    e, _, p, o = next(x for x in placed if x[3] == 5)
    seconds = (topic[p][19].timestamp()[1] - topic[p][9].timestamp()[1]) / 1000.0 - 0.001  # float rounding
    assert seconds > (topic[p][19].timestamp()[1] - topic[p][18].timestamp()[1]) / 1000.0
    feedback = ReportFeedback(replace(PIPELINE.labels, hold_events=10**6, hold_s=seconds), Topic(topic),
                              _stores(tmp_path))

    def learn(seq: int, lo: int, hi: int, reports=()):
        window = Window(seq, {q: (lo, hi) for q in topic})
        return feedback.batch(PIPELINE, window, decode_events(PIPELINE, [m for q in sorted(topic)
                                                                        for m in topic[q][lo:hi]]), list(reports))

    assert learn(0, 0, 10, [_report(e, p, o, 0)]).targets.max() == 0.0  # the clock at offset 9's time
    assert learn(1, 10, 19).targets.max() == 0.0 and feedback.pending["labels"] == 1
    assert learn(2, 19, 20).targets.tolist() == [0.0, 0.0, 1.0] and feedback.pending["labels"] == 0
