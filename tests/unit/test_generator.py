import random
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

import streamlearn.loadgen.generator as generator
from pipelines.banking import (
    CHANNELS,
    COUNTRIES,
    CURRENCIES,
    MERCHANT_CATEGORIES,
    TRANSACTION,
    column,
    hour_of_day,
    one_hot,
)
from streamlearn.errors import BadEvent, ConfigError, KafkaUnavailable
from streamlearn.loadgen.generator import (
    MALFORMED_KINDS,
    BankingSimulator,
    encode_batch,
    malformed_message,
    partition_for,
    run_load,
)
from streamlearn.loadgen.profiles import Constant
from streamlearn.schema import reason_code

DRIFT_AT = 40_000


@pytest.fixture(scope="module")
def drifting() -> list[dict]:
    return BankingSimulator(seed=3, drift_at=DRIFT_AT).events(2 * DRIFT_AT)


def test_same_seed_same_events_however_sliced():
    whole = BankingSimulator(seed=7).events(6000)
    sliced = BankingSimulator(seed=7)
    assert sliced.events(1) + sliced.events(4999) + sliced.events(1000) == whole
    assert BankingSimulator(seed=8).events(100) != whole[:100]


def test_events_validate_and_encode_to_the_same_json(drifting):
    sample = drifting[:20_000]
    for event, raw in zip(sample, encode_batch(sample), strict=True):
        assert TRANSACTION.decode(raw) == event
    assert len({e["event_id"] for e in drifting}) == len(drifting)
    assert np.all(np.diff(column(drifting, "event_time", np.int64)) > 0)
    assert all(e["amount"] > 0 for e in sample)


def test_fraud_rate_is_low_but_present(drifting):
    assert 0.01 <= np.mean(column(drifting[:50_000], "is_fraud")) <= 0.03
    no_drift = BankingSimulator(seed=4).events(50_000)
    assert 0.01 <= np.mean(column(no_drift, "is_fraud")) <= 0.03


def _fraud_rate(events: list[dict], where) -> float:
    chosen = [e["is_fraud"] for e in events if where(e)]
    assert len(chosen) > 200, "too few events to compare rates"
    return float(np.mean(chosen))


def test_drift_changes_which_events_are_fraud(drifting):
    before, after = drifting[:DRIFT_AT], drifting[DRIFT_AT:]

    def online_abroad(e):
        return e["channel"] == "ecom" and not e["card_present"] and e["merchant_country"] in ("NG", "RU", "BR")

    def cash_or_crypto(e):
        return e["merchant_category"] in ("cash", "crypto", "gaming")

    assert _fraud_rate(before, online_abroad) > 0.3
    assert _fraud_rate(after, online_abroad) < 0.05
    assert _fraud_rate(before, cash_or_crypto) < 0.05
    assert _fraud_rate(after, cash_or_crypto) > 4 * _fraud_rate(before, cash_or_crypto)


def _features(events: list[dict]) -> np.ndarray:
    numeric = np.stack([np.log1p(column(events, "amount")), hour_of_day(events), column(events, "customer_age"),
                        column(events, "account_tenure_days"), column(events, "card_present")], axis=1)
    numeric = (numeric - numeric.mean(0)) / (numeric.std(0) + 1e-6)
    onehots = [one_hot([e[name] for e in events], vocab) for name, vocab in (
        ("channel", CHANNELS), ("merchant_category", MERCHANT_CATEGORIES),
        ("merchant_country", COUNTRIES), ("currency", CURRENCIES))]
    return np.hstack([numeric, *onehots, np.ones((len(events), 1))]).astype(np.float64)


def _logistic_regression(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Newton steps with a little ridge converge in a handful. einsum, not `@`: multithreaded
    # BLAS stalls for seconds on a busy 2-core machine, einsum's single-threaded loop never does.
    w = np.zeros(x.shape[1])
    for _ in range(8):
        p = 1 / (1 + np.exp(-np.einsum("ni,i->n", x, w)))
        hessian = np.einsum("ni,n,nj->ij", x, p * (1 - p), x) + 1e-2 * np.eye(x.shape[1])
        w -= np.linalg.solve(hessian, np.einsum("ni,n->i", x, p - y) + 1e-2 * w)
    return w


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(score)) + 1
    pos = y.sum()
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos)))


def test_each_regime_is_learnable_and_the_drift_hurts_an_old_model(drifting):
    models, held_out = [], []
    for regime in (drifting[:DRIFT_AT], drifting[DRIFT_AT:]):
        x, y = _features(regime), column(regime, "is_fraud", np.float64)
        w = _logistic_regression(x[:25_000], y[:25_000])
        assert _auc(np.einsum("ni,i->n", x[25_000:], w), y[25_000:]) > 0.85
        models.append(w)
        held_out.append((x[25_000:], y[25_000:]))
    x_after, y_after = held_out[1]
    old, new = (_auc(np.einsum("ni,i->n", x_after, w), y_after) for w in models)
    assert old < new - 0.1


