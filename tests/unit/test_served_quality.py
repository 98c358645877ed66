"""Served quality (streamlearn/observe/quality.py): answers joined with their later labels, per
served version, whichever comes first; a retried answer counts once; what never meets its other
half expires counted."""

from __future__ import annotations

import numpy as np
import pytest

from streamlearn.observe.quality import ServedQuality


def test_each_version_is_judged_on_the_answers_it_gave():
    rng = np.random.default_rng(0)
    truth = rng.random(4000) < 0.3
    ids = [f"e{i}" for i in range(4000)]
    good = np.where(truth, rng.uniform(0.6, 1.0, 4000), rng.uniform(0.0, 0.4, 4000))  # v2 separates the classes
    noise = rng.random(4000)  # v1 does not
    versions = np.where(np.arange(4000) < 2000, 1, 2)
    quality = ServedQuality("classification")
    assert quality.add_answers(ids, versions, np.where(versions == 1, noise, good), t=0.0) == 0
    assert quality.add_labels(ids, truth.astype(np.float32), t=3600.0) == 4000  # an hour later
    summary = quality.summary()
    assert summary[1]["joined"] == summary[2]["joined"] == 2000
    assert summary[2]["auc"] == pytest.approx(1.0) and abs(summary[1]["auc"] - 0.5) < 0.05
    assert summary[2]["logloss"] < summary[1]["logloss"]


def test_a_label_read_before_its_answer_waits_for_it_and_a_retry_counts_once():
    quality = ServedQuality("classification")
    assert quality.add_labels(["a", "b"], np.array([1.0, 0.0]), t=0.0) == 0
    assert quality.add_answers(["a", "a", "b"], np.array([3, 4, 3]), np.array([0.9, 0.8, 0.2]), t=1.0) == 2
    summary = quality.summary()
    assert list(summary) == [3] and summary[3]["joined"] == 2 and summary[3]["auc"] == 1.0
    assert quality.join.duplicates["events"] == 0  # the retry found the label taken, and now waits alone
    assert quality.join.pending == {"events": 1, "labels": 0}


def test_the_window_slides_and_what_never_met_expires_counted():
    quality = ServedQuality("regression", window=100, ttl_s=10.0)
    ids = [f"e{i}" for i in range(300)]
    quality.add_answers(ids, np.full(300, 7), np.zeros(300), t=0.0)
    quality.add_labels(ids[:250], np.r_[np.full(150, 5.0), np.ones(100)], t=1.0)
    summary = quality.summary()[7]
    assert summary["window"] == 100 and summary["joined"] == 250 and summary["mae"] == pytest.approx(1.0)
    assert quality.expire(now=20.0) == {"events.ttl": 50}  # 50 answers never labelled


def test_the_overall_window_spans_versions_and_only_the_newest_versions_keep_theirs():
    quality = ServedQuality("classification", window=100, keep_versions=3)
    for version in range(1, 6):
        ids = [f"v{version}-{i}" for i in range(40)]
        quality.add_answers(ids, np.full(40, version), np.linspace(0, 1, 40), t=0.0)
        quality.add_labels(ids, (np.arange(40) >= 20).astype(np.float32), t=0.0)
    assert list(quality.summary()) == [3, 4, 5] and list(quality.summary(newest=2)) == [4, 5]
    overall = quality.overall_summary()
    assert overall["window"] == 100 and overall["auc"] == pytest.approx(1.0)
    assert quality.joined_total == 200


def test_an_answers_message_round_trips_and_anything_else_is_refused():
    import orjson

    from streamlearn.serve.answers import decode_answers

    value = orjson.dumps({"version": 7, "t": 12.5, "ids": ["a", "b"], "scores": [0.25, 0.75]})
    assert decode_answers(value) == (["a", "b"], 7, [0.25, 0.75], 12.5)
    for bad in (b"not json", b'{"version": 1}', orjson.dumps({"version": 1, "t": 0, "ids": ["a"], "scores": []}),
                orjson.dumps({"version": "x", "t": 0, "ids": [], "scores": []})):
        with pytest.raises(ValueError, match="not an answers message"):
            decode_answers(bad)


def test_publishing_answers_needs_a_topic_and_its_kafka_and_events_with_an_id():
    from streamlearn.errors import ConfigError
    from streamlearn.pipeline import load_pipeline
    from streamlearn.serve.answers import id_field
    from streamlearn.serve.config import ServeConfig

    with pytest.raises(ConfigError, match="scores_topic and scores_bootstrap go together"):
        ServeConfig(scores_topic="transactions.scores")
    assert ServeConfig(scores_topic="t.scores", scores_bootstrap="127.0.0.1:9092").scores_topic == "t.scores"
    assert id_field(load_pipeline("fraud")) == "event_id"
    assert id_field(load_pipeline("fraud_delayed")) == "event_id"

    class NoId(load_pipeline("fraud").__class__):
        schema = load_pipeline("fraud").schema.__class__(name="no_id", fields=tuple(
            f for f in load_pipeline("fraud").schema.fields if f.name != "event_id"))

    with pytest.raises(ConfigError, match="no 'event_id' field"):
        id_field(NoId())


