"""Simulated banking transactions with a learnable, drifting fraud signal, produced to Kafka.

Customers are fixed at construction (age, tenure, home country, usual currency, preferred
categories and channels), so amounts and habits are consistent per customer. Fraud is
rare (~1.6%) and follows one pattern before `drift_at` and a clearly different one after
it, so online learning has something to lose and to relearn. Events come out in fixed
chunks of vectorised numpy draws: the sequence depends only on the seed, never on how
callers slice it, and generation plus encoding stays far above what Kafka can take.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from contextlib import nullcontext
from typing import Any

import numpy as np
from confluent_kafka import KafkaException, Producer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from pipelines.banking import CHANNELS, COUNTRIES, CURRENCIES, MERCHANT_CATEGORIES
from streamlearn.errors import ConfigError, KafkaUnavailable
from streamlearn.loadgen.labels import LABELS_SUFFIX, LabelPlan, LabelQueue
from streamlearn.loadgen.profiles import Constant, Profile

BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00Z: a fixed origin keeps runs reproducible
MS_PER_EVENT = 4_000  # a simulated day is 21,600 events, so any sample of a few thousand sees night and day
_CHUNK = 4096
_HOUR_MS = 3_600_000


def _cumulative(vocabulary: tuple[str, ...], **weights: float) -> np.ndarray:
    p = np.array([weights.get(v, 0.0) for v in vocabulary], dtype=np.float64)
    cum = np.cumsum(p / p.sum())
    cum[-1] = 1.0  # rounding must never let a uniform draw fall past the last entry
    return cum


def _draw(rng: np.random.Generator, cum: np.ndarray, size) -> np.ndarray:
    return np.searchsorted(cum, rng.random(size), side="right")


def _index(vocabulary: tuple[str, ...], *names: str) -> np.ndarray:
    return np.array([vocabulary.index(n) for n in names])


# Legitimate spending habits.
_CAT_LEGIT = _cumulative(MERCHANT_CATEGORIES, grocery=22, restaurant=16, travel=4, electronics=5, fuel=12,
                         fashion=9, gaming=3, crypto=1.5, utilities=8, health=6, cash=8, transfer=5.5)
_CHAN_LEGIT = _cumulative(CHANNELS, pos=55, ecom=25, mobile=20)  # ATM only ever serves cash
_HOME = _cumulative(COUNTRIES, DE=22, FR=15, NL=8, ES=10, IT=10, GB=12, US=8, PL=6, CH=3, SE=3,
                    NG=1, RU=1, CN=0.5, BR=0.5)
_SAFE = _index(COUNTRIES, "DE", "FR", "NL", "ES", "IT", "GB", "US", "PL", "CH", "SE", "CN")
_HIGH_RISK = _index(COUNTRIES, "NG", "RU", "BR")
_USUAL_CURRENCY = np.array([CURRENCIES.index(c) for c in (
    "EUR", "EUR", "EUR", "EUR", "EUR", "GBP", "USD", "PLN", "CHF", "SEK", "USD", "USD", "USD", "USD")])
_CATEGORY_MEAN = np.array([45, 35, 420, 310, 60, 85, 25, 250, 110, 70, 150, 600], dtype=np.float64)
_CASH, _USD = MERCHANT_CATEGORIES.index("cash"), CURRENCIES.index("USD")
_ATM, _POS, _MOBILE = _index(CHANNELS, "atm", "pos", "mobile")

# Fraud before the drift: card-not-present online fraud abroad, big tickets, at night.
_CAT_FRAUD_PRE = _cumulative(MERCHANT_CATEGORIES, electronics=35, travel=20, fashion=15, gaming=8, crypto=4,
                             grocery=6, restaurant=4, transfer=8)
_CHAN_FRAUD_PRE = _cumulative(CHANNELS, ecom=80, mobile=15, pos=5)
# Fraud after it: cash-outs at ATMs and crypto/gaming from freshly opened accounts, in daytime.
_CAT_FRAUD_POST = _cumulative(MERCHANT_CATEGORIES, cash=50, crypto=30, gaming=20)
_CHAN_FRAUD_POST = _cumulative(CHANNELS, mobile=60, ecom=40)
_NIGHT = np.isin(np.arange(24), np.arange(0, 6))
_DAY = np.isin(np.arange(24), np.arange(9, 18))
_P_FRAUD_PRE = np.where(_NIGHT, 0.04, 0.008)
_P_FRAUD_POST = np.where(_DAY, 0.035, 0.006)
_CAMOUFLAGED = 0.1  # share of frauds that look like the customer's normal spending: keeps AUC below 1
_YOUNG_ACCOUNT_DAYS = 120

_KEYS = ("event_id", "event_time", "customer_id", "amount", "currency", "merchant_category",
         "merchant_country", "channel", "card_present", "customer_age", "account_tenure_days", "is_fraud")
_BOOL = ("false", "true")
# Object arrays turn index arrays into lists of the vocabulary's own str objects in one C call.
_NAMES = {name: np.array(vocabulary, dtype=object) for name, vocabulary in (
    ("currency", CURRENCIES), ("category", MERCHANT_CATEGORIES), ("country", COUNTRIES), ("channel", CHANNELS))}


class BankingSimulator:
    """A deterministic stream of banking transactions for `seed`; see the module docstring."""

    def __init__(self, seed: int, n_customers: int = 10_000, drift_at: int | None = None):
        if n_customers < 1:
            raise ConfigError(f"n_customers must be at least 1, got {n_customers}")
        if drift_at is not None and drift_at < 0:
            raise ConfigError(f"drift_at is an event index >= 0 (or None for no drift), got {drift_at}")
        self.seed, self.drift_at = seed, drift_at
        rng = self._rng = np.random.default_rng(seed)
        self.customer_ids = np.array([f"cust-{i:06d}" for i in range(n_customers)], dtype=object)
        self.age = np.clip(rng.normal(42, 14, n_customers), 18, 95).astype(np.int64)
        # No account is older than its holder's adult life.
        self.tenure = np.minimum(rng.exponential(1500, n_customers), (self.age - 18) * 365 + 30).astype(np.int64)
        self.home = _draw(rng, _HOME, n_customers)
        self.currency = _USUAL_CURRENCY[self.home]
        self.pref_category = _draw(rng, _CAT_LEGIT, (n_customers, 3))
        self.pref_channel = _draw(rng, _CHAN_LEGIT, (n_customers, 2))
        activity = rng.lognormal(0.0, 1.0, n_customers)  # a few customers transact far more than most
        self._activity = np.cumsum(activity / activity.sum())
        self._activity[-1] = 1.0
        young = np.flatnonzero(self.tenure < _YOUNG_ACCOUNT_DAYS)
        self._young = young if len(young) else np.arange(n_customers)
        self._next = 0
        self._buffer: list[dict[str, Any]] = []

    def events(self, n: int) -> list[dict[str, Any]]:
        """The next `n` events, as dicts that validate against pipelines.banking.TRANSACTION."""
        while len(self._buffer) < n:
            self._buffer.extend(self._chunk())
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _chunk(self) -> list[dict[str, Any]]:
        rng, n, first = self._rng, _CHUNK, self._next
        self._next += n
        index = np.arange(first, first + n)
        # Jitter below one step keeps event times strictly increasing.
        times = BASE_TIME_MS + index * MS_PER_EVENT + rng.integers(0, MS_PER_EVENT, n)
        hour = times // _HOUR_MS % 24
        post = index >= self.drift_at if self.drift_at is not None else np.zeros(n, dtype=bool)
        fraud = rng.random(n) < np.where(post, _P_FRAUD_POST[hour], _P_FRAUD_PRE[hour])

        # Everyone first behaves like the customer usually does ...
        cust = np.searchsorted(self._activity, rng.random(n), side="right")
        pick = rng.random((4, n))
        cat = np.where(pick[0] < 0.85, self.pref_category[cust, rng.integers(0, 3, n)], _draw(rng, _CAT_LEGIT, n))
        chan = np.where(pick[1] < 0.85, self.pref_channel[cust, rng.integers(0, 2, n)], _draw(rng, _CHAN_LEGIT, n))
        country = np.where(pick[2] < 0.9, self.home[cust],
                           np.where(pick[2] < 0.985, rng.choice(_SAFE, n), rng.choice(_HIGH_RISK, n)))
        currency = np.where(pick[3] < 0.92, self.currency[cust], rng.integers(0, len(CURRENCIES), n))
        boost = np.ones(n)

        # ... then fraudsters overwrite what their pattern dictates.
        pattern = fraud & (rng.random(n) >= _CAMOUFLAGED)
        pre = np.flatnonzero(pattern & ~post)
        k = len(pre)
        cat[pre] = _draw(rng, _CAT_FRAUD_PRE, k)
        chan[pre] = _draw(rng, _CHAN_FRAUD_PRE, k)
        u = rng.random(k)
        country[pre] = np.where(u < 0.6, rng.choice(_HIGH_RISK, k),
                                np.where(u < 0.9, rng.choice(_SAFE, k), country[pre]))
        currency[pre] = np.where(rng.random(k) < 0.4, _USD, currency[pre])
        boost[pre] = rng.lognormal(np.log(3.5), 0.5, k)

        postf = np.flatnonzero(pattern & post)
        k = len(postf)
        cust[postf] = np.where(rng.random(k) < 0.85, rng.choice(self._young, k), cust[postf])
        cat[postf] = _draw(rng, _CAT_FRAUD_POST, k)
        chan[postf] = _draw(rng, _CHAN_FRAUD_POST, k)
        country[postf] = np.where(rng.random(k) < 0.8, self.home[cust[postf]], rng.choice(_SAFE, k))
        currency[postf] = self.currency[cust[postf]]
        boost[postf] = rng.lognormal(np.log(1.8), 0.4, k)

        chan[cat == _CASH] = _ATM  # cash only comes out of ATMs, and ATMs only give cash
        card_present = np.where(chan == _POS, rng.random(n) < 0.97,
                                (chan == _ATM) | ((chan == _MOBILE) & (rng.random(n) < 0.15)))
        age = self.age[cust]
        # Amount follows the category and grows with age: the regression pipeline's target.
        amount = _CATEGORY_MEAN[cat] * (0.6 + 0.012 * (age - 18)) * rng.lognormal(0.0, 0.35, n) * boost
        amount = np.maximum(np.round(amount, 2), 0.01)

        ids = [f"{self.seed}-{i}" for i in range(first, first + n)]
        columns = (ids, times.tolist(), self.customer_ids[cust].tolist(), amount.tolist(),
                   _NAMES["currency"][currency].tolist(), _NAMES["category"][cat].tolist(),
                   _NAMES["country"][country].tolist(), _NAMES["channel"][chan].tolist(),
                   card_present.tolist(), age.tolist(), self.tenure[cust].tolist(), fraud.tolist())
        return [dict(zip(_KEYS, row, strict=True)) for row in zip(*columns, strict=True)]


def encode_batch(events: list[dict[str, Any]], with_label: bool = True) -> list[bytes]:
    """Compact JSON, ~4x faster than json.dumps; without `is_fraud` when its label comes later
    (streamlearn/loadgen/labels.py).

    Only for events shaped like BankingSimulator's: its strings never need JSON escaping.
    """
    return [(f'{{"event_id":"{e["event_id"]}","event_time":{e["event_time"]},"customer_id":"{e["customer_id"]}",'
             f'"amount":{e["amount"]!r},"currency":"{e["currency"]}","merchant_category":"{e["merchant_category"]}",'
             f'"merchant_country":"{e["merchant_country"]}","channel":"{e["channel"]}",'
             f'"card_present":{_BOOL[e["card_present"]]},"customer_age":{e["customer_age"]},'
             f'"account_tenure_days":{e["account_tenure_days"]}'
             + (f',"is_fraud":{_BOOL[e["is_fraud"]]}}}' if with_label else '}')).encode()
            for e in events]


def partition_for(key: bytes, partitions: int) -> int:
    """The partition run_load sends a key to: explicit, so tests know where every event went."""
    return zlib.crc32(key) % partitions


def bench_generation(n: int = 200_000, seed: int = 0) -> float:
    """Events/s of generating plus encoding on this core, without Kafka."""
    sim = BankingSimulator(seed)
    start = time.perf_counter()
    for done in range(0, n, 10_000):
        encode_batch(sim.events(min(10_000, n - done)))
    return n / (time.perf_counter() - start)


# --- malformed messages: one per reason code of streamlearn.schema, in turn --------------

MALFORMED_KINDS = ("empty", "oversized", "undecodable", "not_json", "not_object", "missing_field",
                   "wrong_type", "not_finite", "out_of_range", "unknown_value", "too_long")
_PLACEHOLDER = "@@raw@@"
_DEEP = 40  # nested containers where a scalar belongs; deeper than any real event, far below parser limits
_FIELD_BREAKS = {  # code -> (field, raw JSON that breaks it)
    "wrong_type": (("amount", '"12.50"'), ("customer_age", "33.5"), ("card_present", '"yes"'), ("is_fraud", "0"),
                   ("event_time", '"2026-01-01T00:00:00Z"'), ("customer_id", "12345"), ("currency", '["EUR"]'),
                   ("amount", "[" * _DEEP + "1" + "]" * _DEEP), ("merchant_country", '{"code": {"iso": ["DE"]}}'),
                   # beyond 64 bits an integer parses as a float, which is no age
                   ("customer_age", str(10**20)), ("channel", "true")),
    # Python's json accepts NaN/Infinity literals and turns 1e400 into inf: validation must catch all.
    "not_finite": (("amount", "NaN"), ("amount", "Infinity"), ("amount", "-Infinity"), ("amount", "1e400"),
                   ("amount", "1" + "0" * 400)),
    "out_of_range": (("amount", str(10**30)), ("amount", "-5.0"), ("customer_age", "7"), ("customer_age", "150"),
                     ("account_tenure_days", "-1"), ("event_time", "-1"), ("amount", "1e308"),
                     ("event_time", str(2**63)), ("account_tenure_days", str(2**62))),
    "unknown_value": (("currency", '"XYZ"'), ("channel", '"telepathy"'), ("merchant_country", '"ZZ"'),
                      ("merchant_category", '"lottery"')),
}


def _pick(rng: random.Random | np.random.Generator, n: int) -> int:
    return int(rng.integers(n)) if isinstance(rng, np.random.Generator) else rng.randrange(n)


def _random_bytes(rng: random.Random | np.random.Generator, n: int) -> bytes:
    return rng.bytes(n) if isinstance(rng, np.random.Generator) else rng.randbytes(n)


def _valid_event(seq: int, run: int = 0) -> dict[str, Any]:
    return {"event_id": f"bad-{run}-{seq}", "event_time": BASE_TIME_MS + seq, "customer_id": f"cust-{seq % 10_000:06d}",
            "amount": 42.5, "currency": "EUR", "merchant_category": "grocery", "merchant_country": "DE",
            "channel": "pos", "card_present": True, "customer_age": 40, "account_tenure_days": 900, "is_fraud": False}


def _dumps(event: dict[str, Any], name: str | None = None, raw_json: str | None = None) -> bytes:
    """The event as JSON, with `name` dropped, or its value replaced by literal JSON text (NaN, 1e400)."""
    if raw_json is None:
        return json.dumps({k: v for k, v in event.items() if k != name}, separators=(",", ":")).encode()
    text = json.dumps({**event, name: _PLACEHOLDER}, separators=(",", ":"))
    return text.replace(f'"{_PLACEHOLDER}"', raw_json).encode()


def malformed_message(rng: random.Random | np.random.Generator, seq: int, run: int = 0) -> tuple[bytes, str]:
    """The `seq`-th bad message and the reason code TRANSACTION.decode must give it.

    Codes cycle with `seq`, so any 11 consecutive messages cover every kind; `rng` picks
    the variant within a kind.
    """
    code = MALFORMED_KINDS[seq % len(MALFORMED_KINDS)]
    # Some bad messages are valid to a schema without the label (a dropped or mistyped `is_fraud`):
    # their ids must differ between runs (`run`: the generator's seed) as real ids do, or a
    # joined-label trainer rightly refuses the second "bad-6" as a duplicate of the first.
    event = _valid_event(seq, run)
    text = _dumps(event)
    if code == "empty":
        return b"", code
    if code == "oversized":
        return _dumps(event, "memo", '"' + "x" * (4096 + _pick(rng, 2048)) + '"'), code
    if code == "undecodable":
        if _pick(rng, 2):  # a Latin-1 producer: valid JSON, invalid UTF-8
            return json.dumps({**event, "customer_id": "M\u00fcller"}, ensure_ascii=False).encode("latin-1"), code
        # Leading continuation bytes: no BOM and no NUL, so json sniffs UTF-8 and fails to decode.
        return bytes(0x80 + _pick(rng, 64) for _ in range(4)) + _random_bytes(rng, 8 + _pick(rng, 200)), code
    if code == "not_json":
        variants = (text[:1 + _pick(rng, len(text) - 1)], repr(event).encode(), b'{"amount": 1,}', b"hello kafka",
                    b'{"amount":' + b"[" * 1100 + b"]" * 1100 + b"}",  # past the parser's depth limit
                    text.replace(b'"grocery"', b'"\\ud800"'),  # a lone surrogate: no valid string
                    bytes(_pick(rng, 32) for _ in range(1 + _pick(rng, 64))),  # control-character noise
                    text + b"\x00")
        return variants[_pick(rng, len(variants))], code
    if code == "not_object":
        variants = (b"[" + text + b"]", b'"an event"', b"42", b"null", b"true")
        return variants[_pick(rng, len(variants))], code
    if code == "missing_field":
        name = _KEYS[_pick(rng, len(_KEYS))]
        if _pick(rng, 3) == 0:  # renamed rather than dropped: an unknown field does not stand in for it
            event = {**event, "x_" + name: event[name]}
        return _dumps(event, name, "null" if _pick(rng, 2) else None), code  # null counts as absent
    if code == "too_long":
        name = ("customer_id", "event_id", "currency")[_pick(rng, 3)]
        return _dumps(event, name, '"' + "x" * (200 + _pick(rng, 1000)) + '"'), code
    name, raw = _FIELD_BREAKS[code][_pick(rng, len(_FIELD_BREAKS[code]))]
    return _dumps(event, name, raw), code


# --- producing to Kafka ----------------------------------------------------------------

_PRODUCER_DEFAULTS = {
    "linger.ms": 5,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 500_000,
    # These events compress ~5x with lz4 at ~0.5 µs each (~10% of generating one), so the
    # broker writes and serves a fifth of the bytes (measured with pyarrow's lz4 on 1k-event batches).
    "compression.type": "lz4",
    "acks": "all",
    "enable.idempotence": True,
    "delivery.timeout.ms": 30_000,  # a dead broker surfaces as failures within 30 s, not 5 min
    "delivery.report.only.error": True,  # no per-message Python callback on the happy path
}
_SLICE_S = 0.01
_BURST_S = 0.1  # a stalled producer catches up at most this much, rather than flooding after a pause
_MAX_BATCH = 4096
# librdkafka's poll counts whole milliseconds: a shorter wait is poll(0), and the pacing loop spun
# (a whole core at any rate, load/bench/pacing.py)
_POLL_MIN_S = 0.001


class _Pacer:
    """Token bucket refilled at the profile's current rate; None or constant 0 is unthrottled."""

    def __init__(self, profile: Profile | None):
        unthrottled = profile is None or (isinstance(profile, Constant) and profile.rate == 0)
        self.profile = None if unthrottled else profile
        self._tokens, self._last = 0.0, 0.0

    def take(self, elapsed: float) -> int:
        """How many events may go now, at `elapsed` seconds into the run."""
        if self.profile is None:
            return _MAX_BATCH
        rate = self.profile.rate_at(elapsed)
        self._tokens = min(self._tokens + rate * (elapsed - self._last), max(rate * _BURST_S, 1.0))
        self._last = elapsed
        if self._tokens < _slice(rate):
            return 0
        n = min(int(self._tokens), _MAX_BATCH)
        self._tokens -= n
        return n

    def wait_s(self, elapsed: float) -> float:
        rate = self.profile.rate_at(elapsed) if self.profile else 0.0
        return min(_SLICE_S, max((_slice(rate) - self._tokens) / rate, _POLL_MIN_S)) if rate > 0 else _SLICE_S


