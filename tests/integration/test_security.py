"""Security end to end: Kafka over SASL_SSL with SCRAM, secrets kept out of every output,
bearer-token scoring, and checkpoints that load only when their checksum verifies.

The broker here is a second embedded Kafka with a private CA, a server certificate for
127.0.0.1 and SCRAM users, all made when the module starts; nothing is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipelines.banking import TRANSACTION
from streamlearn.config import REPO_ROOT, KafkaSettings
from streamlearn.errors import ConfigError, KafkaUnavailable
from streamlearn.ingest.deadletter import DeadLetters, dead_letter_key, decode
from streamlearn.kafka.admin import committed_offsets, end_offsets, ensure_topics
from streamlearn.kafka.broker import EmbeddedKafka, require_broker
from streamlearn.kafka.secure import BrokerSecurity, make_tls
from streamlearn.loadgen.generator import run_load
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.train.trainer import run_dir, train

from .models import EVENT, write_checkpoint
from .streams import dead_letter_keys, expected_learning, read_topic

pytestmark = pytest.mark.integration

# Unique per run, so finding one in a log can only mean this run leaked it.
PASSWORD = f"scram-pw-{uuid.uuid4().hex}"
WRONG_PASSWORD = f"wrong-pw-{uuid.uuid4().hex}"
TOKEN = f"serve-token-{uuid.uuid4().hex}"
SECRETS = (PASSWORD, WRONG_PASSWORD, TOKEN)


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory) -> EmbeddedKafka:
    security = BrokerSecurity(users={"trainer": SecretStr(PASSWORD)}, mechanism="SCRAM-SHA-512")
    # 180 s, not 90: a JVM took 27 s to its first log line on two busy cores here, and a CI run
    # late in a loaded suite once errored in this fixture (its text was cut off; a slow start fits).
    broker = EmbeddedKafka(port=0, data_dir=tmp_path_factory.mktemp("secure-kafka"), security=security,
                           start_timeout_s=180.0)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def settings(secure_kafka) -> KafkaSettings:
    return secure_kafka.client_settings("trainer")


def new_topic(settings: KafkaSettings) -> str:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {name: 4, f"{name}.dlq": 1})
    return name


def assert_no_secret(where: str, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    for secret in SECRETS:
        assert secret.encode() not in data, f"a secret appears in {where}"


def failed_logins(broker: EmbeddedKafka) -> int:
    # The broker logs one line per refused SCRAM exchange: the count of attempts, server-side.
    return broker.log_file.read_text(errors="replace").count("due to invalid credentials")


def test_the_listener_is_sasl_ssl_only(secure_kafka, settings):
    assert settings.security_protocol == "SASL_SSL" and settings.ssl_cafile
    props = (secure_kafka.data_dir / "server.properties").read_text()
    assert f"advertised.listeners=SASL_SSL://127.0.0.1:{secure_kafka.port}" in props
    assert "inter.broker.listener.name=SASL_SSL" in props
    assert oct(os.stat(secure_kafka.data_dir / "server.properties").st_mode & 0o777) == "0o600"
    with pytest.raises(KafkaUnavailable):  # a PLAINTEXT client gets nothing from a TLS port
        require_broker(KafkaSettings(bootstrap=secure_kafka.bootstrap), timeout=1.0)


def test_generator_reader_dead_letters_and_admin_over_sasl_ssl(secure_kafka, settings):
    topic = new_topic(settings)
    produced = run_load(settings.bootstrap, topic, partitions=4, count=3_000, bad_fraction=0.05, seed=11,
                        producer_config=settings.confluent())
    messages = read_topic(settings, topic)  # streamlearn's RangeReader (confluent-kafka) over SASL_SSL
    assert len(messages) == 3_000
    assert {p: n for p, n in produced["per_partition"].items() if n} == \
        {p: sum(m.partition == p for m in messages) for p in {m.partition for m in messages}}
    expected = expected_learning(messages)
    assert expected["dead_lettered"] == produced["bad"] == 150

    letters = DeadLetters(settings, f"{topic}.dlq", topic)
    bad = decode(messages, TRANSACTION).bad
    for message, reason in bad:
        letters.send(message, reason)
    letters.flush()
    assert letters.written == {0: 150}  # from the delivery reports
    again = DeadLetters(settings, f"{topic}.dlq", topic)  # a replay's scan of what is already written
    assert again.skip_written_since({}) == 150 and again.end_at_start == {0: 150}
    again.close()
    keys = dead_letter_keys(settings, f"{topic}.dlq")
    assert sorted(keys) == sorted(dead_letter_key(topic, m.partition, m.offset) for m, _ in bad)
    assert end_offsets(settings, topic) == {p: produced["per_partition"][p] for p in range(4)}  # kafka-python
    assert committed_offsets(settings, "nobody", topic) == {}


def test_wrong_password_fails_fast_and_once(secure_kafka):
    wrong = secure_kafka.client_settings("trainer", SecretStr(WRONG_PASSWORD))
    before = failed_logins(secure_kafka)
    for attempt in (lambda: require_broker(wrong), lambda: ensure_topics(wrong, {"never-made": 1})):
        started = time.monotonic()
        with pytest.raises(ConfigError, match="authentication failed") as caught:
            attempt()
        assert time.monotonic() - started < 5.0, "the client retried instead of giving up on bad credentials"
        message = str(caught.value)
        assert "'trainer'" in message and "SCRAM-SHA-512" in message and "SASL_PASSWORD" in message
        assert_no_secret("the error message", message)
    time.sleep(3.0)  # a client that kept retrying in the background would keep adding lines
    refused = failed_logins(secure_kafka) - before
    assert 2 <= refused <= 4, f"{refused} failed logins for 2 attempts: a retry storm"


def test_an_unknown_user_fails_fast_and_is_named(secure_kafka):
    """A user the broker never heard of is refused like a wrong password: at once, naming the user,
    not after librdkafka's reconnects (SCRAM does not tell the two apart, and neither may we)."""
    stranger = secure_kafka.client_settings("mallory", SecretStr(WRONG_PASSWORD))
    before = failed_logins(secure_kafka)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="authentication failed") as caught:
        require_broker(stranger)
    assert time.monotonic() - started < 5.0, "the client retried instead of giving up on an unknown user"
    assert "'mallory'" in str(caught.value) and "SCRAM-SHA-512" in str(caught.value)
    assert_no_secret("the error message", str(caught.value))
    time.sleep(3.0)
    assert 1 <= failed_logins(secure_kafka) - before <= 2, "a retry storm for one attempt"


