"""Topic admin and consumer lag, on kafka-python (the control plane; see docs/DECISIONS.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from streamlearn.config import KafkaSettings
from streamlearn.errors import KafkaUnavailable
from streamlearn.kafka.broker import require_broker


def _admin(settings: KafkaSettings) -> KafkaAdminClient:
    require_broker(settings)  # seconds, where kafka-python alone retries for half a minute
    try:
        return KafkaAdminClient(**settings.kafka_python(), client_id="streamlearn-admin", request_timeout_ms=15000)
    except KafkaError:
        raise KafkaUnavailable(f"no Kafka broker answers at {settings.bootstrap}; "
                               "start one with `streamlearn kafka up`") from None


def ensure_topics(settings: KafkaSettings, topics: dict[str, int], configs: dict[str, str] | None = None) -> None:
    """Create each topic with its partition count (and topic `configs`) unless it exists
    (idempotent; never shrinks, never changes an existing topic's configs). Its replicas are the
    cluster's `default.replication.factor`: 3 on `streamlearn kafka up --brokers 3`, 1 alone."""
    admin = _admin(settings)
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(name, num_partitions=n, replication_factor=-1, topic_configs=configs or {})
                   for name, n in topics.items() if name not in existing]
        if missing:
            try:
                admin.create_topics(missing, timeout_ms=15000)
            except TopicAlreadyExistsError:
                pass  # a concurrent creator won the race: same outcome
    finally:
        admin.close()
    if missing:
        _await_leaders(settings, {t.name: t.num_partitions for t in missing})


def _await_leaders(settings: KafkaSettings, topics: dict[str, int], timeout_s: float = 30.0) -> None:
    """Return once every partition of `topics` has a leader in the broker's metadata. The
    controller accepts a new topic before the brokers have applied it: a producer asking at once
    was told the topic did not exist (a fresh-clone `make test` run, under load)."""
    client = AdminClient({**settings.confluent(), "log_level": 0})  # as replica_states: no librdkafka chatter
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            metadata = client.list_topics(timeout=10)
        except KafkaException as e:  # the broker went away while we waited: say so, not a traceback
            raise KafkaUnavailable(f"no Kafka broker answered at {settings.bootstrap} while topics {sorted(topics)} "
                                   f"were being created: {e.args[0].str()}") from None
        waiting = [name for name, n in topics.items()
                   if (found := metadata.topics.get(name)) is None or found.error is not None
                   or len(found.partitions) < n or any(p.leader < 0 for p in found.partitions.values())]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise KafkaUnavailable(f"topics {waiting} were created on {settings.bootstrap} but have no leaders "
                                   f"after {timeout_s:.0f} s; is the broker overloaded?")
        time.sleep(0.1)


def _consumer(settings: KafkaSettings, group_id: str | None = None) -> KafkaConsumer:
    require_broker(settings)
    try:
        return KafkaConsumer(**settings.kafka_python(), group_id=group_id, enable_auto_commit=False,
                             client_id="streamlearn-lag")
    except KafkaError:
        raise KafkaUnavailable(f"no Kafka broker answers at {settings.bootstrap}") from None


def partitions_of(settings: KafkaSettings, topic: str) -> list[int]:
    consumer = _consumer(settings)
    try:
        return sorted(consumer.partitions_for_topic(topic) or [])
    finally:
        consumer.close()


def end_offsets(settings: KafkaSettings, topic: str) -> dict[int, int]:
    consumer = _consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def committed_offsets(settings: KafkaSettings, group_id: str, topic: str) -> dict[int, int]:
    """The group's committed offsets (streamlearn commits only after a checkpoint is durable)."""
    admin = _admin(settings)
    try:
        committed = admin.list_group_offsets(group_id).get(group_id, {})
    except KafkaError:
        return {}
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic and meta.offset >= 0}


def consumer_lag(settings: KafkaSettings, group_id: str, topic: str) -> dict[int, int]:
    """Per partition, events not yet in a checkpoint: end offset minus committed offset."""
    ends = end_offsets(settings, topic)
    committed = committed_offsets(settings, group_id, topic)
    return {p: end - committed.get(p, 0) for p, end in ends.items()}


@dataclass(frozen=True)
class Replicas:
    """One partition's leader (-1: none) and how many of its replicas are in sync."""

    leader: int
    replicas: int
    in_sync: int


def replica_states(settings: KafkaSettings, topics: list[str]) -> dict[tuple[str, int], Replicas]:
    """(topic, partition) -> its leader and replicas, as the cluster's metadata says now. On
    confluent-kafka, not kafka-python: this is asked while a broker is down, and kafka-python's admin
    sends the request to one broker and raises if that is the dead one (seen in the failover test)."""
    require_broker(settings)
    admin = AdminClient({**settings.confluent(), "log_level": 0})
    out = {}
    for topic in topics:
        for p, meta in admin.list_topics(topic, timeout=10).topics[topic].partitions.items():
            out[(topic, p)] = Replicas(meta.leader, len(meta.replicas), len(meta.isrs))
    return out
