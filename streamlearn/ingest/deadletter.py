"""Dead letters: every event that fails to decode or validate, once, with its reason.

The dead-letter record keeps the original bytes as its value (so it can be fixed and
replayed), the reason and source coordinates as headers, and "<topic>:<partition>:<offset>"
as its key. A window replayed after a crash would dead-letter its bad events again, so on
start each reader collects the keys already written past the checkpoint and skips them.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from streamlearn.config import KafkaSettings
from streamlearn.errors import KafkaUnavailable
from streamlearn.ingest.reader import Message
from streamlearn.schema import Schema, reason_code


@dataclass
class Decoded:
    events: list[dict]
    messages: list[Message]  # the message each good event came from
    bad: list[tuple[Message, str]]


def decode(messages: list[Message], schema: Schema) -> Decoded:
    events, kept, bad = schema.decode_many([m.value for m in messages])
    return Decoded(events, [messages[i] for i in kept], [(messages[i], reason) for i, reason in bad])


def dead_letter_key(topic: str, partition: int, offset: int) -> bytes:
    return f"{topic}:{partition}:{offset}".encode()


class DeadLetters:
    def __init__(self, settings: KafkaSettings, topic: str, source_topic: str):
        self.topic, self.source_topic = topic, source_topic
        self._settings = settings
        self._producer = Producer({**settings.confluent(), "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 5, "log_level": 3})
        self._already: set[bytes] = set()
        self._failed: list[str] = []
        self.by_reason: Counter[str] = Counter()
        self.written: dict[int, int] = {}  # partition -> offset after the last dead letter this producer delivered
        self.end_at_start: dict[int, int] = {}  # partition -> the topic's end when the scan below read it

    def skip_written_since(self, positions: dict[int, int], timeout_s: float = 30.0) -> int:
        """Remember the keys written to the dead-letter topic after `positions` (from the checkpoint),
        and where the topic ended: every dead letter written from now on lies past that."""
        consumer = Consumer({**self._settings.confluent(), "group.id": "streamlearn-dlq-scan",
                             "enable.auto.commit": False, "log_level": 3})
        try:
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            todo = {}
            for p in meta.partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
                self.end_at_start[p] = high
                start = positions.get(p, 0)
                if high > start:
                    todo[p] = high
                    consumer.assign([TopicPartition(self.topic, q, positions.get(q, 0)) for q in [*todo]])
            deadline = time.monotonic() + timeout_s
            while todo and time.monotonic() < deadline:
                for msg in consumer.consume(1000, timeout=0.5):
                    if msg.error() is None:
                        self._already.add(msg.key())
                        if msg.offset() + 1 >= todo.get(msg.partition(), 0):
                            todo.pop(msg.partition(), None)
            if todo:
                raise KafkaUnavailable(f"could not read dead-letter topic {self.topic} to its end in {timeout_s}s")
        finally:
            consumer.close()
        return len(self._already)

    def send(self, message: Message, reason: str, source_topic: str | None = None) -> None:
        """`source_topic`: where the message came from, if not the stream's topic (a label)."""
        source_topic = source_topic or self.source_topic
        key = dead_letter_key(source_topic, message.partition, message.offset)
        self.by_reason[reason_code(reason)] += 1
        if key in self._already:
            return  # written before the crash that made us replay this window
        headers = [("reason", reason.encode()), ("source_topic", source_topic.encode()),
                   ("source_partition", str(message.partition).encode()),
                   ("source_offset", str(message.offset).encode())]
        while True:
            try:
                self._producer.produce(self.topic, message.value, key, headers=headers, on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
        self._producer.poll(0)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self._failed.append(err.str())
        else:
            self.written[msg.partition()] = max(self.written.get(msg.partition(), 0), msg.offset() + 1)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Before a checkpoint: every dead letter of the learned windows must be durable."""
        left = self._producer.flush(timeout_s)
        if left or self._failed:
            raise KafkaUnavailable(f"dead-letter topic {self.topic}: {left} undelivered, errors {self._failed[:3]}")

    def close(self) -> None:
        self.flush()
