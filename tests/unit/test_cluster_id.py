"""A new Kafka cluster's id, made in Python instead of by `kafka-storage random-uuid` (a JVM start).
Every broker the integration tests start is formatted with one, so Kafka's own StorageTool checks
it there; here, that it has the shape Kafka's Uuid.toString gives and never starts with "-" (which
Kafka's Uuid.randomUuid refuses: the command-line tools would read it as an option)."""

import base64
import re
import uuid

from streamlearn.kafka.broker import new_cluster_id


def test_a_cluster_id_is_a_random_uuid_in_kafka_s_base64_form():
    ids = [new_cluster_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", text) and not text.startswith("-"), text
        assert uuid.UUID(bytes=base64.urlsafe_b64decode(text + "==")).version == 4, text