def _slice(rate: float) -> float:
    """The fewest events worth waking for: a slice's worth (at least one). Woken per event, 2,000
    events/s took 0.164 cores against 0.113 (load/bench/pacing.py, both with the 1-ms floor)."""
    return max(rate * _SLICE_S, 1.0)


def _check_topic(producer: Producer, bootstrap: str, topic: str, partitions: int) -> None:
    try:
        metadata = producer.list_topics(topic, timeout=10)
    except KafkaException as e:
        raise KafkaUnavailable(f"no Kafka broker answered at {bootstrap} within 10 s: {e.args[0].str()}") from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        raise ConfigError(f"topic {topic!r} does not exist on {bootstrap}; "
                          f"create it with {partitions} partitions first")
    if len(found.partitions) != partitions:
        raise ConfigError(f"topic {topic!r} has {len(found.partitions)} partitions, not {partitions}; pass partitions="
                          f"{len(found.partitions)} so partition_for() agrees with the topic")


def _produce(producer: Producer, topic: str, value: bytes, key: bytes, partition: int, failures: list[str],
             **extra) -> None:
    """`extra`: a per-message `on_delivery`, a `timestamp` (ms) of the simulated clock."""
    while True:
        try:
            producer.produce(topic, value, key, partition=partition, **extra)
            return
        except BufferError:  # librdkafka's queue is full: let it drain, never drop
            producer.poll(0.01)
            if failures:  # messages are timing out, so the queue will not drain: the broker is gone
                raise KafkaUnavailable(f"Kafka stopped accepting events: {failures[0]}") from None


