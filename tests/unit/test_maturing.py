"""Delayed feedback's matured labels (issue 45): the quality signals judge a fraud once its report
came and a legitimate payment once its attribution window ended unreported, never a fake negative.
`Maturing` finds the second kind from marks of the windows learned and the rank's row store;
`Watch` keeps the window's fake negatives away from the drift detectors' labelled signals and the
gate's evidence. Through Kafka and Ray: tests/integration/test_delayed_feedback.py."""

from __future__ import annotations

import dataclasses

import numpy as np

from streamlearn.ingest.decode import decode_events, feature_width
from streamlearn.ingest.feedback import ReportFeedback
from streamlearn.ingest.maturing import DENSITY, MARKS, SAMPLE, Maturing
from streamlearn.ingest.rowstore import RowStore
from streamlearn.ingest.windows import Window
from streamlearn.loadgen.generator import BankingSimulator, encode_batch
from streamlearn.loadgen.labels import encode_label
from streamlearn.pipeline import load_pipeline
from streamlearn.train.drift import DriftMonitor, Watch
from streamlearn.train.evidence import EvidenceSampler

from .test_feedback_join import Topic
from .test_joined_stream import Msg

PIPELINE = load_pipeline("fraud_chargebacks")
TTL_S = 100.0


def test_marks_stay_bounded_whatever_the_rate_and_events_mature_only_after_the_window():
    maturing = Maturing(TTL_S)
    spans = []
    # 3 attribution windows of a window every 0.01 s: 30,000 windows of 10 events, each asking
    for w in range(30_000):
        maturing.learned(0, 10 * w, 10 * w + 10, t=w * 0.01)
        start, end = maturing.due(0, clock=w * 0.01)
        assert len(maturing.marks[0]) <= MARKS + 2
        if end > start:
            assert (end // 10 - 1) * 0.01 + TTL_S <= w * 0.01 + 1e-9  # nothing matures early ...
            spans.append((start, end))
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # ... none twice
    assert (w * 0.01 - TTL_S) - (end // 10) * 0.01 <= TTL_S / MARKS + 0.02  # ... nor much late


class Rows:
    def read(self, p, offsets):
        return [np.array([p, o], np.float32) for o in offsets]


def test_matured_events_are_drawn_steadily_at_the_learning_pace_and_skip_the_reported():
    """A burst of matured offsets (a mark: 11 hours of events at a chargeback window of 120 days)
    is drawn from window after window, as many offsets as each window learned, not read at once:
    the gate judges every checkpoint, and one checkpoint in hours had matured negatives."""
    maturing = Maturing(TTL_S)
    maturing.learned(0, 0, 10_000, t=0.0)
    maturing.learned(1, 500, 1_500, t=0.0)
    clocks, reported = {0: TTL_S, 1: TTL_S}, {0: set(range(0, 10_000, 2))}
    assert maturing.sample(Rows(), {0: TTL_S - 1, 1: TTL_S - 1}, reported) is None  # not yet
    drawn = []
    for learned in ({0: 4_000, 1: 400}, {0: 6_000, 1: 600}):
        maturing.pace = dict(learned)  # what the windows between draws learned
        rows = maturing.sample(Rows(), clocks, reported, size=100)
        drawn.append({p: sorted(o for q, o in rows.astype(int).tolist() if q == p) for p in (0, 1)})
    maturing.pace = {0: 4_000, 1: 400}
    assert maturing.sample(Rows(), clocks, reported) is None  # all of it drawn
    first, second = drawn
    assert first[0][-1] < 4_000 <= second[0][0] and first[1][-1] < 900 <= second[1][0]  # oldest first, none twice
    assert all(o % 2 for d in drawn for o in d[0])  # never a reported event
    assert 35 <= len(first[0]) <= 91 and len(first[1]) == 10 and first[1][0] == 500  # each its share, spread
    # One in DENSITY of a draw's offsets is read back, at most `size`: 6,600 offsets -> 100 at most.
    assert sum(map(len, second.values())) <= 100 and len(second[1]) == 10 and second[1][-1] == 1_499


def test_a_mark_many_windows_long_still_gives_every_window_its_matured_negatives():
    """Windows 0.01 s apart, a mark every TTL_S / MARKS (0.39 s, ~39 windows): as at a bank's 120 days
    (a mark every 11 hours, a checkpoint every 2 s), marks mature in bursts far apart; the draw
    spreads each over the windows after it, so every window past the first burst has some."""
    maturing, with_some, drawn = Maturing(TTL_S), [], set()
    for w in range(int(1.5 * TTL_S / 0.01)):
        maturing.learned(0, 10 * w, 10 * w + 10, t=w * 0.01)
        rows = maturing.sample(Rows(), {0: w * 0.01}, {})
        with_some.append(rows is not None)
        offsets = [] if rows is None else rows[:, 1].astype(int).tolist()
        assert not drawn & set(offsets)  # none twice
        assert all((o // 10) * 0.01 + TTL_S <= w * 0.01 + 1e-9 for o in offsets)  # none early
        drawn.update(offsets)
    first = with_some.index(True)
    assert first * 0.01 < TTL_S + TTL_S / MARKS + 0.02 and all(with_some[first:])


def _stream(n: int, per_second: int = 10):
    """n events on two partitions, `per_second` of them a (Kafka) second, and where each went."""
    events = BankingSimulator(11).events(n)
    raw = encode_batch(events, with_label=False)
    topic: dict[int, list[Msg]] = {0: [], 1: []}
    placed = []
    for i, (e, v) in enumerate(zip(events, raw, strict=True)):
        p = i % 2
        placed.append((e, p, len(topic[p]), i / per_second))
        topic[p].append(Msg(p, len(topic[p]), v, int(1000 * i / per_second)))
    return placed, topic


def test_a_window_carries_the_events_that_matured_unreported_and_never_a_reported_one(tmp_path):
    spec = dataclasses.replace(PIPELINE.labels, ttl_s=TTL_S)
    placed, topic = _stream(6_000)  # 600 s: the first 500 s of events mature
    lookup = Topic(topic)
    feedback = ReportFeedback(spec, lookup, RowStore(tmp_path, feature_width(PIPELINE)))
    reported = {(p, o) for _, p, o, t in placed if o % 7 == 0}
    features = {}
    matured, n, windows_with = [], 0, []
    for start in range(0, 6_000, 200):  # windows of 20 s
        chunk = placed[start:start + 200]
        messages = [topic[p][o] for p in (0, 1) for _, q, o, _ in chunk if q == p]
        reports = [Msg(p, n + i, encode_label(e["event_id"], True, 0, at=(p, o)), 0)
                   for i, (e, p, o, _) in enumerate(chunk) if (p, o) in reported]
        n += len(reports)
        batch = feedback.batch(PIPELINE, Window(0, {}), decode_events(PIPELINE, messages), reports)
        windows_with.append(batch.matured is not None)
        features.update({x.tobytes(): (p, o, t) for x, (_, p, o, t) in
                         zip(batch.features[:batch.defaulted], sorted(chunk, key=lambda c: (c[1], c[2])), strict=True)})
        if batch.matured is not None:
            assert len(batch.matured) <= SAMPLE + 2
            clock = chunk[-1][3]
            for x in batch.matured:
                p, o, t = features[x.tobytes()]  # an event this rank learned ...
                assert (p, o) not in reported  # ... never a reported one ...
                assert t + TTL_S <= clock + 1e-9  # ... and only once its window ended
                matured.append((p, o))
            assert batch.matured_age_s >= TTL_S
    assert len(matured) == len(set(matured))  # each event judged once
    old_enough = {(p, o) for _, p, o, t in placed if t + TTL_S <= placed[-1][3] and (p, o) not in reported}
    assert set(matured) <= old_enough  # 25 windows' worth matured, drawn at the learning pace:
    assert len(matured) >= 0.8 * len(old_enough) / DENSITY  # one in DENSITY (less the reported) ...
    arrived = sorted(t for _, p, o, t in placed if (p, o) in set(matured))
    assert arrived[0] < 10 and arrived[-1] > 480  # ... spread over all that matured ...
    first = windows_with.index(True)
    assert all(windows_with[first:])  # ... window after window, not in bursts
    assert {p for p, _ in matured} == {0, 1}
    assert not lookup.reads  # every report's event and every matured one came from the row store


def test_a_restored_rank_goes_on_where_the_checkpoint_left_maturing(tmp_path):
    spec = dataclasses.replace(PIPELINE.labels, ttl_s=TTL_S)
    placed, topic = _stream(3_000)
    first = ReportFeedback(spec, Topic(topic), RowStore(tmp_path, feature_width(PIPELINE)))
    messages = [topic[p][o] for _, p, o, _ in placed[:2_000]]
    messages.sort(key=lambda m: (m.partition(), m.offset()))
    state = first.batch(PIPELINE, Window(0, {}, checkpoint=True), decode_events(PIPELINE, messages), []).join_delta
    again = ReportFeedback(spec, Topic(topic), RowStore(tmp_path, feature_width(PIPELINE)))
    again.restore(state, lambda p: True)
    assert again.maturing.marks == first.maturing.marks and again.maturing.matured_to == first.maturing.matured_to
    later = sorted((topic[p][o] for _, p, o, _ in placed[2_000:]), key=lambda m: (m.partition(), m.offset()))
    batch = again.batch(PIPELINE, Window(1, {}), decode_events(PIPELINE, later), [])
    assert batch.matured is not None and len(batch.matured) > 0  # not a whole attribution window's wait


def test_a_ranks_maturity_marks_go_with_its_checkpoint_to_the_rank_a_resize_hands_them_to(tmp_path):
    """Every rank keeps its partitions' marks in the checkpoint, so a partition that a resize moves
    to another rank matures there at once, not one whole attribution window later."""
    spec = dataclasses.replace(PIPELINE.labels, ttl_s=TTL_S)
    placed, topic = _stream(3_000)
    other = ReportFeedback(spec, Topic(topic), RowStore(tmp_path / "other", feature_width(PIPELINE)))
    state = None
    for start in range(0, 2_000, 200):
        chunk = sorted((topic[p][o] for _, p, o, _ in placed[start:start + 200]),
                       key=lambda m: (m.partition(), m.offset()))
        state = other.batch(PIPELINE, Window(0, {}, checkpoint=True), decode_events(PIPELINE, chunk), []).join_delta
    assert all(other.maturing.matured_to[p] > 0 for p in (0, 1))  # the matured marks went
    assert all(len(m) <= MARKS for m in other.maturing.marks.values())
    rank0 = ReportFeedback(spec, Topic(topic), RowStore(tmp_path / "other", feature_width(PIPELINE)))
    rank0.restore(state, lambda p: True)
    later = sorted((topic[p][o] for _, p, o, _ in placed[2_000:]), key=lambda m: (m.partition(), m.offset()))
    batch = rank0.batch(PIPELINE, Window(1, {}), decode_events(PIPELINE, later), [])
    assert batch.matured is not None and len(batch.matured) > 0  # not a whole attribution window's wait


def test_with_delayed_feedback_the_labelled_signals_see_reports_and_matured_negatives_only():
    drift = DriftMonitor("classification", {"x0": 0})
    watch = Watch(1_000, drift, evidence=EvidenceSampler(1_000), silent=0.0)
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    targets = np.array([0, 0, 1, 0, 0, 0, 1, 0, 0, 0], np.float32)  # two reports among fake negatives
    watch.observe(np.linspace(0, 1, 10), targets, lambda: x)  # a learned step
    assert drift.events == 10  # every learned row feeds the input detectors ...
    assert watch.take_evidence() is None and watch.matured.arrays()[0].size == 0  # ... none the labelled ones
    assert len(watch.arrays()[0]) == 10  # the prequential window keeps every row, as without
    matured = np.r_[x[[2, 6]], np.full((3, 2), 7.0, np.float32)]  # the reports and three matured negatives
    watch.observe_matured(np.array([0.9, 0.8, 0.1, 0.2, 0.3]), np.array([1, 1, 0, 0, 0], np.float32), matured,
                          age_s=TTL_S)
    assert watch.take_evidence() is None  # the gate's evidence is judged at the checkpoint (judge_pool) ...
    assert watch.gate_negatives().tolist() == matured[2:].tolist()  # ... its negatives kept till then
    assert len(watch.matured.arrays()[0]) == 5 and watch.matured_age_s == TTL_S


def test_a_window_s_reports_and_matured_negatives_are_scored_by_one_model_before_it_is_learned():
    """Scored by one model, neither class by a newer one than the other: positives scored mid-window
    and negatives after it held 3.4 % of good candidates (load/bench/gate_feedback.py)."""
    import torch

    from streamlearn.ingest.decode import Batch
    from streamlearn.phases import Phases
    from streamlearn.train.learner import Learner

    torch.manual_seed(0)
    model = PIPELINE.build_model()
    watch = Watch(1_000, evidence=EvidenceSampler(1_000), silent=0.0)
    learner = Learner(model, PIPELINE.make_optimizer(model.parameters()), PIPELINE, torch.device("cpu"), watch,
                      Phases(0))
    width = feature_width(PIPELINE)
    x = np.random.default_rng(1).random((6, width)).astype(np.float32)
    batch = Batch(Window(0, {0: (0, 4)}), x[:4], np.array([0, 1, 0, 1], np.float32), np.zeros(4, np.uint32), [],
                  matured=x[4:], matured_age_s=TTL_S)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner.judge_matured(batch)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # scoring learns nothing
    scores, targets = watch.matured.arrays()
    assert targets.tolist() == [1.0, 1.0, 0.0, 0.0]
    with torch.no_grad():
        want = PIPELINE.score(model(torch.from_numpy(np.r_[x[[1, 3]], x[4:]]))).numpy()
    assert np.allclose(scores, want) and watch.gate_negatives().tolist() == x[4:].tolist()


def test_a_checkpoints_evidence_is_the_reports_held_back_and_matured_negatives_scored_by_the_candidate():
    """At a checkpoint: the reports no version has learned yet (every rank's pool, with their
    events' places) and the newest matured negatives, scored by the model as checkpointed."""
    import torch

    from streamlearn.ingest.feedback import Pool
    from streamlearn.phases import Phases
    from streamlearn.train.learner import Learner

    torch.manual_seed(0)
    model = PIPELINE.build_model()
    watch = Watch(1_000, evidence=EvidenceSampler(1_000), silent=0.0)
    learner = Learner(model, PIPELINE.make_optimizer(model.parameters()), PIPELINE, torch.device("cpu"), watch,
                      Phases(0))
    x = np.random.default_rng(2).random((7, feature_width(PIPELINE))).astype(np.float32)
    watch.observe_matured(np.zeros(3), np.array([1, 0, 0], np.float32), x[:3])  # a report, two negatives
    pool = Pool(x[3:6], np.ones(3, np.float32), np.array([0, 0, 1]), np.array([10, 11, 7]))
    learner.judge_pool(pool)
    evidence = watch.take_evidence()
    assert evidence["targets"].tolist() == [1, 1, 1, 0, 0] and evidence["features"].tolist() == np.r_[
        x[3:6], x[1:3]].tolist()
    assert evidence["partition"].tolist() == [0, 0, 1, -1, -1] and evidence["offset"].tolist() == [10, 11, 7, -1, -1]
    with torch.no_grad():
        want = PIPELINE.score(model(torch.from_numpy(evidence["features"]))).numpy()
    assert np.allclose(evidence["scores"], want) and watch.take_evidence() is None  # taken once
