"""The foundation on a real broker: the generator's events arrive, survive a restart, bad ones as written."""

from collections import Counter
from pathlib import Path

import pytest

from streamlearn.kafka.admin import end_offsets
from streamlearn.kafka.broker import EmbeddedKafka, build_class_archive, class_archive, fetch_jars, maps, metadata_ok
from streamlearn.loadgen.generator import run_load

from .streams import expected_learning, read_topic

pytestmark = pytest.mark.integration


def test_produced_events_arrive_per_partition_and_survive_a_restart(kafka, kafka_settings, topic):
    summary = run_load(kafka.bootstrap, topic, partitions=4, count=12_000, bad_fraction=0.05, seed=3)
    assert summary["events"] == 12_000 and summary["bad"] == 600

    messages = read_topic(kafka_settings, topic)
    assert len(messages) == 12_000
    assert Counter(m.partition for m in messages) == Counter(summary["per_partition"])

    # Malformed messages arrive as written: the generator does not fix them, the schema catches each.
    seen = expected_learning(messages)
    assert seen["dead_lettered"] == 600 and seen["learned"] == 11_400
    assert dict(seen["bad_by_reason"]) == summary["bad_by_reason"]

    kafka.stop()
    assert not metadata_ok(kafka.bootstrap, timeout=1.0)
    kafka.start()
    assert end_offsets(kafka_settings, topic) == {int(p): n for p, n in summary["per_partition"].items()}
    def by_position(ms):
        return sorted((m.partition, m.offset, m.value) for m in ms)

    assert by_position(read_topic(kafka_settings, topic)) == by_position(messages)


def test_second_broker_on_a_taken_port_fails_with_a_clear_error(kafka, tmp_path):
    import pytest

    from streamlearn.errors import BrokerStartError

    with pytest.raises(BrokerStartError, match=f"port {kafka.port} is taken"):
        EmbeddedKafka(port=kafka.port, data_dir=tmp_path).start()


def test_delayed_labels_follow_their_events_in_the_same_partition(kafka, kafka_settings, topic):
    import json

    from streamlearn.ingest.reader import RangeReader
    from streamlearn.kafka.admin import ensure_topics
    from streamlearn.loadgen.labels import LabelPlan, parse_label_delay

    ensure_topics(kafka_settings, {f"{topic}.labels": 4})
    plan = LabelPlan(parse_label_delay("uniform:0.5:1.5"), unlabelled_fraction=0.2)
    summary = run_load(kafka.bootstrap, topic, partitions=4, count=4_000, bad_fraction=0.01, seed=9, labels=plan)

    def read(name):  # (partition, broker timestamp ms, value) of every message
        reader = RangeReader(kafka_settings, name, "test-labels", fetch_timeout_s=30)
        try:
            marks = reader.watermarks(reader.partitions())
            return [(m.partition(), m.timestamp()[1], m.value())
                    for m in reader.read_raw({p: (lo, hi) for p, (lo, hi) in marks.items() if hi > lo})]
        finally:
            reader.close()

    events = {}
    for partition, t, value in read(topic):
        if value.startswith(b'{"event_id":"9-'):  # valid events (malformed ones are not all JSON)
            events[json.loads(value)["event_id"]] = (partition, t, json.loads(value))
    labels = [(partition, t, json.loads(value)) for partition, t, value in read(f"{topic}.labels")]
    assert len(events) == summary["valid"] == 3_960 and len(labels) == summary["labels"]["sent"]
    assert len(labels) + summary["labels"]["unlabelled"] == summary["valid"]
    assert 0.16 < summary["labels"]["unlabelled"] / summary["valid"] < 0.24
    assert all("is_fraud" not in event for _, _, event in events.values())
    assert len({label["event_id"] for _, _, label in labels}) == len(labels)
    for partition, t, label in labels:
        event_partition, event_t, event = events[label["event_id"]]
        assert partition == event_partition  # a rank reading partition p of both topics holds both halves
        assert t - event_t >= 450  # sent no sooner than its delay (0.5 s at least) after its event
        assert 500 <= label["label_time"] - event["event_time"] <= 1500


def test_a_window_reads_in_the_same_order_however_its_fetches_arrive(kafka, kafka_settings, topic):
    """A window's rows, and so each step's batch, must not depend on which partition's fetch came
    first: a replay after a crash learns the window again in the same steps (test_replay)."""
    from streamlearn.ingest.reader import RangeReader

    run_load(kafka.bootstrap, topic, partitions=4, count=12_000, seed=5)
    reader = RangeReader(kafka_settings, topic, "test-order", fetch_timeout_s=30)
    try:
        marks = reader.watermarks(reader.partitions())
        for k in range(3):  # three windows of a third of each partition, ranges given highest partition first
            ranges = {p: (lo + (hi - lo) * k // 3, lo + (hi - lo) * (k + 1) // 3) for p, (lo, hi) in
                      sorted(marks.items(), reverse=True)}
            got = [(m.partition(), m.offset()) for m in reader.read_raw(ranges)]
            assert got == [(p, o) for p in sorted(ranges) for o in range(*ranges[p])]
    finally:
        reader.close()


def test_brokers_start_from_the_class_archive_setup_made(kafka, tmp_path):
    """`make setup` (`kafka fetch-jars`) leaves the broker's class-data archive beside the jars; the
    session's broker was started with it, this JDK maps it for the broker's classpath, and a cut
    one is refused (build_class_archive adopts an archive only if it maps)."""
    jars = fetch_jars()
    archive = build_class_archive()
    assert archive == class_archive(jars) and archive.exists()
    assert f"-XX:SharedArchiveFile={archive}".encode() in Path(f"/proc/{kafka.pid()}/cmdline").read_bytes().split(b"\0")
    assert maps(archive, jars)
    half = tmp_path / "half.jsa"  # what a JVM killed while writing it would leave
    half.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    assert not maps(half, jars)