def _status(sent: int, bad: int, elapsed: float, current: float) -> Text:
    return Text(f"load: {current:,.0f} events/s now · {sent:,} sent ({bad:,} bad) · {elapsed:,.1f} s")


class _Labels:
    """A run's labels (streamlearn/loadgen/labels.py): queued as their events go, sent when due, on
    the wall's clock or the events' simulated one, a chargeback once its event's offset is known."""

    def __init__(self, plan: LabelPlan, seed: int, producer: Producer, topic: str, failures: list[str]):
        self.plan, self.producer, self.topic, self.failures = plan, producer, topic, failures
        self.queue, self.sent = LabelQueue(plan, seed), 0
        self.started = time.monotonic()
        self.first_ms: int | None = None  # the simulated clock: the first and the newest event time sent
        self.last_ms = 0
        self.events_done_at: float | None = None

    def stamp(self, event: dict, valid: bool) -> dict[str, Any]:
        """What `produce` takes beside the event: its simulated time, and for a reported event a
        delivery callback that learns its offset."""
        extra: dict[str, Any] = {}
        if self.plan.simulated:  # the Kafka timestamp is the event's own time
            extra["timestamp"] = self.last_ms = event["event_time"]
            self.first_ms = self.last_ms if self.first_ms is None else self.first_ms
        if valid and self.plan.fraud_only and event["is_fraud"]:  # its chargeback names the offset it gets
            extra["on_delivery"] = self._delivered(event["event_id"])
        return extra

    def _delivered(self, event_id: str):
        def on_delivery(err, msg) -> None:
            if err is not None:
                self.failures.append(str(err))
            else:
                self.queue.delivered(event_id, msg.offset())
        return on_delivery

    def now(self, wall: float) -> float:
        """The labels' clock: the wall's, or the simulated time the events sent reached, running
        on at the run's pace once they are all out."""
        if not self.plan.simulated:
            return wall
        if self.events_done_at is None or self.first_ms is None:
            return self.last_ms / 1000
        pace = (self.last_ms - self.first_ms) / max(self.events_done_at - self.started, 1e-3)  # ms a wall second
        return (self.last_ms + (wall - self.events_done_at) * pace) / 1000

    def send_due(self, wall: float) -> None:
        for value, key, partition, label_ms in self.queue.due(self.now(wall)):
            stamp = {"timestamp": label_ms} if self.plan.simulated else {}
            _produce(self.producer, self.topic, value, key, partition, self.failures, **stamp)
            self.sent += 1

    def drain(self, bootstrap: str) -> None:
        """The events are out; their labels keep their delays."""
        self.events_done_at = time.monotonic()
        while len(self.queue):
            self.send_due(time.monotonic())
            wait = self.queue.next_due() - self.now(time.monotonic()) if len(self.queue) else 0.0
            if self.plan.simulated:  # in wall seconds, at the run's pace
                wait = 0.0 if wait <= 0 else _SLICE_S * 10
            self.producer.poll(min(max(wait, 0.001), _SLICE_S * 10))  # serves the delivery reports a report waits on
            if self.failures:
                raise KafkaUnavailable(f"Kafka at {bootstrap} did not take labels: {self.failures[0]}")

    def summary(self) -> dict[str, Any]:
        plan = self.plan
        return {"topic": self.topic, "sent": self.sent, "unlabelled": self.queue.unlabelled, "delay": str(plan.delay),
                "unlabelled_fraction": plan.unlabelled_fraction, "fraud_only": plan.fraud_only,
                "simulated_clock": plan.simulated}