def test_amount_follows_category_and_age(drifting):
    legit = [e for e in drifting[:DRIFT_AT] if not e["is_fraud"]]
    def median_amount(category: str) -> float:
        return float(np.median([e["amount"] for e in legit if e["merchant_category"] == category]))

    assert median_amount("travel") > 5 * median_amount("grocery")
    age, amount = column(legit, "customer_age"), np.log(column(legit, "amount"))
    assert np.corrcoef(age, amount)[0, 1] > 0.05


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
@pytest.mark.parametrize("rng", [random.Random(5), np.random.default_rng(5)], ids=["random", "numpy"])
def test_every_malformed_kind_is_rejected_with_its_code(kind, rng):
    first = MALFORMED_KINDS.index(kind)
    for seq in range(first, first + 40 * len(MALFORMED_KINDS), len(MALFORMED_KINDS)):  # many variants per kind
        raw, code = malformed_message(rng, seq)
        assert code == kind
        with pytest.raises(BadEvent) as e:
            TRANSACTION.decode(raw)
        assert reason_code(e.value.reason) == kind, (raw[:200], e.value.reason)


def test_malformed_kinds_cover_every_reason_code_in_turn():
    codes = [malformed_message(random.Random(0), seq)[1] for seq in range(len(MALFORMED_KINDS))]
    assert codes == list(MALFORMED_KINDS)


def test_partition_for_is_crc32_and_stable():
    assert partition_for(b"cust-000042", 8) == zlib.crc32(b"cust-000042") % 8 == 2
    assert {partition_for(f"cust-{i:06d}".encode(), 4) for i in range(100)} == {0, 1, 2, 3}


class _StubProducer:
    """Stands in for confluent_kafka.Producer to check run_load's bookkeeping without a broker."""

    def __init__(self, config: dict):
        self.config, self.sent, self.calls, self.unsent = config, [], 0, 0
        self.offsets: dict[tuple[str, int], int] = {}  # the broker's next offset per topic partition
        self.stamps: list[int | None] = []  # each message's Kafka timestamp (ms), None: the broker's clock

    def list_topics(self, topic, timeout):
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(4)))})

    def produce(self, topic, value, key, partition, on_delivery=None, timestamp=None):
        self.calls += 1
        if self.calls % 500 == 0:
            raise BufferError("queue full")  # run_load must retry, not drop
        self.sent.append((key, value, partition))
        self.stamps.append(timestamp)
        offset = self.offsets[topic, partition] = self.offsets.get((topic, partition), -1) + 1
        if on_delivery is not None:  # acknowledged at once
            on_delivery(None, SimpleNamespace(offset=lambda: offset))

    def poll(self, timeout):
        return 0

    def flush(self, timeout):
        return self.unsent


@pytest.fixture
def stub(monkeypatch) -> list[_StubProducer]:
    made: list[_StubProducer] = []

    def make(config: dict) -> _StubProducer:
        made.append(_StubProducer(config))
        return made[-1]

    monkeypatch.setattr(generator, "Producer", make)
    return made


def test_run_load_counts_every_event_and_bad_message(stub):
    summary = run_load("localhost:1", "tx", partitions=4, count=5000, bad_fraction=0.02, seed=1)
    producer = stub[0]
    assert summary["events"] == len(producer.sent) == 5000
    assert (summary["bad"], summary["valid"]) == (100, 4900)
    assert sum(summary["bad_by_reason"].values()) == 100 and set(summary["bad_by_reason"]) == set(MALFORMED_KINDS)
    assert all(partition == partition_for(key, 4) for key, _, partition in producer.sent)
    assert summary["per_partition"] == {p: sum(1 for *_, q in producer.sent if q == p) for p in range(4)}
    assert producer.config["acks"] == "all" and producer.config["enable.idempotence"] is True


def test_run_load_paces_to_the_profile(stub):
    summary = run_load("localhost:1", "tx", partitions=4, profile=Constant(2000), duration=0.5)
    assert 700 <= summary["events"] <= 1000  # never above rate x duration; a busy CI host may fall short


def test_the_pacer_sends_slices_not_single_events():
    """At 2,000 events/s the pacer wakes for a slice (10 ms, 20 events) at a time and never waits
    under 1 ms: per event, and polling librdkafka for 0.3 ms (its poll(0)), the loop took a whole
    core (load/bench/pacing.py). Walked in 0.1 ms steps through one second."""
    pacer = generator._Pacer(Constant(2000))
    taken = [n for n in (pacer.take(step / 10_000) for step in range(1, 10_001)) if n]
    assert 1960 <= sum(taken) <= 2000
    assert len(taken) <= 101 and min(taken) >= 20
    assert 0 < pacer.wait_s(1.0) <= generator._SLICE_S
    pacer._tokens = 19.99  # a wait under 1 ms would be librdkafka's poll(0): the loop spun on it
    assert pacer.wait_s(1.0) >= 0.001
    slow = generator._Pacer(Constant(5))  # below one event a slice, one event is worth waking for
    assert 4 <= sum(slow.take(step / 100) for step in range(1, 101)) <= 5  # float sums: 4.999...


def test_run_load_fails_loudly_when_events_stay_unacknowledged(stub, monkeypatch):
    monkeypatch.setattr(_StubProducer, "flush", lambda self, timeout: 7)
    with pytest.raises(KafkaUnavailable, match="7 event"):
        run_load("localhost:1", "tx", partitions=4, count=100)


@pytest.mark.parametrize("kwargs", [
    {}, {"count": 10, "bad_fraction": 1.0}, {"duration": 0}, {"count": 10, "partitions": 0},
])
def test_run_load_rejects_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        run_load("localhost:1", "tx", **{"partitions": 4, **kwargs})
