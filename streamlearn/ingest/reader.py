"""Read exact offset ranges from Kafka with confluent-kafka (the data plane).

A window's slice is a set of [start, end) ranges. The reader keeps its partitions assigned
and fetching for its whole life, and only seeks where a range does not start where the last
one ended; messages delivered past a range's end are carried to the next range that starts
there, so no event outside the window is ever returned and a rank that reads its partitions
window after window (windows.py) never fetches an event twice. Measured, each of these cost
most of the 5.5 s "fetch" phase of 200k events: assigning per window (a fetch start each
time); asking librdkafka for more messages than a range had left (consume() then waits out
its whole timeout, every window); pausing finished partitions (a resumed partition waited
up to 1 s for librdkafka's idle broker thread to fetch again).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import NamedTuple

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from streamlearn.config import KafkaSettings
from streamlearn.errors import KafkaUnavailable

# A training consumer fetches ahead without pause (the queue settings below) in pieces of
# 256 KiB a partition, ~850 events. Larger pieces are slower, not faster: with 8 MiB the first
# read of 4 partitions waited 0.59 s and 400k events were read at 420k/s; with 256 KiB, 16 ms
# and 720k/s (docs/DECISIONS.md §1).
FETCH_CONFIG = {
    "fetch.wait.max.ms": 20,  # a slow stream's events must not wait for a full fetch
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 256 << 10,
    "queued.max.messages.kbytes": 65536,
    # The prefetch queue bounds what a reader holds ahead of its windows (in librdkafka's
    # memory until consumed); a full queue must not hold back the next fetch for long.
    "queued.min.messages": 50_000,
    "fetch.queue.backoff.ms": 20,
}


def _offset(message) -> int:
    return message.offset()


class Message(NamedTuple):
    partition: int
    offset: int
    value: bytes | None


class RangeReader:
    def __init__(self, settings: KafkaSettings, topic: str, group_id: str, *, fetch_timeout_s: float = 300.0,
                 fetch: dict | None = None, pause_between_reads: bool = False):
        self.topic = topic
        self.fetch_timeout_s = fetch_timeout_s
        # A reader that jumps about (delayed feedback's re-reads) pauses each partition once its
        # range is read: librdkafka otherwise goes on fetching every partition it was ever given,
        # and each read sifts the others' prefetched messages (25 ms a re-read, measured).
        self._pause_between_reads = pause_between_reads
        self._paused: set[int] = set()
        common = {**settings.confluent(), "group.id": group_id, "log_level": 3,
                  "enable.auto.commit": False}  # offsets are committed only after a checkpoint is durable
        self._consumer = Consumer({**common, **FETCH_CONFIG, **(fetch or {}), "enable.partition.eof": False})
        # Metadata, watermarks and commits go through a consumer of their own: watermark
        # queries on the fetching consumer stalled its next fetch by 0.5-1 s (measured).
        self._control = Consumer(common)
        try:  # connect now, not at the first window: the first fetch came 0.5 s sooner (measured)
            self._consumer.list_topics(topic, timeout=5)
        except KafkaException:
            pass  # the broker may be away; the first read waits for it like any other
        self._next: dict[int, int] = {}  # partition -> offset the consumer delivers next
        self._carry: dict[int, list] = {}  # messages delivered past the last range's end, in order

    def partitions(self, timeout: float = 10.0) -> list[int]:
        try:
            meta = self._control.list_topics(self.topic, timeout=timeout).topics[self.topic]
        except KafkaException as e:
            raise KafkaUnavailable(f"cannot read metadata of topic {self.topic!r}: {e}") from None
        if meta.error is not None:
            raise KafkaUnavailable(f"topic {self.topic!r}: {meta.error.str()}; create it first (streamlearn topics)")
        return sorted(meta.partitions)

    def watermarks(self, partitions: list[int], timeout: float = 10.0) -> dict[int, tuple[int, int]]:
        """partition -> (low, high): the oldest retained offset and the next offset to be written."""
        return {p: self._control.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout, cached=False)
                for p in partitions}

    def read(self, ranges: dict[int, tuple[int, int]]) -> list[Message]:
        """Every message in the ranges, partition after partition (ascending), each in offset
        order. Waits through broker outages."""
        return [Message(m.partition(), m.offset(), m.value()) for m in self.read_raw(ranges)]

    def read_raw(self, ranges: dict[int, tuple[int, int]]) -> list:
        """`read`, as confluent-kafka's own message objects: the training hot path makes no
        object of its own per event (a tuple each cost as much as the whole consume). The order
        does not depend on how the fetches arrived: a window's rows, and so each step's, are the
        same when a replay reads it again (tests/integration/test_replay.py)."""
        parts: dict[int, list] = {p: [] for p in ranges}
        remaining: dict[int, int] = {}
        for p, (start, end) in ranges.items():
            if end > start:
                remaining[p] = self._position(p, start, end, parts[p])
        deadline = time.monotonic() + self.fetch_timeout_s
        while any(remaining.values()):
            # Never ask for more than is missing: consume() waits until it has num_messages.
            batch = self._consumer.consume(num_messages=min(10_000, sum(remaining.values())), timeout=0.5)
            if batch:
                deadline = time.monotonic() + self.fetch_timeout_s
                self._sort(batch, ranges, remaining, parts)
            if time.monotonic() > deadline:
                missing = {p: n for p, n in remaining.items() if n}
                raise KafkaUnavailable(f"no data for {self.fetch_timeout_s:.0f}s while reading {missing} "
                                       f"events of {self.topic} (broker down, or offsets past retention)")
        if self._pause_between_reads:
            self._pause([p for p in ranges if p in self._next])
        out: list = []
        for p in sorted(parts):
            out += parts[p]
        return out

    def _pause(self, partitions: list[int]) -> None:
        self._consumer.pause([TopicPartition(self.topic, p) for p in partitions])
        self._paused.update(partitions)

    def _sort(self, batch: list, ranges: dict[int, tuple[int, int]], remaining: dict[int, int],
              parts: dict[int, list]) -> None:
        """Put a consumed batch's messages in their ranges, or carry them. librdkafka hands over a
        fetch's messages partition by partition, hundreds in a row, each run in offset order, so
        the work is per run, not per message: with a Python loop over every message the reader
        alone read 873k events/s, with this 1.00M (docs/DECISIONS.md §1)."""
        kind = type(batch[0])
        if any(map(kind.error, batch)):
            for msg in batch:
                if msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaUnavailable(f"reading {self.topic}: {msg.error().str()}")
            batch = [msg for msg in batch if msg.error() is None]
            if not batch:
                return
        partitions = np.fromiter(map(kind.partition, batch), np.int64, len(batch))
        cuts = (np.flatnonzero(partitions[1:] != partitions[:-1]) + 1).tolist()
        for lo, hi in zip([0, *cuts], [*cuts, len(batch)], strict=True):
            p, run = int(partitions[lo]), batch[lo:hi]
            self._next[p] = run[-1].offset() + 1
            left = remaining.get(p, 0)
            take = min(left, bisect_left(run, ranges[p][1], key=_offset)) if left else 0
            if take:
                parts[p] += run[:take]
                remaining[p] -= take
            if take < len(run):  # past this range: the next range of p most likely starts right here
                self._carry.setdefault(p, []).extend(run[take:])

    def _position(self, p: int, start: int, end: int, out: list) -> int:
        """Make partition p deliver `start` next (from what it carried, where it already is, or by a seek);
        return how many of [start, end) are still to be consumed."""
        carried = self._carry.pop(p, [])
        if carried and carried[0].offset() == start:
            # Carried messages are in offset order, and a partition read far ahead carries tens of
            # thousands: find the range's end by bisection (scanning them all, window after
            # window, was a third of the reader's time, measured).
            cut = bisect_left(carried, end, key=_offset)
            use, rest = carried[:cut], carried[cut:]
            out.extend(use)
            if rest:
                self._carry[p] = rest
                return 0
            start += len(use)
            if start >= end:
                return 0
            if self._next.get(p) == start and p not in self._paused:
                return end - start
        if p not in self._next:
            self._consumer.incremental_assign([TopicPartition(self.topic, p, start)])
        elif p in self._paused:  # where a paused partition's fetcher stands is librdkafka's: seek
            self._consumer.resume([TopicPartition(self.topic, p)])
            self._paused.discard(p)
            self._seek(p, start)
        elif self._next[p] != start:
            self._seek(p, start)
        self._next[p] = start
        return end - start

    def _seek(self, p: int, offset: int) -> None:
        tp = TopicPartition(self.topic, p, offset)
        for attempt in range(50):  # a just-assigned partition refuses seeks until its fetcher starts
            try:
                self._consumer.seek(tp)
                return
            except KafkaException as e:
                if e.args[0].code() != KafkaError._STATE or attempt == 49:
                    raise KafkaUnavailable(f"cannot seek {self.topic}[{p}] to {offset}: {e}") from None
                time.sleep(0.02)

    def commit(self, positions: dict[int, int]) -> None:
        """Commit the group's offsets: only ever called after the checkpoint holding them is durable."""
        self._control.commit(offsets=[TopicPartition(self.topic, p, off) for p, off in positions.items()],
                             asynchronous=False)

    def close(self) -> None:
        self._consumer.close()
        self._control.close()