def test_with_unlabelled_as_an_answer_never_labelled_is_judged_as_silence_says():
    """Only frauds are reported: an answer with no label within the TTL (expired, or whose label
    came too late) is judged as legitimate; without `unlabelled_as` it would leave unjudged, and
    the frauds alone give no AUC."""
    quality = ServedQuality("classification", ttl_s=10.0, unlabelled_as=0.0)
    ids = [f"e{i}" for i in range(100)]
    scores = np.linspace(0.0, 1.0, 100)  # the ten highest are the frauds: a perfect ranking
    quality.add_answers(ids, np.full(100, 4), scores, t=0.0)
    assert quality.add_labels(ids[90:99], np.ones(9), t=5.0) == 9
    assert quality.overall_summary()["window"] == 9 and quality.unlabelled_total == 0
    assert quality.add_labels(["e99"], np.ones(1), t=12.0) == 0  # its chargeback comes after the TTL: late
    assert quality.expire(now=13.0) == {"events.late": 1, "events.ttl": 90}
    summary = quality.summary()[4]
    assert (summary["window"], summary["joined"], quality.unlabelled_total) == (100, 9, 91)
    assert summary["auc"] == pytest.approx(90 / 91)  # e99, judged legitimate, outranks the nine frauds
    cap = ServedQuality("classification", ttl_s=10.0, max_pending=5, unlabelled_as=0.0)
    cap.add_answers(ids[:10], np.full(10, 1), scores[:10], t=0.0)
    cap.expire(now=1.0)  # five pushed out by the cap before their TTL: judged as the trainer learned them
    assert (cap.unlabelled_total, cap.expire(now=11.0)) == (5, {"events.cap": 5, "events.ttl": 5})
    assert cap.unlabelled_total == 10


def test_with_delayed_feedback_an_answer_counts_only_once_its_label_matured_and_the_cap_leaves_it_unjudged():
    """Delayed feedback (issue 45): the TTL is the attribution window. An answer pushed out by the
    cap before it ended may still be a fraud whose report is weeks away: it leaves unjudged,
    counted, not judged legitimate as a joined label's answer is."""
    ids = [f"e{i}" for i in range(10)]
    quality = ServedQuality("classification", ttl_s=10.0, max_pending=5, unlabelled_as=0.0, matured_only=True)
    quality.add_answers(ids, np.full(10, 1), np.linspace(0, 1, 10), t=0.0)
    quality.expire(now=1.0)
    assert quality.unlabelled_total == 0 and quality.overall_summary()["window"] == 0  # the cap judges nothing
    assert quality.add_labels(["e9"], np.ones(1), t=2.0) == 1  # a report: matured as it comes
    assert quality.expire(now=11.0) == {"events.cap": 5, "events.ttl": 4}  # the window ended for four more
    assert quality.unlabelled_total == 4 and quality.overall_summary()["window"] == 5


def test_a_sample_of_event_ids_keeps_the_same_events_on_both_sides():
    rng = np.random.default_rng(3)
    ids = [f"evt-{i}" for i in range(20_000)]
    truth = rng.random(20_000) < 0.05
    quality = ServedQuality("classification", sample=0.1, unlabelled_as=0.0, matured_only=True, ttl_s=10.0)
    quality.add_answers(ids, np.full(20_000, 2), np.where(truth, 0.9, 0.1), t=0.0)
    kept = quality.join.pending["events"]
    assert 1_700 < kept < 2_300  # a tenth of the answers wait ...
    frauds = [i for i, t in zip(ids, truth, strict=True) if t]
    joined = quality.add_labels(frauds, np.ones(len(frauds)), t=1.0)
    assert 0.07 * len(frauds) < joined < 0.13 * len(frauds)  # ... and their reports, no other
    assert quality.join.pending["labels"] == 0  # a report of an event outside the sample is not kept waiting
    quality.expire(now=11.0)
    assert quality.overall_summary()["auc"] == pytest.approx(1.0) and quality.overall_summary()["window"] == kept


@pytest.mark.parametrize("sample", [0.0, -0.1, 1.5])
def test_a_sample_outside_zero_to_one_is_refused_with_how_to_fix_it(sample):
    from streamlearn.errors import ConfigError
    from streamlearn.observe.config import EvaluatorConfig

    with pytest.raises(ConfigError, match=r"share of event ids judged, in \(0, 1\].*one event in a hundred"):
        EvaluatorConfig(sample=sample)
    assert EvaluatorConfig(sample=0.01).sample == 0.01
