"""Garbage on the topic: over 10,000 malformed messages of every kind mixed into a valid stream,
some of them arriving while training runs. Training must keep going, learn every valid event
exactly once and dead-letter every malformed one exactly once, with the reason the schema gives."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from pipelines.banking import TRANSACTION
from streamlearn.config import KafkaSettings
from streamlearn.errors import BadEvent
from streamlearn.loadgen.generator import MALFORMED_KINDS, BankingSimulator, partition_for, run_load
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.schema import reason_code
from streamlearn.train.trainer import run_dir, train

from .streams import expected_learning, read_topic
from .test_training import INGESTS_DIRECT_EXTENDED, assert_exactly_once, config

pytestmark = pytest.mark.integration

BAD_FRACTION = 0.45


def produce_edge_cases(settings: KafkaSettings, topic: str) -> dict[str, int]:
    """What the generator does not make: tombstones (no value at all), messages near Kafka's size
    limit, and valid events carrying fields the schema does not know (forward-compatible producers)."""
    producer = Producer({**settings.confluent(), "acks": "all", "linger.ms": 5})
    sent = Counter()
    events = BankingSimulator(seed=99).events(600)
    for i, event in enumerate(events):
        key = event["customer_id"].encode()
        p = partition_for(key, 4)
        if i % 2 == 0:  # unknown fields of every JSON type, the schema ignores them
            extra = {**event, "loyalty_tier": "gold", "device": {"os": "android", "ids": [1, 2.5, None]},
                     "note": "caf\u00e9 \u2603 \U0001f4b3", "risk_hint": None}
            producer.produce(topic, json.dumps(extra, ensure_ascii=False).encode(), key, partition=p)
            sent["valid_with_unknown_fields"] += 1
        elif i % 20 == 1:
            producer.produce(topic, b"{" + b" " * 900_000 + b"}", key, partition=p)  # just under 1 MB
            sent["oversized"] += 1
        else:
            producer.produce(topic, None, key, partition=p)  # a tombstone: no value
            sent["empty"] += 1
        producer.poll(0)
    assert producer.flush(30) == 0
    return dict(sent)


def read_dead_letters(settings: KafkaSettings, topic: str) -> list[tuple[bytes, bytes | None, dict[str, str]]]:
    consumer = Consumer({**settings.confluent(), "group.id": "test-dlq-reasons", "enable.auto.commit": False})
    out = []
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, low)])
        while len(out) < high - low:
            msg = consumer.poll(5)
            assert msg is not None and msg.error() is None, f"dead-letter topic ended early at {len(out)}"
            headers = {k: v.decode() for k, v in msg.headers() or []}
            out.append((msg.key(), msg.value(), headers))
    finally:
        consumer.close()
    return out


@INGESTS_DIRECT_EXTENDED
def test_training_learns_every_valid_event_once_through_10k_malformed(kafka, kafka_settings, ray_cluster, topic,
                                                                       tmp_path, ingest):
    cfg = config(tmp_path, topic, until_idle_s=6.0, window_events=4000, checkpoint_every_steps=40, ingest=ingest)
    produced: dict = {}

    def produce():
        produced["first"] = run_load(kafka.bootstrap, topic, partitions=4, count=12_000, bad_fraction=BAD_FRACTION,
                                     seed=21)
        produced["edge"] = produce_edge_cases(kafka_settings, topic)
        deadline = time.monotonic() + 180
        while not ckpt.list_checkpoints(run_dir(cfg)) and time.monotonic() < deadline:
            time.sleep(0.1)  # the rest arrives while training is under way
        produced["second"] = run_load(kafka.bootstrap, topic, partitions=4, count=12_000, seed=22,
                                      bad_fraction=BAD_FRACTION, profile=None)

    producer = threading.Thread(target=produce)
    producer.start()
    summary = train(cfg, kafka_settings)
    producer.join()

    generated_bad = produced["first"]["bad"] + produced["second"]["bad"]
    assert generated_bad >= 10_000
    messages = read_topic(kafka_settings, topic)
    expected = expected_learning(messages)
    edge = produced["edge"]
    assert expected["dead_lettered"] == generated_bad + edge["oversized"] + edge["empty"]
    assert expected["learned"] == 24_000 - generated_bad + edge["valid_with_unknown_fields"]
    # Learned every valid event once (fingerprint), dead-lettered every bad one once, to the end of the topic.
    meta = assert_exactly_once(kafka_settings, cfg)
    assert summary["events_learned"] == expected["learned"] and summary["dead_lettered"] == expected["dead_lettered"]
    assert meta["version"] >= 2, "training should have checkpointed before and after the second burst"

    # Each dead letter: the original bytes, its source, and the reason the schema gives those bytes.
    by_position = {(m.partition, m.offset): m.value for m in messages}
    letters = read_dead_letters(kafka_settings, cfg.dlq_topic)
    reasons = Counter()
    for key, value, headers in letters:
        source = (int(headers["source_partition"]), int(headers["source_offset"]))
        assert key == f"{topic}:{source[0]}:{source[1]}".encode()
        assert (value or b"") == (by_position[source] or b""), f"dead letter {key!r} is not the original message"
        try:
            TRANSACTION.decode(value)
            raise AssertionError(f"dead letter {key!r} is a valid event")
        except BadEvent as e:
            assert headers["reason"] == e.reason
        reasons[reason_code(headers["reason"])] += 1
    assert reasons == expected["bad_by_reason"]
    assert set(MALFORMED_KINDS) <= set(reasons), f"kinds never dead-lettered: {set(MALFORMED_KINDS) - set(reasons)}"
    generated = Counter(produced["first"]["bad_by_reason"]) + Counter(produced["second"]["bad_by_reason"])
    assert reasons == generated + Counter({"oversized": edge["oversized"], "empty": edge["empty"]})