class _Malformed:
    """The malformed messages of a run (run_load spreads them evenly: the exact share of every prefix)."""

    def __init__(self, fraction: float, seed: int):
        self.fraction, self.seed, self.rng = fraction, seed, random.Random(seed)
        self.count, self.by_reason = 0, {}

    def take(self) -> bytes:
        """The next malformed message, counted by its reason."""
        value, code = malformed_message(self.rng, self.count, run=self.seed)
        self.count += 1
        self.by_reason[code] = self.by_reason.get(code, 0) + 1
        return value


def _producer_config(bootstrap: str, overrides: dict[str, Any] | None, failures: list[str],
                     labels: LabelPlan | None) -> dict[str, Any]:
    def on_delivery(err, _msg) -> None:  # called for failures only (delivery.report.only.error), or per event
        if err is not None:
            failures.append(str(err))

    config = {**_PRODUCER_DEFAULTS, **(overrides or {}), "bootstrap.servers": bootstrap, "on_delivery": on_delivery}
    if labels is not None and labels.fraud_only:  # a chargeback names its event's offset: from its delivery report
        config["delivery.report.only.error"] = False
    return config


def _check_load(count: int | None, duration: float | None, partitions: int, bad_fraction: float) -> None:
    if count is None and duration is None:
        raise ConfigError("run_load needs count= and/or duration=, or it would never stop")
    if (count is not None and count < 0) or (duration is not None and duration <= 0) or partitions < 1:
        raise ConfigError(f"need count >= 0, duration > 0, partitions >= 1; got {count}, {duration}, {partitions}")
    if not 0.0 <= bad_fraction < 1.0:
        raise ConfigError(f"bad_fraction is a share of events in [0, 1), got {bad_fraction}")


