"""The foundation on a real broker: the generator's events arrive, survive a restart, bad ones as written."""

from collections import Counter

from load.generator import run_load
from streamlearn.kafka.admin import end_offsets
from streamlearn.kafka.broker import EmbeddedKafka, metadata_ok

from .streams import expected_learning, read_topic


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
