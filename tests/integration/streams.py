"""Helpers the integration tests share: read a whole topic back, compute what training should see."""

from __future__ import annotations

import zlib
from collections import Counter

from load.bench.common import read_whole_topic
from pipelines.banking import TRANSACTION
from streamlearn.config import KafkaSettings
from streamlearn.errors import BadEvent
from streamlearn.ingest.decode import FINGERPRINT_MOD
from streamlearn.ingest.reader import Message, RangeReader
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
    valid, bad, fp, letters = 0, Counter(), 0, {}
    for m in messages:
        try:
            TRANSACTION.decode(m.value)
            valid += 1
            fp += zlib.crc32(m.value)
        except BadEvent as e:
            bad[reason_code(e.reason)] += 1
            letters[(m.partition, m.offset)] = (reason_code(e.reason), m.value)
    return {"learned": valid, "dead_lettered": sum(bad.values()), "bad_by_reason": bad,
            "fingerprint": fp % FINGERPRINT_MOD, "letters": letters}


def read_stamped(settings: KafkaSettings, topic: str) -> list[tuple[int, int, float, bytes]]:
    """Every message of `topic`: (partition, offset, Kafka timestamp in s, value)."""
    return [(m.partition(), m.offset(), m.timestamp()[1] / 1000.0, m.value())
            for m in read_whole_topic(settings, topic)]


def dead_letter_keys(settings: KafkaSettings, topic: str) -> list[bytes]:
    return [m.key() for m in read_whole_topic(settings, topic)]


def dead_letters(settings: KafkaSettings, topic: str) -> dict[bytes, tuple[str, bytes]]:
    """Each dead letter's key ("<topic>:<partition>:<offset>") -> (its reason's code, the bytes it carries)."""
    return {m.key(): (reason_code(dict(m.headers() or [])["reason"].decode()), m.value())
            for m in read_whole_topic(settings, topic)}