def test_certificate_from_another_ca_is_refused(secure_kafka, tmp_path):
    stranger = make_tls(tmp_path / "other-ca")["ca"]
    untrusting = secure_kafka.client_settings("trainer").model_copy(update={"ssl_cafile": str(stranger)})
    with pytest.raises(ConfigError, match="TLS handshake failed"):
        require_broker(untrusting)


def run_cli(settings: KafkaSettings, *args: str, password: str) -> subprocess.CompletedProcess:
    """The CLI configured only by env, as an operator would run it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "STREAMLEARN_LOG_LEVEL": "debug",
           "STREAMLEARN_KAFKA_BOOTSTRAP": settings.bootstrap, "STREAMLEARN_KAFKA_SSL_CAFILE": settings.ssl_cafile,
           "STREAMLEARN_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "STREAMLEARN_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "STREAMLEARN_KAFKA_SASL_USERNAME": "trainer", "STREAMLEARN_KAFKA_SASL_PASSWORD": password}
    return subprocess.run([sys.executable, "-m", "streamlearn.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_uses_env_secrets_and_never_prints_them(settings):
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    made = run_cli(settings, "topics", "create", topic, password=PASSWORD)
    loaded = run_cli(settings, "load", "--topic", topic, "--count", "2000", "--bad-fraction", "0.05", "--quiet",
                     password=PASSWORD)
    status = run_cli(settings, "kafka", "status", password=PASSWORD)
    refused = run_cli(settings, "topics", "create", f"{topic}-x", password=WRONG_PASSWORD)
    assert made.returncode == 0, made.stderr
    assert loaded.returncode == 0 and '"events": 2000' in loaded.stdout, loaded.stderr
    assert status.returncode == 0 and settings.bootstrap in status.stdout, status.stderr
    assert refused.returncode == 2 and "authentication failed" in refused.stderr
    assert "Traceback" not in refused.stderr  # one line saying what to fix, not a stack
    for name, done in {"topics create": made, "load": loaded, "kafka status": status, "refused": refused}.items():
        assert_no_secret(f"`streamlearn {name}` output", done.stdout + done.stderr)


def test_training_over_sasl_ssl_learns_exactly_once_and_leaks_nothing(secure_kafka, settings, ray_cluster,
                                                                     tmp_path, capfd):
    from .test_training import assert_exactly_once, config

    topic = new_topic(settings)
    run_load(settings.bootstrap, topic, partitions=4, count=6_000, bad_fraction=0.05, seed=12,
             producer_config=settings.confluent())
    cfg = config(tmp_path, topic, until_idle_s=1.0)
    summary = train(cfg, settings)
    assert summary["events_learned"] == 5_700 and summary["dead_lettered"] == 300
    assert_exactly_once(settings, cfg)  # offsets, fingerprint, dead letters, commits: all over SASL_SSL
    assert expected_learning(read_topic(settings, topic))["learned"] == 5_700

    out, err = capfd.readouterr()
    assert_no_secret("the driver's stdout/stderr", out + err)
    session = Path(ray_cluster.address_info["session_dir"])
    for root in (session / "logs", Path(cfg.checkpoint_dir)):
        files = [p for p in root.rglob("*") if p.is_file()]
        assert files, f"nothing to check under {root}"
        for path in files:
            assert_no_secret(str(path), path.read_bytes())
    assert_no_secret("checkpoint meta", (ckpt.newest(run_dir(cfg)) / "meta.json").read_text())


@pytest.fixture
def scorer(tmp_path):
    from fastapi.testclient import TestClient

    from streamlearn.serve.app import local_app
    from streamlearn.serve.config import ServeConfig

    cfg = ServeConfig(checkpoint_dir=str(tmp_path), pipeline="fraud", poll_interval_s=0.2,
                      auth_token=SecretStr(TOKEN))
    with TestClient(local_app(cfg)) as client:
        yield cfg, client


def test_scoring_token_required_and_never_echoed(scorer, capfd):
    cfg, client = scorer
    write_checkpoint(cfg.run_dir, 1)
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/score", json=EVENT).status_code == 401
    wrong = client.post("/score", json=EVENT, headers={"Authorization": f"Bearer {WRONG_PASSWORD}"})
    assert wrong.status_code == 401 and "bearer token" in wrong.json()["detail"]
    assert wrong.headers["www-authenticate"] == "Bearer"
    assert client.get("/model").status_code == 401
    deadline = time.monotonic() + 5
    while client.post("/score", json=EVENT, headers=right).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    scored = client.post("/score", json=EVENT, headers=right)
    assert scored.status_code == 200 and scored.json()["version"] == 1
    health = client.get("/healthz")  # open: probes carry no token
    assert health.status_code == 200 and health.json()["ready"] is True
    model = client.get("/model", headers=right)
    assert model.status_code == 200
    for name, response in {"/model": model, "/healthz": health, "/score": scored, "401": wrong}.items():
        assert_no_secret(f"the {name} response", response.text + str(response.headers))
    out, err = capfd.readouterr()
    assert_no_secret("the scorer's logs", out + err)


def test_scorer_refuses_a_tampered_checkpoint(scorer):
    cfg, client = scorer
    right = {"Authorization": f"Bearer {TOKEN}"}
    tampered = write_checkpoint(cfg.run_dir, 1, tamper=True)
    time.sleep(0.6)  # three polls
    refused = client.post("/score", json=EVENT, headers=right)
    assert refused.status_code == 503 and client.get("/healthz").json()["ready"] is False
    with pytest.raises(Exception, match="checksum"):
        ckpt.load(tampered)  # the training side's restore path refuses it too
    write_checkpoint(cfg.run_dir, 2)
    deadline = time.monotonic() + 5
    while client.post("/score", json=EVENT, headers=right).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.post("/score", json=EVENT, headers=right).json()["version"] == 2
