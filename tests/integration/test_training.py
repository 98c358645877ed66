"""Continuous training on real Kafka and a real Ray cluster: learns, exactly once, through kills."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from load.generator import run_load
from load.profiles import parse_profile
from streamlearn.config import TrainConfig
from streamlearn.kafka.admin import committed_offsets, end_offsets
from streamlearn.train import checkpoint as ckpt
from streamlearn.train.trainer import run_dir, train

from .streams import dead_letter_keys, expected_learning, read_topic


def config(tmp_path, topic, **overrides) -> TrainConfig:
    base = dict(topic=topic, workers=2, cpus_per_worker=0.5, checkpoint_dir=str(tmp_path / "ckpt"),
                run_name=f"fraud-{topic}", checkpoint_every_s=2.0, checkpoint_every_steps=20, window_events=2000,
                until_idle_s=8.0, batch_size=128)
    return TrainConfig(**{**base, **overrides})


def train_workers(ray_cluster) -> list[int]:
    from ray.util.state import list_actors

    alive = list_actors(address=f"http://{ray_cluster.dashboard_url}",
                        filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return [a.pid for a in alive]


def assert_exactly_once(settings, cfg: TrainConfig) -> dict:
    """The lineage invariant, checked against what is really in Kafka."""
    meta = ckpt.read_meta(ckpt.newest(run_dir(cfg)))
    messages = read_topic(settings, cfg.topic)
    expected = expected_learning(messages)
    counters = meta["counters"]
    assert {int(p): o for p, o in meta["offsets"].items()} == end_offsets(settings, cfg.topic)
    assert counters["learned"] == expected["learned"]
    assert counters["dead_lettered"] == expected["dead_lettered"]
    consumed = sum(meta["offsets"][p] - meta["start_offsets"][p] for p in meta["offsets"])
    assert counters["learned"] == consumed - counters["dead_lettered"]
    # The fingerprint (sum of crc32 of learned events) catches an event learned twice and another missed.
    assert counters["fingerprint"] == expected["fingerprint"]
    keys = dead_letter_keys(settings, cfg.dlq_topic)
    assert len(keys) == len(set(keys)) == expected["dead_lettered"]
    # Consumer-group offsets follow the checkpoint (committed only after it is durable).
    assert committed_offsets(settings, cfg.group_id, cfg.topic) == {int(p): o for p, o in meta["offsets"].items()}
    return meta


def test_exactly_once_through_worker_kill_stream_pause_and_resume(kafka, kafka_settings, ray_cluster, topic,
                                                                  tmp_path):
    cfg = config(tmp_path, topic)
    result: dict = {}

    def produce():
        # Two bursts with a pause longer than the checkpoint interval: training must idle, not hang.
        run_load(kafka.bootstrap, topic, partitions=4, profile=parse_profile("constant:2500"), count=15_000,
                 bad_fraction=0.02, seed=1)
        time.sleep(5)
        run_load(kafka.bootstrap, topic, partitions=4, profile=parse_profile("constant:2500"), count=10_000,
                 bad_fraction=0.02, seed=2)

    producer = threading.Thread(target=produce)
    producer.start()
    trainer = threading.Thread(target=lambda: result.update(summary=train(cfg, kafka_settings)))
    trainer.start()

    killed = []
    deadline = time.monotonic() + 240
    while len(killed) < 1 and time.monotonic() < deadline:  # kill a worker once it has checkpointed
        if ckpt.list_checkpoints(run_dir(cfg)) and (pids := train_workers(ray_cluster)):
            os.kill(pids[-1], signal.SIGKILL)
            killed.append(pids[-1])
        time.sleep(0.5)
    assert killed, "training never checkpointed"
    producer.join()
    trainer.join(timeout=400)
    assert not trainer.is_alive(), "training did not finish after the stream went idle"

    meta = assert_exactly_once(kafka_settings, cfg)
    assert result["summary"]["events_learned"] == meta["counters"]["learned"] == 24_500
    assert result["summary"]["dead_lettered"] == 500
    history = [json.loads(line) for line in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    assert len(history) >= 3 and [h["version"] for h in history] == sorted({h["version"] for h in history})

    # Resume: produce more, train again: only the new events are learned, the lineage goes on.
    run_load(kafka.bootstrap, topic, partitions=4, count=5_000, bad_fraction=0.02, seed=3)
    again = train(config(tmp_path, topic, until_idle_s=3.0), kafka_settings)
    assert again["events_learned"] == 4_900 and again["dead_lettered"] == 100
    assert again["lineage_learned"] == 29_400
    assert_exactly_once(kafka_settings, cfg)


def test_fraud_model_learns_and_recovers_from_drift(kafka, kafka_settings, ray_cluster, topic, tmp_path):
    run_load(kafka.bootstrap, topic, partitions=4, count=120_000, drift_at=60_000, seed=5)
    cfg = config(tmp_path, topic, until_idle_s=3.0, checkpoint_every_s=60.0, checkpoint_every_steps=40,
                 window_events=4000, metric_window=6000)
    summary = train(cfg, kafka_settings)
    assert summary["events_learned"] == 120_000
    history = [json.loads(line) for line in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    before = [h["auc"] for h in history if h["learned"] <= 60_000 and h["learned"] >= 30_000]
    after = [h["auc"] for h in history if h["learned"] > 60_000]
    # A broken model (constant or random scores) sits at 0.5; this one must be clearly better.
    assert max(before) > 0.8, history
    assert min(after[:3]) < max(before) - 0.05, "drift did not show in the online metric"
    assert after[-1] > 0.8, "the model did not recover after the drift"