def run_load(bootstrap: str, topic: str, *, partitions: int, profile: Profile | None = None,
             count: int | None = None, duration: float | None = None, bad_fraction: float = 0.0, seed: int = 0,
             drift_at: int | None = None, progress: bool = False,
             producer_config: dict[str, Any] | None = None, labels: LabelPlan | None = None) -> dict[str, Any]:
    """Produce simulated events (a `bad_fraction` of them malformed) until `count` or `duration`.

    Every message is keyed by its customer id and sent to partition_for(key, partitions).
    With `labels`, events go without their label and the labels follow on `<topic>.labels`
    (streamlearn/loadgen/labels.py); run_load returns once the last label due has gone.
    Nothing is dropped: a full local queue is drained and retried; any message Kafka did
    not acknowledge by the end raises KafkaUnavailable. (Keyword arguments, each a knob of
    the run; the CLI's `streamlearn load` passes them through.)
    """
    _check_load(count, duration, partitions, bad_fraction)
    failures: list[str] = []
    config = _producer_config(bootstrap, producer_config, failures, labels)
    producer = Producer(config)
    _check_topic(producer, bootstrap, topic, partitions)
    sender = _Labels(labels, seed, producer, topic + LABELS_SUFFIX, failures) if labels else None
    if sender is not None:
        _check_topic(producer, bootstrap, sender.topic, partitions)
    sim, pacer, bad = BankingSimulator(seed, drift_at=drift_at), _Pacer(profile), _Malformed(bad_fraction, seed)
    sent, per_partition = 0, [0] * partitions
    start = time.monotonic()
    shown_at, shown_sent, current = start, 0, 0.0
    live = Live(console=Console(stderr=True), refresh_per_second=4) if progress else nullcontext()
    with live:
        while count is None or sent < count:
            now = time.monotonic()
            if duration is not None and now - start >= duration:
                break
            if sender is not None:
                sender.send_due(now)
            n = min(pacer.take(now - start), count - sent) if count is not None else pacer.take(now - start)
            if n == 0:
                producer.poll(pacer.wait_s(now - start))  # sleeps, serving delivery reports meanwhile
                continue
            events = sim.events(n)
            labelled: tuple[list, list, list] = ([], [], [])  # the valid events sent: their labels follow
            for event, value in zip(events, encode_batch(events, with_label=sender is None), strict=True):
                key = event["customer_id"].encode()
                partition = partition_for(key, partitions)
                malformed = int((sent + 1) * bad_fraction) > int(sent * bad_fraction)  # evenly spread, exact share
                if malformed:
                    value = bad.take()
                if sender is None:  # the plain path, per event: no more work than it needs (the demo's rate)
                    _produce(producer, topic, value, key, partition, failures)
                else:
                    extra = sender.stamp(event, valid=not malformed)
                    if not malformed:
                        for column, item in zip(labelled, (event, key, partition), strict=True):
                            column.append(item)
                    _produce(producer, topic, value, key, partition, failures, **extra)
                per_partition[partition] += 1
                sent += 1
            if sender is not None:  # delays count from when the chunk's last event went, not from `now`:
                sender.queue.add(*labelled, sent_at=time.monotonic())  # a slow chunk must not shorten them
            producer.poll(0)
            if failures:
                raise KafkaUnavailable(f"Kafka at {bootstrap} did not take events: {failures[0]}")
            if progress and now - shown_at >= 0.25:
                current, shown_at, shown_sent = (sent - shown_sent) / (now - shown_at), now, sent
                live.update(_status(sent, bad.count, now - start, current))
        if sender is not None:
            sender.drain(bootstrap)
        unsent = producer.flush(float(config["delivery.timeout.ms"]) / 1000 + 5)
        if progress:
            live.update(_status(sent, bad.count, time.monotonic() - start, current))
    if unsent or failures:
        raise KafkaUnavailable(f"{unsent} event(s) still queued and {len(failures)} failed after flushing to "
                               f"{bootstrap}: {failures[0] if failures else 'broker did not acknowledge in time'}")
    seconds = time.monotonic() - start
    return {"events": sent, "valid": sent - bad.count, "bad": bad.count, "bad_by_reason": bad.by_reason,
            "per_partition": dict(enumerate(per_partition)), "seconds": seconds,
            "events_per_s": sent / seconds if seconds > 0 else 0.0, "topic": topic,
            **({"labels": sender.summary()} if sender is not None else {})}
