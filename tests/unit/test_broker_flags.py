"""The broker JVM's flags: our collector and compilers, or what $KAFKA_JVM_PERFORMANCE_OPTS says."""

from streamlearn.kafka.broker import JVM_FLAGS, JVM_PERFORMANCE_FLAGS, PERFORMANCE_OPTS_VAR, jvm_flags


def test_without_the_variable_the_broker_gets_our_collector(monkeypatch):
    monkeypatch.delenv(PERFORMANCE_OPTS_VAR, raising=False)
    assert jvm_flags() == JVM_FLAGS + JVM_PERFORMANCE_FLAGS


def test_the_variable_replaces_collector_and_compilers_and_keeps_the_heap(monkeypatch):
    monkeypatch.setenv(PERFORMANCE_OPTS_VAR, " -XX:+UseSerialGC  -XX:TieredStopAtLevel=1 ")
    assert jvm_flags() == JVM_FLAGS + ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    assert any(f.startswith("-Xmx") for f in jvm_flags())


def test_an_empty_variable_is_the_same_as_none(monkeypatch):
    monkeypatch.setenv(PERFORMANCE_OPTS_VAR, "  ")
    assert jvm_flags() == JVM_FLAGS + JVM_PERFORMANCE_FLAGS
