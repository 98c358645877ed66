"""Read exact offset ranges from Kafka with confluent-kafka (the data plane).

A window's slice is a set of [start, end) ranges; the reader assigns exactly those
partitions at exactly those offsets and pauses each partition as soon as its range is
complete, so no event outside the window is ever returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from streamlearn.config import KafkaSettings
from streamlearn.errors import KafkaUnavailable


@dataclass(frozen=True)
class Message:
    partition: int
    offset: int
    value: bytes | None


class RangeReader:
    def __init__(self, settings: KafkaSettings, topic: str, group_id: str, *, fetch_timeout_s: float = 300.0):
        self.topic = topic
        self.fetch_timeout_s = fetch_timeout_s
        self._consumer = Consumer({
            **settings.confluent(),
            "group.id": group_id,
            "enable.auto.commit": False,  # offsets are committed only after a checkpoint is durable
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 20,  # a slow stream's events must not wait for a full fetch
            "queued.max.messages.kbytes": 32768,
            "log_level": 3,
        })

    def partitions(self, timeout: float = 10.0) -> list[int]:
        try:
            meta = self._consumer.list_topics(self.topic, timeout=timeout).topics[self.topic]
        except KafkaException as e:
            raise KafkaUnavailable(f"cannot read metadata of topic {self.topic!r}: {e}") from None
        if meta.error is not None:
            raise KafkaUnavailable(f"topic {self.topic!r}: {meta.error.str()}; create it first (streamlearn topics)")
        return sorted(meta.partitions)

    def watermarks(self, partitions: list[int], timeout: float = 10.0) -> dict[int, tuple[int, int]]:
        """partition -> (low, high): the oldest retained offset and the next offset to be written."""
        return {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout, cached=False)
                for p in partitions}

    def read(self, ranges: dict[int, tuple[int, int]]) -> list[Message]:
        """Every message in the ranges, in offset order per partition. Waits through broker outages."""
        if not ranges:
            return []
        remaining = {p: end - start for p, (start, end) in ranges.items()}
        assignment = [TopicPartition(self.topic, p, start) for p, (start, _) in ranges.items()]
        self._consumer.assign(assignment)
        self._consumer.resume(assignment)  # librdkafka keeps a partition paused across unassign/assign
        out: list[Message] = []
        deadline = time.monotonic() + self.fetch_timeout_s
        try:
            while any(remaining.values()):
                batch = self._consumer.consume(num_messages=5000, timeout=0.5)
                if batch:
                    deadline = time.monotonic() + self.fetch_timeout_s
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaUnavailable(f"reading {self.topic}: {err.str()}")
                    p, off = msg.partition(), msg.offset()
                    start, end = ranges[p]
                    if start <= off < end:
                        out.append(Message(p, off, msg.value()))
                        remaining[p] -= 1
                        if remaining[p] == 0:
                            self._consumer.pause([TopicPartition(self.topic, p)])
                if time.monotonic() > deadline:
                    missing = {p: n for p, n in remaining.items() if n}
                    raise KafkaUnavailable(f"no data for {self.fetch_timeout_s:.0f}s while reading {missing} "
                                           f"events of {self.topic} (broker down, or offsets past retention)")
        finally:
            self._consumer.unassign()
        return out

    def commit(self, positions: dict[int, int]) -> None:
        """Commit the group's offsets: only ever called after the checkpoint holding them is durable."""
        self._consumer.commit(offsets=[TopicPartition(self.topic, p, off) for p, off in positions.items()],
                              asynchronous=False)

    def close(self) -> None:
        self._consumer.close()
