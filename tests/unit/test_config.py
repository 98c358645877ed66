import pytest

from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import ConfigError


def test_train_config_defaults_derive_names():
    cfg = TrainConfig(pipeline="fraud", topic="tx")
    assert (cfg.dlq_topic, cfg.group_id, cfg.run_name) == ("tx.dlq", "streamlearn-fraud", "fraud")


def test_ingest_auto_is_the_measured_rule_and_says_why():
    """`--ingest auto` (the default): Ray Data under GPU trainers, the direct path under CPU ones;
    an asked-for mode stays, and every config says why it has the mode it has."""
    cpu, gpu = TrainConfig(), TrainConfig(use_gpu=True)
    assert (cpu.ingest, gpu.ingest) == ("direct", "ray-data")
    assert cpu.ingest_why.startswith("auto: CPU trainers") and gpu.ingest_why.startswith("auto: GPU trainers")
    asked = TrainConfig(ingest="ray-data")
    assert (asked.ingest, asked.ingest_why) == ("ray-data", "asked for (--ingest ray-data)")
    assert TrainConfig(use_gpu=True, ingest="direct").ingest == "direct"
    with pytest.raises(ConfigError, match="ingest must be one of auto, direct, ray-data"):
        TrainConfig(ingest="kafka")


@pytest.mark.parametrize("kwargs, says", [
    ({"workers": 0}, "workers must be >= 1"),
    ({"read_lanes": 0}, "read_lanes must be >= 1"),
    ({"cpus_per_worker": 0}, "fractions like 0.5"),
    ({"keep_checkpoints": 1}, "keep_checkpoints must be >= 2"),
    ({"topic": ""}, "--topic"),
    ({"max_events": 0}, "max_events must be positive"),
])
def test_train_config_fails_early_saying_how_to_fix(kwargs, says):
    with pytest.raises(ConfigError, match=says):
        TrainConfig(**kwargs)


def test_sasl_needs_all_its_settings():
    with pytest.raises(ConfigError, match="SASL needs"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512")


def test_a_wrong_kafka_setting_never_echoes_the_password():
    # pydantic's own error repeats every input; the ConfigError names the setting only.
    with pytest.raises(ConfigError) as caught:
        KafkaSettings(security_protocol="SASL_SSL", sasl_password="hunter2-very-secret")
    with pytest.raises(ConfigError, match="sasl_mechanism") as wrong_choice:
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-1", sasl_username="bank",
                      sasl_password="hunter2-very-secret")
    assert "hunter2" not in str(caught.value) + str(wrong_choice.value)


def test_secrets_never_print_but_reach_the_clients(monkeypatch):
    monkeypatch.setenv("STREAMLEARN_KAFKA_SASL_PASSWORD", "hunter2-very-secret")
    s = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="bank")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert s.confluent()["sasl.password"] == "hunter2-very-secret"
    assert s.kafka_python()["sasl_plain_password"] == "hunter2-very-secret"


def test_load_without_a_bound_refuses_before_it_touches_the_broker():
    """Issue 47: `streamlearn load` without --count or --duration created the topics, then refused.
    Against an address where no broker answers, the refusal comes at once, exit 2, naming the fix."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamlearn.cli", "load", "--bootstrap", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--count N and/or --duration SECONDS" in done.stderr
    assert time.monotonic() - started < 30  # no metadata wait on the absent broker
