"""Delayed feedback (issue 45), exactly once across both topics through a worker SIGKILL and a
resumed run on another number of workers, in both ingest modes.

The generator sends events without `is_fraud` and, for each fraud, a chargeback 0.2-3 s later on
`<topic>.labels` naming its event's partition and offset; `fraud_chargebacks` learns every event
at once as legitimate and each reported event again as a fraud. Between the two runs, reports
that cannot be applied are sent by hand (a duplicate, an id that is not the event's, an offset
past the topic's end, a wrong partition, a malformed one) and one that says "legitimate". What
the lineage must hold is recomputed from both topics here, independently of the trainer: every
valid event learned once as legitimate, every applicable report once (its event's bytes in the
fingerprint a second time), every other report dead-lettered once with its reason and bytes.
A report applied twice (replayed past a lost checkpoint of the reported offsets, or moved to
another rank without them) shows in the count, the fingerprint and the dead letters.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
import zlib
from collections import Counter

import pytest
from confluent_kafka import Producer

from pipelines.banking import REPORT, UNLABELLED_TRANSACTION
from streamlearn.autoscale.policy import ScalingPolicy
from streamlearn.errors import BadEvent
from streamlearn.ingest.decode import FINGERPRINT_MOD
from streamlearn.kafka.admin import end_offsets, ensure_topics
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.labels import LabelPlan, encode_label, parse_label_delay
from streamlearn.loadgen.profiles import parse_profile
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.schema import reason_code
from streamlearn.train.trainer import run_dir, train

from .streams import dead_letters, read_stamped, read_topic
from .test_delayed_labels import LabelledLoad
from .test_faults import Training, checkpoint_after, finish_training, recovery
from .test_training import INGESTS, config, train_workers

pytestmark = pytest.mark.integration
CHARGEBACKS = LabelPlan(parse_label_delay("uniform:0.2:3.0"), fraud_only=True)
SIMULATED = LabelPlan(parse_label_delay("lognormal:2d:0.5"), fraud_only=True, simulated=True)


def expected(settings, topic: str) -> dict:
    """What the lineage must hold, from both topics: each report judged in its partition's order."""
    events, bad_events = {}, 0
    for m in read_topic(settings, topic):
        try:
            events[m.partition, m.offset] = (UNLABELLED_TRANSACTION.decode(m.value)["event_id"], zlib.crc32(m.value))
        except BadEvent:
            bad_events += 1
    applied, ignored, letters, reported = [], 0, {}, set()
    for m in read_topic(settings, f"{topic}.labels"):
        try:
            report = REPORT.decode(m.value)
        except BadEvent as e:
            letters[m.partition, m.offset] = reason_code(e.reason)
            continue
        at = (report["partition"], report["offset"])
        if not report["label"]:
            ignored += 1
        elif at[0] != m.partition:
            letters[m.partition, m.offset] = "wrong_partition"
        elif at in reported:
            letters[m.partition, m.offset] = "duplicate_report"
        elif events.get(at, (None,))[0] != report["event_id"]:
            letters[m.partition, m.offset] = "unknown_event"
        else:
            reported.add(at)
            applied.append(events[at][1])
    fingerprint = sum(crc for _, crc in events.values()) + sum(applied)
    return {"learned": len(events) + len(applied), "defaulted": len(events), "applied": len(applied),
            "ignored": ignored, "bad_events": bad_events, "letters": letters,
            "fingerprint": fingerprint % FINGERPRINT_MOD}


def assert_feedback_exactly_once(settings, cfg) -> dict:
    meta = ckpt.read_meta(ckpt.newest(run_dir(cfg)))
    want, counters, labels_topic = expected(settings, cfg.topic), meta["counters"], f"{cfg.topic}.labels"
    assert {int(p): o for p, o in meta["offsets"].items()} == end_offsets(settings, cfg.topic)
    assert {int(p): o for p, o in meta["labels"]["offsets"].items()} == end_offsets(settings, labels_topic)
    assert {k: counters[k] for k in ("learned", "defaulted", "ignored", "fingerprint")} == \
        {k: want[k] for k in ("learned", "defaulted", "ignored", "fingerprint")}
    assert (counters["dead_lettered"], counters["labels_dead_lettered"], counters["expired"]) == \
        (want["bad_events"] + len(want["letters"]), len(want["letters"]), 0)
    written = dead_letters(settings, cfg.dlq_topic)  # one per key: none written twice
    reports = {(m.partition, m.offset): m.value for m in read_topic(settings, labels_topic)}
    got = {(int(k.split(b":")[-2]), int(k.split(b":")[-1])): v for k, v in written.items()
           if k.startswith(labels_topic.encode() + b":")}
    assert got == {at: (code, reports[at]) for at, code in want["letters"].items()}
    assert len(written) == want["bad_events"] + len(want["letters"])
    assert meta["join"]["pending"] == {"events": 0, "labels": 0}  # nothing waits
    return meta | {"want": want}


