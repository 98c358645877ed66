"""Helpers the integration tests share: read a whole topic back, compute what training should see."""

from __future__ import annotations

import zlib
from collections import Counter

from confluent_kafka import Consumer, TopicPartition

from pipelines.banking import TRANSACTION
from streamlearn.config import KafkaSettings
from streamlearn.errors import BadEvent
from streamlearn.ingest.reader import Message, RangeReader
from streamlearn.ingest.stream import FINGERPRINT_MOD
from streamlearn.schema import reason_code


def read_topic(settings: KafkaSettings, topic: str) -> list[Message]:
    reader = RangeReader(settings, topic, "test-reader", fetch_timeout_s=30)
    try:
        marks = reader.watermarks(reader.partitions())
        return reader.read({p: (low, high) for p, (low, high) in marks.items() if high > low})
    finally:
        reader.close()


def expected_learning(messages: list[Message]) -> dict:
    """What exactly-once training of these messages must report: counts and the fingerprint."""
    valid, bad, fp = 0, Counter(), 0
    for m in messages:
        try:
            TRANSACTION.decode(m.value)
            valid += 1
            fp += zlib.crc32(m.value)
        except BadEvent as e:
            bad[reason_code(e.reason)] += 1
    return {"learned": valid, "dead_lettered": sum(bad.values()), "bad_by_reason": bad,
            "fingerprint": fp % FINGERPRINT_MOD}


def read_stamped(settings: KafkaSettings, topic: str) -> list[tuple[int, int, float, bytes]]:
    """Every message of `topic`: (partition, offset, Kafka timestamp in s, value)."""
    consumer = Consumer({**settings.confluent(), "group.id": "test-stamped", "enable.auto.commit": False})
    try:
        out = []
        for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            consumer.assign([TopicPartition(topic, p, low)])
            while low < high:
                msg = consumer.poll(5)
                assert msg is not None and not msg.error(), f"{topic} [{p}] ended early: {msg and msg.error()}"
                out.append((p, msg.offset(), msg.timestamp()[1] / 1000.0, msg.value()))
                low = msg.offset() + 1
        return out
    finally:
        consumer.close()


def dead_letter_keys(settings: KafkaSettings, topic: str) -> list[bytes]:
    consumer = Consumer({**settings.confluent(), "group.id": "test-dlq", "enable.auto.commit": False})
    try:
        keys = []
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                msg = consumer.poll(5)
                assert msg is not None, f"dead-letter topic {topic} ended early"
                keys.append(msg.key())
                if msg.offset() + 1 >= high:
                    break
        return keys
    finally:
        consumer.close()
