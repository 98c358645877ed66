"""Session-wide real services: one Apache Kafka broker and one Ray cluster, on free ports.

Both start once per test session and are torn down by what started them (the broker by
its process id, Ray by ray.shutdown of the cluster this process created).
"""

from __future__ import annotations

import os
import uuid

import pytest

from streamlearn.config import KafkaSettings
from streamlearn.kafka.admin import ensure_topics
from streamlearn.kafka.broker import EmbeddedKafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> EmbeddedKafka:
    broker = EmbeddedKafka(port=0, data_dir=tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_settings(kafka) -> KafkaSettings:
    return KafkaSettings(bootstrap=kafka.bootstrap)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A local Ray head on free loopback ports (dashboard included: the fault tests use its
    state API), and this process connected to it as the driver."""
    import ray

    from streamlearn.cluster import LocalRay

    cluster = LocalRay(log_file=tmp_path_factory.mktemp("ray") / "ray.log",
                       env={"RAY_AUTH_MODE": "disabled", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1"}).start()
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "1"  # the driver reads it too
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    yield cluster
    ray.shutdown()
    cluster.stop()


@pytest.fixture
def topic(kafka_settings) -> str:
    """A fresh 4-partition topic (and its dead-letter topic) per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_settings, {name: 4, f"{name}.dlq": 1})
    return name