def send_reports_that_cannot_be_applied(bootstrap: str, topic: str, settings) -> Counter:
    """A duplicate, another event's id, past the end, a wrong partition, a malformed report, and
    one that says "legitimate"; returns the reasons expected."""
    reports = read_topic(settings, f"{topic}.labels")
    events = {(m.partition, m.offset): m.value for m in read_topic(settings, topic)}
    first = next(m for m in reports if json.loads(m.value)["label"])
    r = json.loads(first.value)
    p, o = r["partition"], r["offset"]
    named = {(json.loads(m.value)["partition"], json.loads(m.value)["offset"]) for m in reports}
    other = next(at for at in events if at[0] == p and at not in named)  # an event nobody reported
    producer = Producer({"bootstrap.servers": bootstrap})
    sends = [
        (p, first.value),  # the same chargeback again
        (p, encode_label("nobody", True, 1, at=other)),
        (p, encode_label(r["event_id"], True, 1, at=(p, 10**9))),
        ((p + 1) % 4, encode_label(r["event_id"], True, 1, at=(p, o))),
        (p, b'{"event_id": "x", "label": true'),
        (p, encode_label(r["event_id"], False, 1, at=(p, o))),
    ]
    for partition, value in sends:
        producer.produce(f"{topic}.labels", value, partition=partition)
    assert producer.flush(30) == 0
    return Counter(["duplicate_report", "unknown_event", "unknown_event", "wrong_partition", "not_json"])


