"""Delayed labels (issue 16), trained exactly once across both topics through a worker SIGKILL
and a resumed run on another number of workers, in both ingest modes: joined by the rank that
reads a partition (direct) or by the Ray Data lane that reads it (ray-data).

The generator sends events without `is_fraud` and each label 0.2-2 s later on `<topic>.labels`
(10 % never); `fraud_delayed` learns an event once its label has come. The TTL (an hour) is far
longer than the test, so nothing expires: every labelled valid event must be learned exactly
once (count and fingerprint), every unlabelled one must still wait in the join state of the
last checkpoint, and the labels topic must be read to its end with nothing dead-lettered. A
join state lost in the kill (or not moved to its partitions' new rank on the resumed run)
shows as labels waiting for events the trainer forgot, and as events never learned. What
expires, when, and that it does not depend on windows or restores: tests/unit/test_labelled.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import zlib

import pytest

from pipelines.banking import UNLABELLED_TRANSACTION
from streamlearn import faults
from streamlearn.errors import BadEvent, StreamlearnError
from streamlearn.ingest.decode import FINGERPRINT_MOD
from streamlearn.kafka.admin import end_offsets, ensure_topics
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.labels import LabelPlan, parse_label_delay
from streamlearn.loadgen.profiles import parse_profile
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.train.trainer import run_dir, train

from .models import ShortChargebacks
from .streams import dead_letter_keys, read_stamped, read_topic
from .test_faults import Training, checkpoint_after, finish_training, recovery
from .test_training import INGESTS, config, train_workers

pytestmark = pytest.mark.integration
PLAN = LabelPlan(parse_label_delay("uniform:0.2:2.0"), unlabelled_fraction=0.1)
CHARGEBACKS = LabelPlan(parse_label_delay("uniform:0.1:0.5"), fraud_only=True)  # well within the 2-s window


class LabelledLoad(threading.Thread):
    """Events at a steady rate with their labels (`plan`) following, one-second chunks, 2 % malformed."""

    def __init__(self, bootstrap: str, topic: str, seed: int, rate: int = 400, plan: LabelPlan = PLAN):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.seed, self.rate, self.plan = bootstrap, topic, seed, rate, plan
        self.stop, self.error = threading.Event(), None

    def run(self):
        seed = self.seed
        try:
            while not self.stop.is_set():
                run_load(self.bootstrap, self.topic, partitions=4, profile=parse_profile(f"constant:{self.rate}"),
                         duration=1.0, bad_fraction=0.02, seed=seed, labels=self.plan)
                seed += 1
        except StreamlearnError as e:
            self.error = e

    def finish(self):
        self.stop.set()
        self.join(60)
        assert self.error is None, self.error


def assert_joined_exactly_once(settings, cfg) -> dict:
    """Checked against what is in both topics: learned == labelled valid events (and their
    fingerprint), unlabelled ones waiting, malformed ones dead-lettered once, both topics read."""
    meta = ckpt.read_meta(ckpt.newest(run_dir(cfg)))
    counters, labels_topic = meta["counters"], f"{cfg.topic}.labels"
    labelled = {json.loads(m.value)["event_id"] for m in read_topic(settings, labels_topic)}
    valid, bad, joined_fp, joined = 0, 0, 0, 0
    for m in read_topic(settings, cfg.topic):
        try:
            event = UNLABELLED_TRANSACTION.decode(m.value)
        except BadEvent:
            bad += 1
            continue
        valid += 1
        if event["event_id"] in labelled:
            joined += 1
            joined_fp += zlib.crc32(m.value)
    assert {int(p): o for p, o in meta["offsets"].items()} == end_offsets(settings, cfg.topic)
    assert {int(p): o for p, o in meta["labels"]["offsets"].items()} == end_offsets(settings, labels_topic)
    assert (counters["learned"], counters["fingerprint"]) == (joined, joined_fp % FINGERPRINT_MOD)
    assert (counters["dead_lettered"], counters["labels_dead_lettered"], counters["expired"]) == (bad, 0, 0)
    assert meta["join"]["pending"] == {"events": valid - joined, "labels": 0}
    # What waits and what expired is shown with every checkpoint (history, status, metrics), never silent.
    last = json.loads((run_dir(cfg) / "history.jsonl").read_text().splitlines()[-1])
    assert last["version"] == meta["version"] and last["join"] == {"events": valid - joined, "labels": 0, "expired": 0}
    assert 0.05 * valid < valid - joined < 0.15 * valid  # the unlabelled tenth waits
    keys = dead_letter_keys(settings, cfg.dlq_topic)
    assert len(keys) == len(set(keys)) == bad
    return meta


# `make test-all` only, both forms: in `make test` the join state goes through a worker kill and a
# resume in both modes with delayed feedback's join (test_delayed_feedback), and this join's state
# through aimed kills at its checkpoint (below).
@pytest.mark.extended
@INGESTS
@pytest.mark.timeout(900)
def test_delayed_labels_are_learned_once_through_a_worker_kill_and_a_resume_on_one_worker(
        kafka, kafka_settings, ray_cluster, topic, tmp_path, ingest):
    ensure_topics(kafka_settings, {f"{topic}.labels": 4})
    cfg = config(tmp_path, topic, pipeline="fraud_delayed", ingest=ingest)
    load, training = LabelledLoad(kafka.bootstrap, topic, seed=500), Training(cfg, kafka_settings)
    load.start()
    training.start()
    try:
        checkpoint_after(run_dir(cfg), 0.0, 300, training)
        time.sleep(3)  # events wait for labels in the join state that the checkpoint holds
        victim = train_workers(ray_cluster)[1]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        back = checkpoint_after(run_dir(cfg), killed_at, 300, training)
        recovery("delayed labels: training worker SIGKILL -> first new checkpoint", back["written_at"] - killed_at)
        time.sleep(5)
    finally:
        load.finish()
    summary = finish_training(training)
    meta = assert_joined_exactly_once(kafka_settings, cfg)
    assert summary["lineage_learned"] == meta["counters"]["learned"] > 2_000
    assert meta["join"]["pending"]["events"] > 0
    assert meta["metrics"]["ingest"]["mode"] == ingest

    # Resume on one worker: the join state of all four partitions moves to rank 0, and labels
    # of events learned before (none: no duplicates) or waiting since the last run find them.
    run_load(kafka.bootstrap, topic, partitions=4, count=3_000, bad_fraction=0.02, seed=900, labels=PLAN)
    train(config(tmp_path, topic, pipeline="fraud_delayed", workers=1, until_idle_s=1.0, ingest=ingest),
          kafka_settings)
    again = assert_joined_exactly_once(kafka_settings, cfg)
    assert again["counters"]["learned"] > meta["counters"]["learned"] + 2_000


@pytest.mark.timeout(600)
def test_delayed_labels_are_learned_once_through_aimed_kills_at_checkpoints(
        kafka, kafka_settings, ray_cluster, topic, tmp_path, monkeypatch):
    """A checkpoint writes only the join rows new since the one before and links the rest from it
    (ingest/join_files.py): killed while it writes them, then (the restarted group) after one is
    published but before its offsets are committed, each group restarts from files that earlier
    checkpoints wrote. One kill a group, in turn (test_aimed_faults.py's RUNS say how)."""
    ensure_topics(kafka_settings, {f"{topic}.labels": 4})
    run_load(kafka.bootstrap, topic, partitions=4, count=16_000, bad_fraction=0.02, seed=77, labels=PLAN)
    spec = "mid_checkpoint_write@rank0#4,after_publish_before_commit@rank0#5"
    # A checkpoint every window: the two kills leave 8 of the 16 durable before the last group.
    cfg = config(tmp_path, topic, pipeline="fraud_delayed", window_events=1000, checkpoint_every_steps=3,
                 checkpoint_every_s=3600.0, until_idle_s=1.0, max_failures=3)
    monkeypatch.setenv("STREAMLEARN_FAULT", spec)
    train(cfg, kafka_settings)
    for fault in spec.split(","):
        assert faults.mark_of(run_dir(cfg), fault).exists(), f"the fault {fault} never fired"
    meta = assert_joined_exactly_once(kafka_settings, cfg)
    assert meta["join"]["pending"]["events"] > 0  # the never-labelled tenth waits
    newest = ckpt.newest(run_dir(cfg))
    assert any(p.stat().st_nlink > 1 for p in newest.glob("join-*.npz")), "no join rows carried by a link"


@pytest.mark.timeout(600)
def test_with_chargebacks_only_every_event_is_learned_once_the_silent_ones_as_legitimate(
        kafka, kafka_settings, ray_cluster, topic, tmp_path, monkeypatch, ingest="direct"):
    """A bank hears only of fraud: frauds get a label, nothing else does, and the window method
    learns an event with no chargeback within its window (2 s) as legitimate (`unlabelled_as`;
    the direct path only: Ray Data's lanes run the same `LabelJoin.batch`, tested above with
    fraud_delayed; delayed feedback, what fraud_chargebacks uses: test_delayed_feedback.py). Killed
    between a checkpoint's publish and its offsets' commit, the replay must decide as the lost run
    did. Checked against both topics, recomputing the join's decisions from the messages' own
    timestamps: each partition's clock is the older of its two topics' newest times, and an
    event without a label leaves (learned as legitimate) once it is more than the window behind."""
    ensure_topics(kafka_settings, {f"{topic}.labels": 4})
    run_load(kafka.bootstrap, topic, partitions=4, profile=parse_profile("constant:1000"), count=16_000,
             bad_fraction=0.02, seed=79, labels=CHARGEBACKS)
    fault = "after_publish_before_commit@rank0#4"
    cfg = config(tmp_path, topic, pipeline="tests.integration.models:ShortChargebacks", window_events=1000,
                 checkpoint_every_steps=8, checkpoint_every_s=3600.0, until_idle_s=1.0, max_failures=2, ingest=ingest)
    monkeypatch.setenv("STREAMLEARN_FAULT", fault)
    train(cfg, kafka_settings)
    assert faults.mark_of(run_dir(cfg), fault).exists(), f"the fault {fault} never fired"

    labels = {json.loads(v)["event_id"]: (p, t) for p, _, t, v in read_stamped(kafka_settings, f"{topic}.labels")}
    events, bad = [], 0
    for p, _, t, value in read_stamped(kafka_settings, topic):
        try:
            events.append((p, t, UNLABELLED_TRANSACTION.decode(value)["event_id"], zlib.crc32(value)))
        except BadEvent:
            bad += 1
    clock = {p: min(max(t for q, t, *_ in events if q == p), max(t for q, t in labels.values() if q == p))
             for p in range(4)}
    ttl = ShortChargebacks.labels.ttl_s
    silent = [(i, crc) for p, t, i, crc in events if i not in labels and t < clock[p] - ttl]
    frauds = [(i, crc) for _, _, i, crc in events if i in labels]
    assert len(frauds) == len(labels) > 100 and len(silent) > 0.8 * len(events)

    meta = ckpt.read_meta(ckpt.newest(run_dir(cfg)))
    counters = meta["counters"]
    assert (counters["learned"], counters["defaulted"]) == (len(frauds) + len(silent), len(silent))
    assert counters["fingerprint"] == sum(crc for _, crc in frauds + silent) % FINGERPRINT_MOD
    assert (counters["dead_lettered"], counters["labels_dead_lettered"], counters["expired"]) == (bad, 0, 0)
    assert meta["join"]["pending"] == {"events": len(events) - len(frauds) - len(silent), "labels": 0}
    last = json.loads((run_dir(cfg) / "history.jsonl").read_text().splitlines()[-1])
    assert last["join"]["unlabelled"] == len(silent)
    # learned with silence as "legitimate", the model ranks frauds above the rest
    assert meta["metrics"]["online"]["auc"] > 0.75, meta["metrics"]["online"]
