"""Delayed labels for the load generator (issue 16): events without their answer, the answer later.

A fraud label comes from a chargeback or an analyst long after the transaction, and many never
come. With a `LabelPlan`, run_load sends each event without its `is_fraud` field and, after a
delay drawn from the plan's distribution, its label to `<topic>.labels`:

    {"event_id": "41-1234", "label": true, "label_time": 1700000012345}

and with `fraud_only` (a chargeback) also its event's place in the events topic, `"partition": 2,
"offset": 81234`, as a bank's chargeback names the transaction it disputes: a pipeline with
delayed feedback re-reads the event there (streamlearn/ingest/feedback.py). Such a label goes once
the broker has acknowledged its event (its delivery report holds the offset), never before.

keyed and partitioned like its event (the same customer id, so partition p of the labels topic
carries exactly the labels of partition p's events: a trainer rank that reads an event partition
finds its labels in the same partition number). `unlabelled_fraction` of the events never get
one. With `fraud_only`, only frauds get a label, as a bank hears of fraud through chargebacks and
of a legitimate transaction never (a pipeline with `unlabelled_as` learns the silence as its
answer: pipelines/fraud_chargebacks.py). Malformed events get none either: they are
dead-lettered, never learned. Delays are drawn from the run's seed (the same run labels the same
events after the same delays) and are wall clock: a label for an event produced at t goes at
t + delay; `label_time` is the event's own time plus the same delay.

With `simulated` (`streamlearn load --simulated-clock`) delays are in the events' own time, the
generator's compressed clock (an event every 4 s of event time, so a simulated day is 21,600
events: at --rate 360 a day a minute), and every message's Kafka timestamp is its simulated time:
a label goes once the events sent have reached its event's time plus its delay, and the trainer's
windows and TTLs, which run on the partitions' Kafka timestamps, live through weeks in minutes.
After the last event the clock runs on at the run's own pace until the last label has gone.
Its times lie in the past (from 2026-01-01): `streamlearn load --simulated-clock` makes its topics
with no time retention (`SIMULATED_TOPIC_CONFIG`); a topic made before keeps its own.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from streamlearn.errors import ConfigError

LABELS_SUFFIX = ".labels"
# Topics for a simulated clock: its timestamps start at 2026-01-01 and a broker's time retention
# (7 days by default) would delete each segment once it rolled. Size retention by bytes instead.
SIMULATED_TOPIC_CONFIG = {"retention.ms": "-1"}
_BOOL = ("false", "true")
ATTRIBUTION_S = 120 * 86_400.0  # the longest a chargeback can come after its payment (card schemes)


@dataclass(frozen=True)
class LabelDelay:
    """Seconds from an event to its label: `fixed:S`, `uniform:A:B`, `exp:MEAN` (exponential) or
    `lognormal:MEDIAN:SIGMA` (a chargeback's heavy tail: most within days, some after weeks,
    none after the card schemes' 120 days)."""

    kind: str
    a: float
    b: float = 0.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.a)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b, n)
        if self.kind == "lognormal":
            # Capped where card schemes stop taking chargebacks: an uncapped tail (sigma 1 at a
            # 30-day median reaches years) would also stamp reports past the broker's
            # timestamp bound on the simulated clock, which refuses them.
            return np.minimum(self.a * rng.lognormal(0.0, self.b, n), ATTRIBUTION_S)
        return rng.exponential(self.a, n)

    def __str__(self) -> str:
        return f"{self.kind}:{self.a:g}" + (f":{self.b:g}" if self.kind in ("uniform", "lognormal") else "")


_UNITS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0}


def _seconds(value: str) -> float:
    """`30`, `30s`, `15m`, `2h` or `5d` -> seconds."""
    value = value.strip()
    unit = _UNITS.get(value[-1:], None) if value else None
    return float(value[:-1]) * unit if unit is not None else float(value)


