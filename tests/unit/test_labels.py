"""Delayed labels in the load generator: the delay spec, the queue, and what run_load sends."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.loadgen import generator
from streamlearn.loadgen.generator import BankingSimulator, encode_batch, partition_for, run_load
from streamlearn.loadgen.labels import LabelDelay, LabelPlan, LabelQueue, parse_label_delay

from .test_generator import stub  # noqa: F401 -- the recording producer fixture


@pytest.mark.parametrize(("spec", "expected"), [
    ("fixed:2", LabelDelay("fixed", 2.0)), ("uniform:1:30", LabelDelay("uniform", 1.0, 30.0)),
    ("exp:5", LabelDelay("exp", 5.0)), (" exp:0.5 ", LabelDelay("exp", 0.5)),
])
def test_label_delay_specs_parse(spec, expected):
    assert parse_label_delay(spec) == expected
    assert parse_label_delay(str(expected)) == expected  # the summary's spelling parses back


@pytest.mark.parametrize("spec", ["", "exp", "exp:", "exp:x", "exp:1:2", "uniform:5:1", "fixed:-1", "gauss:1",
                                  "fixed:inf"])
def test_bad_label_delay_specs_say_what_is_accepted(spec):
    with pytest.raises(ConfigError, match="label delay"):
        parse_label_delay(spec)


def test_unlabelled_fraction_outside_zero_to_one_is_refused():
    with pytest.raises(ConfigError, match="unlabelled_fraction"):
        LabelPlan(LabelDelay("fixed", 1.0), unlabelled_fraction=1.5)


def _queue(plan: LabelPlan, n: int = 10_000, seed: int = 7) -> tuple[LabelQueue, list[dict]]:
    events = BankingSimulator(seed).events(n)
    keys = [e["customer_id"].encode() for e in events]
    queue = LabelQueue(plan, seed)
    queue.add(events, keys, [partition_for(k, 4) for k in keys], sent_at=100.0)
    return queue, events


def test_labels_leave_when_due_soonest_first_with_the_events_answer():
    queue, events = _queue(LabelPlan(parse_label_delay("uniform:1:5")))
    assert len(queue) == len(events) and queue.next_due() >= 101.0
    assert queue.due(100.99) == []
    early = queue.due(103.0)
    late = queue.due(105.0)
    assert 0 < len(early) < len(events) and len(early) + len(late) == len(events) and len(queue) == 0
    truth = {e["event_id"]: e for e in events}
    for value, key, partition, label_ms in early + late:
        label = json.loads(value)
        event = truth[label["event_id"]]
        assert label["label"] == event["is_fraud"] and key == event["customer_id"].encode()
        assert partition == partition_for(key, 4)  # a label lands in its event's partition number
        assert 1000 <= label["label_time"] - event["event_time"] <= 5000 and label_ms == label["label_time"]


def test_the_unlabelled_share_never_gets_a_label_and_the_draws_repeat_per_seed():
    queue, events = _queue(LabelPlan(parse_label_delay("exp:2"), unlabelled_fraction=0.3))
    assert len(queue) + queue.unlabelled == len(events)
    assert 0.28 < queue.unlabelled / len(events) < 0.32
    again, _ = _queue(LabelPlan(parse_label_delay("exp:2"), unlabelled_fraction=0.3))
    assert queue.due(1e9) == again.due(1e9)


def test_events_sent_without_their_label_are_otherwise_the_same_json():
    events = BankingSimulator(3).events(50)
    for e, with_label, without in zip(events, encode_batch(events), encode_batch(events, with_label=False),
                                      strict=True):
        full, bare = json.loads(with_label), json.loads(without)
        assert "is_fraud" not in bare and full.pop("is_fraud") == e["is_fraud"] and full == bare


def test_run_load_sends_each_valid_events_label_after_it_and_none_for_bad_events(stub, monkeypatch):  # noqa: F811
    topics: list[str] = []
    record = generator._produce

    def produce(producer, topic, value, key, partition, failures, **extra):
        topics.append(topic)
        record(producer, topic, value, key, partition, failures, **extra)

    monkeypatch.setattr(generator, "_produce", produce)
    plan = LabelPlan(parse_label_delay("fixed:0.2"), unlabelled_fraction=0.1)
    summary = run_load("localhost:1", "tx", partitions=4, count=3000, bad_fraction=0.02, seed=5, labels=plan)
    sent = list(zip(topics, stub[0].sent, strict=True))
    events = [value for topic, (_, value, _) in sent if topic == "tx"]
    labels = [json.loads(value) for topic, (_, value, _) in sent if topic == "tx.labels"]
    assert topics.index("tx.labels") > 0 and len(events) == summary["events"] == 3000 and summary["bad"] == 60
    assert summary["labels"] == {"topic": "tx.labels", "sent": len(labels), "delay": "fixed:0.2",
                                 "unlabelled": summary["valid"] - len(labels), "unlabelled_fraction": 0.1,
                                 "fraud_only": False, "simulated_clock": False}
    assert 0.07 < summary["labels"]["unlabelled"] / summary["valid"] < 0.13
    valid = [json.loads(v) for v in events if v.startswith(b'{"event_id":"5-')]
    assert len(valid) == summary["valid"] and all("is_fraud" not in e for e in valid)
    ids = {e["event_id"] for e in valid}
    assert {lab["event_id"] for lab in labels} <= ids and len({lab["event_id"] for lab in labels}) == len(labels)


def test_with_fraud_only_the_frauds_and_only_they_get_their_label(stub):  # noqa: F811
    """A bank's chargebacks: the same run's frauds are labelled, after the same delays, and no
    legitimate event is."""
    def labels(plan: LabelPlan, producer) -> dict[str, dict]:
        run_load("localhost:1", "tx", partitions=4, count=4000, seed=6, labels=plan)
        return {lab["event_id"]: lab for lab in map(json.loads, (v for _, v, _ in stub[producer].sent
                                                                 if b'"label"' in v))}

    delay = parse_label_delay("uniform:0:0.2")
    every, frauds = labels(LabelPlan(delay), 0), labels(LabelPlan(delay, fraud_only=True), 1)
    at = {i: (lab.pop("partition"), lab.pop("offset")) for i, lab in frauds.items()}
    assert frauds == {i: lab for i, lab in every.items() if lab["label"]} and len(frauds) > 20
    # each chargeback names where its event is: the n-th event sent to that partition
    events: dict[int, list[bytes]] = {}
    for _, value, partition in stub[1].sent:
        if b'"label"' not in value:
            events.setdefault(partition, []).append(value)
    assert all(json.loads(events[p][o])["event_id"] == i for i, (p, o) in at.items())


def test_on_a_simulated_clock_every_message_carries_its_simulated_time_and_labels_keep_simulated_delays(stub):  # noqa: F811
    """Weeks in seconds: events stamped with their own time, each label with its event's time
    plus its delay, sent in that order, and the wall clock taking far less than the delays."""
    plan = LabelPlan(parse_label_delay("lognormal:2d:1"), fraud_only=True, simulated=True)
    started = time.monotonic()
    summary = run_load("localhost:1", "tx", partitions=4, count=20_000, bad_fraction=0.01, seed=3, labels=plan)
    assert time.monotonic() - started < 60 and summary["labels"]["simulated_clock"]
    sent, stamps = stub[0].sent, stub[0].stamps
    valid = {json.loads(v)["event_id"]: json.loads(v)["event_time"] for _, v, _ in sent
             if v.startswith(b'{"event_id":"3-') and b'"label"' not in v}
    events = [(valid.get(json.loads(v)["event_id"]) if v.startswith(b'{"event_id":"3-') else None, t)
              for (_, v, _), t in zip(sent, stamps, strict=True) if b'"label"' not in v]
    assert all(t is not None for _, t in events) and all(e == t for e, t in events if e is not None)
    assert len(valid) == summary["valid"]
    labels = [(json.loads(v), t) for (_, v, _), t in zip(sent, stamps, strict=True) if b'"label"' in v]
    assert len(labels) > 100 and all(lab["label_time"] == t for lab, t in labels)
    assert [t for _, t in labels] == sorted(t for _, t in labels)  # sent in simulated due order
    span_days = (max(t for _, t in labels) - min(e for e, _ in events if e)) / 86_400_000
    assert span_days > 5  # weeks of simulated time (20,000 events are ~0.9 simulated days of events)


def test_delays_take_units():
    assert parse_label_delay("lognormal:5d:1") == LabelDelay("lognormal", 432_000.0, 1.0)
    assert parse_label_delay("uniform:15m:2h") == LabelDelay("uniform", 900.0, 7200.0)


def test_lognormal_delays_have_the_median_they_are_given():
    drawn = parse_label_delay("lognormal:432000:1.2").draw(np.random.default_rng(0), 100_000)
    assert abs(np.median(drawn) / 432_000 - 1.0) < 0.02 and np.quantile(drawn, 0.99) > 10 * 432_000


def test_no_chargeback_comes_after_the_card_schemes_120_days():
    # A 30-day median's tail reaches years: on the simulated clock such a report's timestamp
    # lay past what the broker accepts, and the whole load run failed with INVALID_TIMESTAMP.
    drawn = parse_label_delay("lognormal:30d:1").draw(np.random.default_rng(0), 100_000)
    assert drawn.max() == 120 * 86_400 and abs(np.median(drawn) / (30 * 86_400) - 1.0) < 0.02


def test_delays_follow_the_distribution():
    rng = np.random.default_rng(0)
    assert abs(LabelDelay("exp", 4.0).draw(rng, 200_000).mean() - 4.0) < 0.05
    drawn = LabelDelay("uniform", 1.0, 3.0).draw(rng, 10_000)
    assert drawn.min() >= 1.0 and drawn.max() <= 3.0


def test_the_generator_module_exposes_the_label_plan_to_callers():
    assert generator.LabelPlan is LabelPlan  # run_load(labels=LabelPlan(...)) from one import
