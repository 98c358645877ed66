"""Session-wide real services: one Apache Kafka broker and one Ray cluster, on free ports.

Both start once per test session and are torn down by what started them (the broker by
its process id, Ray by ray.shutdown of the cluster this process created). A test that fails
with a training run still going fails alone: what it left on the shared cluster is ended
after it (`training_left_behind`), not inherited by every test after it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from streamlearn.config import KafkaSettings
from streamlearn.kafka.admin import ensure_topics
from streamlearn.kafka.broker import JVM_PERFORMANCE_FLAGS, PERFORMANCE_OPTS_VAR, EmbeddedKafka, build_class_archive

pytestmark = pytest.mark.integration

# Every broker the session starts (~12: its own, the fault tests', the demo's, a 3-node cluster) runs
# on C1 alone: measured here, a broker under a test's load spends ~38 % less CPU than with C2 also
# compiling (26.4 -> 16.2 CPU-s over 45 s at 300 events/s; 27.1 -> 16.9 over eight 60k-event
# rounds). Set here, so the brokers that CLIs and demos start in child processes inherit it.
os.environ.setdefault(PERFORMANCE_OPTS_VAR, " ".join([*JVM_PERFORMANCE_FLAGS, "-XX:TieredStopAtLevel=1"]))


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> EmbeddedKafka:
    build_class_archive()  # `make setup` made it; a bare pytest run makes it here, once per cache
    broker = EmbeddedKafka(port=0, data_dir=tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_settings(kafka) -> KafkaSettings:
    return KafkaSettings(bootstrap=kafka.bootstrap)


SESSION_SCRAPE_S = 30.0


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A local Ray head started as `make demo` starts its own (streamlearn.demo.start_ray: with its
    Prometheus, token auth as Ray sets it), so tests of what the demo tells its user hold for the
    demo. The dashboard also serves the state API the fault tests use to find worker processes."""
    import ray

    from streamlearn.demo import start_ray
    from streamlearn.kafka.broker import free_port

    # Metrics sent every second, not every 10 s: test_metrics reads them soon after they move,
    # and a finished run's controller lives one interval on so its last lag sample is sent (trainer._retire).
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")
    # The session's Prometheus scrapes every 30 s, not the demo's 5: each scrape makes Ray's agent
    # render every series the session has made (half its CPU, 9 % of the suite's, at 5 s), and
    # only test_demo_ray asks this Prometheus anything (test_metrics runs one of its own).
    ctx, prometheus = start_ray(free_port(), tmp_path_factory.mktemp("prometheus"), object_store_mb=256,
                                scrape_interval_s=SESSION_SCRAPE_S)
    yield ctx
    ray.shutdown()
    if prometheus is not None:
        prometheus.down()


@pytest.fixture
def topic(kafka_settings) -> str:
    """A fresh 4-partition topic (and its dead-letter topic) per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_settings, {name: 4, f"{name}.dlq": 1})
    return name


# Ray Train v2's run driver (one per fit(), fate-shared with its workers) and the workers.
TRAIN_ACTORS = ("TrainController", "RayTrainWorker")


@pytest.fixture(autouse=True)
def training_left_behind(request):
    """After a test on the session's Ray: a Train run still alive 30 s after the test ended
    (a failed assertion skips its teardown; a training thread then waits on a stopped broker
    forever) is ended by killing its processes, run driver first. Before this, one such run
    in a fresh-clone CI held two workers' CPUs for the rest of the session and failed the
    eight tests after it on resources, not on what they test."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    address = f"http://{request.getfixturevalue('ray_cluster').dashboard_url}"
    deadline = time.monotonic() + 30  # a passing test's groups are still shutting down
    while (left := _alive_actors(address, TRAIN_ACTORS)) and time.monotonic() < deadline:
        time.sleep(0.25)  # a group ends ~0.5 s after its last checkpoint (trainer.RAY_TRAIN_ENV)
    for name in TRAIN_ACTORS:
        for pid in [pid for class_name, pid in left if class_name == name]:
            print(f"{request.node.nodeid} left a Train {name} running: SIGKILL pid {pid}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive_actors(address: str, class_names: tuple[str, ...]) -> list[tuple[str, int]]:
    from ray.util.state import list_actors

    # One state-API call after every test, not one per class name: each is a dashboard round trip.
    return [(a.class_name, a.pid) for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000)
            if a.class_name in class_names]
