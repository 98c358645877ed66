"""The bank's systems asking for scores: a share of the live transactions, scored as they happen.

The payment system that produces a transaction to Kafka also asks the scorer about it. Here a
caller follows the topic from its end (so what it scores is live, as a payment system's calls
are) and posts a share of the valid events, in batches, to POST /score. With the scorer
publishing its answers (--scores-topic), the evaluator judges those answers once their labels
come: `make demo` runs one caller so its served-quality figures have answers to judge.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import httpx
import orjson
from confluent_kafka import Consumer, TopicPartition

from streamlearn.schema import Schema


def call_scorer(bootstrap: str, topic: str, url: str, schema: Schema, stop: threading.Event, *,
                share: float = 0.2, batch: int = 50, max_batches_s: float = 20.0, seed: int = 0,
                token: str | None = None) -> Counter[int]:
    """Score `share` of the topic's valid events until `stop` is set; returns answers by HTTP status.
    At most `max_batches_s` requests a second: a caller, not a load test."""
    rng = random.Random(seed)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streamlearn-caller", "log_level": 3,
                         "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, -1) for p in partitions])  # -1: from the end, live only
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
    statuses: Counter[int] = Counter()
    pending: list[dict] = []
    with httpx.Client(timeout=10.0, headers=headers) as client:
        try:
            while not stop.is_set():
                messages = [m for m in consumer.consume(2000, timeout=0.5) if m.error() is None]
                events, _kept, _bad = schema.decode_many([m.value() for m in messages if rng.random() < share])
                pending += events
                while len(pending) >= batch and not stop.is_set():
                    started = time.monotonic()
                    body, pending = pending[:batch], pending[batch:]
                    try:
                        statuses[client.post(f"{url}/score", content=orjson.dumps(body)).status_code] += 1
                    except httpx.HTTPError:
                        statuses[0] += 1  # no answer at all: counted, and the caller goes on
                    time.sleep(max(0.0, 1.0 / max_batches_s - (time.monotonic() - started)))
                pending = pending[-10 * batch:]  # behind the stream: the oldest are no longer live
        finally:
            consumer.close()
    return statuses
