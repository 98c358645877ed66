"""`streamlearn evaluate`: the quality of what was served, from the answers and the labels (issue 16).

Reads the answers the scorer published (`<topic>.scores`, serve/answers.py) and the labels (the
pipeline's `<topic>.labels`, or the events themselves for a pipeline whose label is inline),
joins them in ServedQuality, and every `every_s` seconds appends a row to
`<run_dir>/served.jsonl` (read by `streamlearn status` and the report) and sets the
`streamlearn_served_*` metrics (when connected to Ray: run it as a Ray job).

It keeps no state of its own: on start it reads both topics from `lookback_s` ago (the label
TTL, at most an hour, by Kafka's own message times) and rebuilds the join from there, so a
restart costs a re-read, never a wrong figure. Bad messages are counted and skipped: the
trainer dead-letters bad events and labels; the evaluator only judges answers.

An answer or label waits at most the TTL after the evaluator read it, by this process's clock:
the join's expiry needs times that rise as rows arrive, and messages of several partitions (and
replicas) read together do not. What leaves unmatched is counted, per side and reason.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from streamlearn import metrics
from streamlearn.config import KafkaSettings
from streamlearn.errors import ConfigError, KafkaUnavailable
from streamlearn.kafka.broker import probe
from streamlearn.logs import log
from streamlearn.observe.config import EvaluatorConfig
from streamlearn.observe.quality import ServedQuality
from streamlearn.pipeline import DelayedFeedback, Pipeline
from streamlearn.serve.answers import SCORES_SUFFIX, decode_answers, id_field

# An inline label is on the topic when (or before) its event is scored: answers wait seconds, not
# the days a delayed label may take.
INLINE_TTL_S = 300.0
# How long the evaluator waits for a broker to answer before it says none does.
BROKER_WAIT_S = 3.0
VERSIONS_SHOWN = 5  # per-version rows and metrics: the newest few (versions change every few seconds)


class Evaluator:
    def __init__(self, pipeline: Pipeline, kafka: KafkaSettings, cfg: EvaluatorConfig):
        self.pipeline, self.cfg = pipeline, cfg
        spec = pipeline.labels
        self.id_field = id_field(pipeline)
        self.scores_topic = cfg.topic + SCORES_SUFFIX
        self.labels_topic = cfg.topic + spec.suffix if spec else cfg.topic
        self.label_schema = spec.schema if spec else pipeline.schema
        ttl = spec.ttl_s if spec else INLINE_TTL_S
        self.quality = ServedQuality(pipeline.task, cfg.window, ttl, cfg.max_pending,
                                     unlabelled_as=spec.unlabelled_as if spec else None,
                                     matured_only=isinstance(spec, DelayedFeedback), sample=cfg.sample)
        self.lookback_s = cfg.lookback_s if cfg.lookback_s is not None else min(ttl, 3600.0)
        self.skipped: Counter[str] = Counter()  # unreadable messages, by topic side
        self.joined_since_row = 0
        answers, why = probe(kafka.confluent(), BROKER_WAIT_S)
        if not answers:  # librdkafka alone would wait out list_topics' 10 s, then say little
            raise KafkaUnavailable(f"no Kafka broker answers at {kafka.bootstrap} within {BROKER_WAIT_S:g} s"
                                   f"{f' ({why})' if why else ''}: start one (`streamlearn kafka up`) or pass "
                                   "--bootstrap / STREAMLEARN_KAFKA_BOOTSTRAP")
        self._consumer = Consumer({**kafka.confluent(), "group.id": f"streamlearn-evaluator-{pipeline.name}",
                                   "enable.auto.commit": False, "log_level": 3, "fetch.wait.max.ms": 100})
        self._assign(time.time() - self.lookback_s)

    def _assign(self, since: float) -> None:
        """Both topics' partitions, from the first message at or after `since` (Unix seconds)."""
        wanted = []
        for topic in (self.scores_topic, self.labels_topic):
            try:
                meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
            except KafkaException as e:
                raise KafkaUnavailable(f"cannot read metadata of topic {topic!r}: {e}") from None
            if meta.error is not None or not meta.partitions:
                raise ConfigError(f"topic {topic!r} does not exist; the scorer publishes answers to "
                                  f"{self.scores_topic} when deployed with --scores-topic (create it with "
                                  f"`streamlearn topics create {topic}`)")
            wanted += [TopicPartition(topic, p, int(since * 1000)) for p in sorted(meta.partitions)]
        found = self._consumer.offsets_for_times(wanted, timeout=10)
        # A partition with nothing that recent answers -1: start at its end.
        self._consumer.assign([TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                               for tp in found])

    def poll(self, timeout_s: float = 0.5) -> int:
        """Take what the topics have (up to 20k messages); returns how many answers met their label."""
        messages = [m for m in self._consumer.consume(20_000, timeout=timeout_s) if m.error() is None]
        answers = [m for m in messages if m.topic() == self.scores_topic]
        labels = [m for m in messages if m.topic() != self.scores_topic]
        now = time.time()
        joined = self._labels(labels, now) + self._answers(answers, now)
        self.joined_since_row += joined
        return joined

    def _answers(self, messages: list, now: float) -> int:
        ids, versions, scores = [], [], []
        for m in messages:
            try:
                mine, version, given, _t = decode_answers(m.value())
            except ValueError:
                self.skipped["answers"] += 1
                continue
            ids += mine
            scores += given
            versions += [version] * len(mine)
        return self.quality.add_answers(ids, np.array(versions), np.array(scores), now) if ids else 0

    def _labels(self, messages: list, now: float) -> int:
        if not messages:
            return 0
        values = [m.value() for m in messages]
        if self.pipeline.labels is not None:
            columns, kept, bad = self.label_schema.decode_columns(values)
            ids, targets = columns[self.id_field], self.pipeline.label_targets(columns)
        else:  # inline labels: the events themselves
            valid, kept, bad = self.label_schema.decode_many(values)
            ids, targets = [m[self.id_field] for m in valid], self.pipeline.targets(valid)
        if bad:
            self.skipped["labels"] += len(bad)
        return self.quality.add_labels(list(map(str, ids)), targets, now) if kept else 0

    def row(self) -> dict[str, Any]:
        """Expire what waited too long, then the figures now: one line of served.jsonl."""
        self.quality.expire(time.time())
        pending = self.quality.join.pending
        row = {"t": time.time(), "overall": self.quality.overall_summary(),
               "versions": {str(v): s for v, s in self.quality.summary(VERSIONS_SHOWN).items()},
               "joined": self.quality.joined_total, "joined_since": self.joined_since_row,
               **({"unlabelled": self.quality.unlabelled_total} if self.quality.unlabelled_as is not None else {}),
               **({"matured_only": True} if self.quality.matured_only else {}),
               **({"sample": self.cfg.sample} if self.cfg.sample < 1.0 else {}),
               "pending": {"answers": pending["events"], "labels": pending["labels"]},
               "expired": {("answers" if k.startswith("events.") else "labels") + k[k.index("."):]: n
                           for k, n in self.quality.join.expired.items()},
               "skipped": dict(self.skipped)}
        self.joined_since_row = 0
        return row

    def run(self, duration_s: float | None = None, stop: threading.Event | None = None) -> None:
        """Poll and write a row every `every_s` until `duration_s` (forever by default) or `stop` is set."""
        path = self.cfg.run_dir / "served.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        log("evaluator_started", scores=self.scores_topic, labels=self.labels_topic, lookback_s=self.lookback_s,
            out=str(path))
        end = time.monotonic() + duration_s if duration_s is not None else float("inf")
        next_row = time.monotonic() + self.cfg.every_s
        try:
            while time.monotonic() < end and not (stop is not None and stop.is_set()):
                self.poll(min(0.5, max(0.0, next_row - time.monotonic())))
                if time.monotonic() >= next_row:
                    self._emit(self.row(), path)
                    next_row += self.cfg.every_s
            self._emit(self.row(), path)
        finally:
            self._consumer.close()

    def _emit(self, row: dict[str, Any], path: Path) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        expired = {side: sum(n for k, n in row["expired"].items() if k.startswith(side))
                   for side in ("answers", "labels")}
        metrics.record_served(self.pipeline.name, row["overall"], {int(v): s for v, s in row["versions"].items()},
                              row["joined_since"], expired)
