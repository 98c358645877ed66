"""What a checkpoint promises about the stream: the exactly-once bookkeeping of a lineage.

A lineage is the chain of checkpoints one model has grown through, across crashes,
resizes and restarts. Its invariant, which the integration tests check:
    learned + dead_lettered == sum over partitions of (positions - start_offsets)
and `fingerprint` (sum of crc32 of every learned event's bytes) equals the same sum over
the events a test produced, so an event learned twice or never would show.

With joined labels (ingest/labelled.py) an event may also have expired unlabelled or still be
waiting in the join state, and the labels topic has offsets of its own:
    learned + (dead_lettered - labels_dead_lettered) + expired + pending events == events consumed
    (learned - defaulted) + labels_dead_lettered + pending labels == labels consumed
(every learned event joined exactly one label, but those the pipeline learns with `unlabelled_as`
once none came within the TTL: `defaulted`; the pending counts are in the checkpoint's meta).

With delayed feedback (ingest/feedback.py) no event waits: every valid event is learned at once
with the silent answer (`defaulted`), and every report applied learns its event again; a report
read before its event was learned waits for it (pending labels):
    defaulted + (dead_lettered - labels_dead_lettered) == events consumed
    (learned - defaulted) + labels_dead_lettered + ignored + pending labels == reports consumed
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from streamlearn.ingest.decode import FINGERPRINT_MOD


@dataclass
class Counters:
    learned: int = 0
    dead_lettered: int = 0
    fingerprint: int = 0
    steps: int = 0
    expired: int = 0  # joined labels: events that left the join state without their label
    labels_dead_lettered: int = 0  # joined labels: the part of dead_lettered that was labels
    defaulted: int = 0  # joined labels: the part of learned that had no label (`unlabelled_as`)
    ignored: int = 0  # delayed feedback: reports that gave the silent answer (they change nothing)

    def add(self, other: Counters) -> None:
        self.learned += other.learned
        self.dead_lettered += other.dead_lettered
        self.fingerprint = (self.fingerprint + other.fingerprint) % FINGERPRINT_MOD
        self.steps += other.steps
        self.expired += other.expired
        self.labels_dead_lettered += other.labels_dead_lettered
        self.defaulted += other.defaulted
        self.ignored += other.ignored


@dataclass
class Lineage:
    topic: str
    start_offsets: dict[int, int]
    positions: dict[int, int]  # per partition: every event before this offset is learned or dead-lettered
    dlq_positions: dict[int, int] = field(default_factory=dict)
    totals: Counters = field(default_factory=Counters)
    version: int = 0
    created_at: float = field(default_factory=time.time)
    # Joined labels: the labels topic's offsets, like `start_offsets` and `positions`.
    label_start_offsets: dict[int, int] | None = None
    label_positions: dict[int, int] | None = None

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Lineage:
        def ints(d):
            return {int(k): int(v) for k, v in d.items()}

        labels = meta.get("labels")
        return cls(topic=meta["topic"], start_offsets=ints(meta["start_offsets"]), positions=ints(meta["offsets"]),
                   dlq_positions=ints(meta.get("dlq_offsets", {})), totals=Counters(**meta["counters"]),
                   version=int(meta["version"]), created_at=float(meta.get("lineage_created_at", time.time())),
                   label_start_offsets=ints(labels["start_offsets"]) if labels else None,
                   label_positions=ints(labels["offsets"]) if labels else None)

    def to_meta(self) -> dict[str, Any]:
        meta = {"topic": self.topic, "start_offsets": self.start_offsets, "offsets": self.positions,
                "dlq_offsets": self.dlq_positions, "counters": asdict(self.totals), "version": self.version,
                "lineage_created_at": self.created_at}
        if self.label_positions is not None:
            meta["labels"] = {"start_offsets": self.label_start_offsets, "offsets": self.label_positions}
        return meta

    def consumed(self) -> int:
        return sum(self.positions[p] - self.start_offsets.get(p, 0) for p in self.positions)