@INGESTS
@pytest.mark.timeout(900)
def test_chargebacks_are_applied_exactly_once_through_a_worker_kill_and_a_resume_on_one_worker(
        kafka, kafka_settings, ray_cluster, topic, tmp_path, ingest):
    ensure_topics(kafka_settings, {f"{topic}.labels": 4})
    cfg = config(tmp_path, topic, pipeline="fraud_chargebacks", ingest=ingest)
    load = LabelledLoad(kafka.bootstrap, topic, seed=600, rate=500, plan=CHARGEBACKS)
    training = Training(cfg, kafka_settings)
    load.start()
    training.start()
    try:
        checkpoint_after(run_dir(cfg), 0.0, 300, training)
        time.sleep(3)  # chargebacks for events learned before the kill come after it
        victim = train_workers(ray_cluster)[1]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        back = checkpoint_after(run_dir(cfg), killed_at, 300, training)
        recovery("delayed feedback: training worker SIGKILL -> first new checkpoint", back["written_at"] - killed_at)
        time.sleep(5)
    finally:
        load.finish()
    summary = finish_training(training)
    meta = assert_feedback_exactly_once(kafka_settings, cfg)
    assert summary["lineage_learned"] == meta["counters"]["learned"] and meta["want"]["applied"] > 50
    assert meta["metrics"]["ingest"]["mode"] == ingest
    last = json.loads((run_dir(cfg) / "history.jsonl").read_text().splitlines()[-1])
    assert last["join"]["reports"] == meta["want"]["applied"]  # shown with every checkpoint
    # The signals that judge on matured labels (issue 45) saw every report the group after the kill
    # learned, whichever rank learned it (each rank judges its own slice, a checkpoint gathers them),
    # and no fake negative: nothing here outlives the 120-day attribution window.
    history = [json.loads(row) for row in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    first_run = len(history)
    restored = ckpt.read_meta(ckpt.newest(run_dir(cfg)))["restored_from"]
    since_restore = last["join"]["reports"] - next(r for r in history if r["version"] == restored)["join"]["reports"]
    assert last["matured"]["positives"] == since_restore > 0
    assert all(r["matured"]["window"] == r["matured"]["positives"] and r["matured"]["age_s"] is None for r in history)
    evidence = [ckpt.load_evidence(path) for _, path in ckpt.list_checkpoints(run_dir(cfg))]
    assert any(e is not None for e in evidence)
    assert all(e["targets"].min() == 1.0 for e in evidence if e is not None)  # the gate's: reports only
    # ... those held back from learning, each naming its event: one of the events the run learned
    stamped = {(p, o) for p, o, _, _ in read_stamped(kafka_settings, topic)}
    named = [(int(p), int(o)) for e in evidence if e is not None for p, o in zip(e["partition"], e["offset"],
                                                                                   strict=True)]
    assert named and set(named) <= stamped
    assert {p for p, _ in named} == {0, 1, 2, 3}  # every rank's held reports (rank 0 reads 0 and 2)

    # Resume on one worker: every partition's reported offsets move to rank 0, so a chargeback
    # sent again is refused there; the bad reports are dead-lettered with their reasons. The new
    # events come on the simulated clock, chargebacks days late in its time, seconds in the wall's.
    reasons = send_reports_that_cannot_be_applied(kafka.bootstrap, topic, kafka_settings)
    before = end_offsets(kafka_settings, f"{topic}.labels")
    run_load(kafka.bootstrap, topic, partitions=4, count=3_000, bad_fraction=0.02, seed=900, labels=SIMULATED)
    late = [(t, json.loads(v)) for p, o, t, v in read_stamped(kafka_settings, f"{topic}.labels") if o >= before[p]]
    assert late and all(abs(t * 1000 - r["label_time"]) < 1 for t, r in late)  # Kafka's time is the simulated one
    stamped = {(p, o): t for p, o, t, _ in read_stamped(kafka_settings, topic)}
    delays_days = [(t - stamped[r["partition"], r["offset"]]) / 86_400 for t, r in late]
    assert 1.5 < statistics.median(delays_days) < 2.7, statistics.median(delays_days)  # lognormal, median 2 days
    # With Ray Data the resume reads with 3 lanes where the first run had 2: each lane restores the
    # reported offsets of the partitions it now reads (p % 3), so a chargeback sent again is still
    # refused on whichever lane its partition moved to.
    train(config(tmp_path, topic, pipeline="fraud_chargebacks", workers=1, until_idle_s=1.0, ingest=ingest,
                 read_lanes=3), kafka_settings)
    again = assert_feedback_exactly_once(kafka_settings, cfg)
    assert again["metrics"]["ingest"].get("lanes") == (3 if ingest == "ray-data" else None)
    # On one worker rank 0 learns every slice: the reports released as their holds end are judged there.
    resumed = (run_dir(cfg) / "history.jsonl").read_text().splitlines()[first_run:]
    assert max(json.loads(row)["matured"]["positives"] for row in resumed) > 0
    new_letters = Counter(code for at, code in again["want"]["letters"].items() if at not in meta["want"]["letters"])
    assert new_letters == reasons and again["counters"]["ignored"] == meta["counters"]["ignored"] + 1
    assert again["counters"]["learned"] > meta["counters"]["learned"] + 2_000


@pytest.mark.timeout(900)
def test_a_warm_resize_hands_the_reports_held_back_to_the_next_group(kafka, kafka_settings, ray_cluster, topic,
                                                                    tmp_path):
    """A burst asks for a second worker while reports are held back from learning (the gate's
    evidence): the old group's stop window leaves them held in its checkpoint, the new group
    restores them and its first checkpoint's evidence still has them; every report applied once."""
    ensure_topics(kafka_settings, {f"{topic}.labels": 4})
    cfg = config(tmp_path, topic, pipeline="tests.integration.models:SlowChargebacks", workers=1, until_idle_s=6.0,
                 checkpoint_every_s=2.0, checkpoint_every_steps=200, window_events=4096, batch_size=256,
                 keep_checkpoints=1000)
    # ~10k events/s a worker (models.SlowChargebacks): 80k events are ~8 s of one worker's learning
    # against a drain target of 4, so the policy asks for 2; a trickle goes on until 10 s after the
    # resize, so the new group checkpoints before its idle stop (which learns every held report):
    # 1,250 events a partition, where a report is held for 4,096 or 60 s.
    policy = ScalingPolicy(min_workers=1, max_workers=2, up_cooldown_s=3, down_cooldown_s=3600, target_drain_s=4,
                           capacity_floor=2000, normal_lag_s=cfg.checkpoint_every_s, warm_wait_s=240,
                           curve_memory_s=0)
    resizes = run_dir(cfg) / "resizes.jsonl"
    stop = threading.Event()

    def produce():
        run_load(kafka.bootstrap, topic, partitions=4, count=80_000, seed=71, labels=CHARGEBACKS)
        chunk, give_up = 72, time.monotonic() + 540
        while not stop.is_set() and time.monotonic() < give_up:
            if resizes.exists():
                give_up = min(give_up, time.monotonic() + 10)
            run_load(kafka.bootstrap, topic, partitions=4, profile=parse_profile("constant:500"), duration=3,
                     seed=chunk, labels=CHARGEBACKS)
            chunk += 1

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        summary = train(cfg, kafka_settings, scaling=policy)
    finally:
        stop.set()
        producer.join(timeout=60)

    done = [json.loads(row) for row in resizes.read_text().splitlines()]
    assert [(r["from"], r["to"]) for r in done][:1] == [(1, 2)], done
    history = [json.loads(row) for row in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    first_of_two = next(i for i, row in enumerate(history) if row["workers"] == 2)
    handed, taken = (ckpt_of(cfg, history[i]["version"]) for i in (first_of_two - 1, first_of_two))
    # The old group's last checkpoint kept its reports held (a run's end would have learned them) ...
    arrays = ckpt.load_arrays(handed)
    waiting = {(int(name[1:].split("/")[0]), int(o)) for name, a in arrays.items() if name.endswith("/waiting.place")
               for o in a[:, 1]}
    assert waiting, "the stop window of the resize learned every held report"
    # ... and the new group judged its first candidate on them (those not due yet).
    evidence = ckpt.load_evidence(taken)
    named = set(zip(evidence["partition"].tolist(), evidence["offset"].tolist(), strict=True))
    assert named & waiting, (len(waiting), len(named))
    meta = assert_feedback_exactly_once(kafka_settings, cfg)
    assert summary["lineage_learned"] == meta["counters"]["learned"] and meta["want"]["applied"] > 100


def ckpt_of(cfg, version: int):
    return dict(ckpt.list_checkpoints(run_dir(cfg)))[version]