def parse_label_delay(spec: str) -> LabelDelay:
    """`fixed:2`, `uniform:1:30`, `exp:5` or `lognormal:5d:1` -> LabelDelay (times in seconds, or
    with a unit: s, m, h, d); a clear ConfigError for anything else."""
    usage = ("a label delay is fixed:T, uniform:MIN:MAX, exp:MEAN or lognormal:MEDIAN:SIGMA, times in seconds or "
             "with a unit s, m, h, d (e.g. exp:5, lognormal:5d:1)")
    kind, *args = spec.strip().split(":")
    try:
        values = [float(a) if (kind, i) == ("lognormal", 1) else _seconds(a) for i, a in enumerate(args)]
    except ValueError:
        raise ConfigError(f"label delay {spec!r}: {usage}") from None
    shapes = {"fixed": 1, "uniform": 2, "exp": 1, "lognormal": 2}
    if kind not in shapes or len(values) != shapes[kind]:
        raise ConfigError(f"label delay {spec!r}: {usage}")
    if any(v < 0 or not np.isfinite(v) for v in values) or (kind == "uniform" and values[0] > values[1]):
        raise ConfigError(f"label delay {spec!r}: seconds are finite and >= 0, and MIN <= MAX")
    return LabelDelay(kind, *values)


@dataclass(frozen=True)
class LabelPlan:
    delay: LabelDelay
    unlabelled_fraction: float = 0.0
    fraud_only: bool = False  # legitimate events never get a label (a bank's chargebacks)
    simulated: bool = False  # delays and Kafka timestamps on the events' compressed clock, not the wall's

    def __post_init__(self):
        if not 0.0 <= self.unlabelled_fraction <= 1.0:
            raise ConfigError(f"unlabelled_fraction is a share of events in [0, 1], got {self.unlabelled_fraction}")


def encode_label(event_id: str, label: bool, label_time: int, at: tuple[int, int] | None = None) -> bytes:
    """A label; with `at`, (partition, offset) of its event: a report (delayed feedback)."""
    where = f',"partition":{at[0]},"offset":{at[1]}' if at is not None else ""
    return f'{{"event_id":"{event_id}","label":{_BOOL[label]},"label_time":{label_time}{where}}}'.encode()


class LabelQueue:
    """Labels waiting for their time, soonest first."""

    def __init__(self, plan: LabelPlan, seed: int):
        self.plan = plan
        self._rng = np.random.default_rng([seed, 0x1ABE1])  # apart from the simulator's own draws
        self._heap: list[tuple[float, int, tuple, bytes, int]] = []
        # With fraud_only: event id -> offset, from the events' delivery reports (`delivered`).
        self.offsets: dict[str, int] = {}
        self._order = 0  # ties in due time leave in the order their events went
        self.unlabelled = 0

    def add(self, events: list[dict], keys: list[bytes], partitions: list[int], sent_at: float) -> None:
        """Events just sent (valid ones only): each gets its label due at `sent_at` + its delay
        (with a simulated clock, at its own event time + its delay), or none (the unlabelled share)."""
        n = len(events)
        delays = self.plan.delay.draw(self._rng, n)
        never = self._rng.random(n) < self.plan.unlabelled_fraction
        if self.plan.fraud_only:  # after the draws: the same seed delays the same frauds' labels alike
            never |= ~np.array([e["is_fraud"] for e in events], dtype=bool)
        self.unlabelled += int(never.sum())
        for event, key, partition, delay, skip in zip(events, keys, partitions, delays.tolist(), never.tolist(),
                                                      strict=True):
            if skip:
                continue
            label = (event["event_id"], event["is_fraud"], event["event_time"] + round(delay * 1000))
            start = event["event_time"] / 1000 if self.plan.simulated else sent_at
            heapq.heappush(self._heap, (start + delay, self._order, label, key, partition))
            self._order += 1

    def delivered(self, event_id: str, offset: int) -> None:
        """An event's delivery report: a report names where its event is."""
        self.offsets[event_id] = offset

    def due(self, now: float) -> list[tuple[bytes, bytes, int, int]]:
        """(value, key, partition, label time in ms) of every label due by `now` (s, on the plan's
        clock), in due order. With fraud_only, a label whose event the broker has not acknowledged
        yet waits for it (in its turn)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            label, key, partition = self._heap[0][2:]
            at = None
            if self.plan.fraud_only:
                if label[0] not in self.offsets:
                    break
                at = (partition, self.offsets.pop(label[0]))
            heapq.heappop(self._heap)
            out.append((encode_label(*label, at=at), key, partition, label[2]))
        return out

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
