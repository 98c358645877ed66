"""Every answer a replica gives, published to `<topic>.scores` for the evaluator (issue 16).

One Kafka message per scoring request: {"version", "t", "ids", "scores"}, the model version that
answered, when (Unix seconds), and each event's id and score in request order. One message per
request rather than per event keeps the cost on the request path to one JSON encode and one
non-blocking `produce` into librdkafka's queue, which a background thread of librdkafka sends.

Publishing never holds up or fails a request: a full local queue (the broker away for long)
drops the answer and counts it (`streamlearn_answers_dropped{reason}`), as does a delivery that
fails. The served-quality figures are then computed on fewer answers, never on wrong ones.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from confluent_kafka import Producer

from streamlearn import metrics
from streamlearn.errors import ConfigError

SCORES_SUFFIX = ".scores"  # answers of the scorer that serves <topic>'s model go to <topic>.scores
# librdkafka's queue holds up to this many unsent requests' answers (each a few hundred bytes to
# a few tens of KiB): minutes of a replica's traffic while the broker is briefly away.
QUEUE_MESSAGES = 100_000


def id_field(pipeline) -> str:
    """The event field an answer and its label share: the joined labels' key, else `event_id`."""
    name = pipeline.labels.key if pipeline.labels is not None else "event_id"
    if name not in {f.name for f in pipeline.schema.fields}:
        raise ConfigError(f"pipeline {pipeline.name!r}: its events have no {name!r} field, so its answers cannot "
                          "be matched with their labels; publish answers (--scores-topic) only for pipelines "
                          "whose events carry an id")
    return name


class AnswerLog:
    def __init__(self, kafka_conf: dict[str, Any], topic: str, pipeline: str):
        self.topic, self.pipeline = topic, pipeline
        self.dropped = 0
        # acks=all: an answer the evaluator judges must survive a leader's failover (a bank's
        # Kafka replicates); idempotence: the retries through that failover write it once. The
        # producer is off the request path, so the wait costs callers nothing.
        self._producer = Producer({**kafka_conf, "linger.ms": 50, "acks": "all", "enable.idempotence": True,
                                   "log_level": 3,
                                   "queue.buffering.max.messages": QUEUE_MESSAGES})

    def publish(self, ids: list[str], version: int, scores: list[float]) -> None:
        value = orjson.dumps({"version": version, "t": time.time(), "ids": ids, "scores": scores})
        try:
            self._producer.produce(self.topic, value, on_delivery=self._delivered)
        except BufferError:
            self._drop("queue_full")
        self._producer.poll(0)  # serve delivery callbacks; never waits

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self._drop("delivery_failed")

    def _drop(self, reason: str) -> None:
        self.dropped += 1
        metrics.record_answers_dropped(self.pipeline, reason)

    def close(self, timeout_s: float = 5.0) -> int:
        """Send what is queued; returns how many answers are still unsent."""
        return self._producer.flush(timeout_s)


def decode_answers(value: bytes) -> tuple[list[str], int, list[float], float]:
    """(ids, version, scores, t) of one message `publish` wrote; ValueError if it is not one."""
    try:
        msg = orjson.loads(value)
        ids, scores, version, t = msg["ids"], msg["scores"], int(msg["version"]), float(msg["t"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not an answers message: {e}") from None
    if not (isinstance(ids, list) and isinstance(scores, list) and len(ids) == len(scores)):
        raise ValueError("not an answers message: ids and scores must be lists of one length")
    return [str(i) for i in ids], version, [float(s) for s in scores], t
