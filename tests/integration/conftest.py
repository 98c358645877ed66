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
def ray_cluster():
    """A local Ray cluster. Logical CPUs exceed the 2 real cores on purpose: every actor and
    worker here asks for a fraction, and the sum must fit the logical count, not the cores."""
    import ray

    from streamlearn.localray import start_local_ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "1")
    from streamlearn.kafka.broker import free_port

    # The dashboard serves the state API the fault tests use to find worker processes.
    ctx = start_local_ray(num_cpus=4, object_store_memory=256 * 1024 * 1024, include_dashboard=True,
                          dashboard_host="127.0.0.1", dashboard_port=free_port(), log_to_driver=False,
                          configure_logging=False)
    yield ctx
    ray.shutdown()


@pytest.fixture
def topic(kafka_settings) -> str:
    """A fresh 4-partition topic (and its dead-letter topic) per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_settings, {name: 4, f"{name}.dlq": 1})
    return name
