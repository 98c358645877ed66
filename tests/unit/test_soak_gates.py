"""The soak's gates judge what they claim: each fails on the trend it guards against, and only on it."""

from __future__ import annotations

import argparse
import bisect

import numpy as np
import pytest

from load.bench import soak
from streamlearn.config import TrainConfig

ARGS = argparse.Namespace(minutes=10, rate=2000, clients=8, sample_every=10)
CFG = TrainConfig(topic="soak", workers=2)  # checkpoints every 10 s: lag may climb 20k events and fall
AUDIT = {"passed": True, "checks": {}}


def sawtooth(t: float) -> float:
    """Lag as checkpoints leave it: anywhere from 0 to one interval's events, sample to sample."""
    return (t * 777) % 20_000


def histogram(latencies_s) -> np.ndarray:
    counts = np.zeros(len(soak.EDGES) + 1, dtype=np.int64)
    for latency in latencies_s:
        counts[bisect.bisect(soak.EDGES, latency)] += 1
    return counts


def run(lag=sawtooth, rss=lambda t: 500.0, latency_ms=lambda t: 10.0, failed_at=(), broker=None):
    """Ten minutes of samples every 10 s; each trend a function of the sample's time. `broker`:
    t -> (RSS, committed heap) of a JVM broker, sampled beside the others."""
    samples = []
    for t in np.arange(10.0, 601.0, 10.0):
        h = histogram(np.full(200, latency_ms(t) / 1000))
        fails = [at for at in failed_at if t - 10 < at <= t]
        jvm = {} if broker is None else {"kafka broker 13": broker(t)}
        samples.append({"t": float(t), "rss_mib": {"train worker 11": rss(t), "ray raylet 12": 100 + t,
                                                   **{k: v[0] for k, v in jvm.items()}},
                        "jvm_heap_mib": {k: v[1] for k, v in jvm.items()},
                        "lag_events": int(lag(t)), "lag_peak_events": int(lag(t)), "learned": 0,
                        "requests": 200 + len(fails), "failed": len(fails),
                        "failed_at": fails, "p50_ms": soak.percentile(h, 50), "p99_ms": soak.percentile(h, 99),
                        "histogram": h})
    return soak.judge(ARGS, CFG, samples, 30.0, AUDIT)["gates"]


def gate(gates: dict, starts: str) -> dict:
    return next(g for name, g in gates.items() if name.startswith(starts))


def test_a_steady_run_passes_every_gate_and_ray_s_own_processes_are_not_gated():
    assert all(g["passed"] for g in run().values())  # the raylet grows 60 MiB/min in this run: shown, not gated


def test_a_failure_before_the_first_model_is_allowed_and_one_after_it_is_not():
    assert gate(run(failed_at=[5.0, 29.0]), "no failed")["passed"]
    failed = gate(run(failed_at=[5.0, 300.5]), "no failed")
    assert not failed["passed"] and failed["first_failures_s"] == [300.5]


@pytest.mark.parametrize("lag,passed", [
    (lambda t: sawtooth(t) + 40 * t, False),  # falls behind by 40 events/s, 2 % of the rate: beyond the noise
    (lambda t: sawtooth(t) + 5 * t, True),    # 1.5k over 5 minutes: within the sawtooth's noise
    (lambda t: sawtooth(t) + max(0, 200_000 - 400 * t), True),  # catching up after start
])
def test_lag_is_bounded_unless_it_climbs_beyond_the_checkpoint_sawtooth_s_noise(lag, passed):
    assert gate(run(lag=lag), "lag bounded")["passed"] is passed


def test_memory_growing_3_mib_a_minute_fails_and_the_worst_process_is_named():
    memory = gate(run(rss=lambda t: 500 + 3 * t / 60), "every service process")
    assert not memory["passed"] and memory["worst"]["process"] == "train worker 11"


def test_p99_doubling_by_the_end_fails():
    assert not gate(run(latency_ms=lambda t: 10.0 if t < 400 else 20.0), "p99")["passed"]
    assert gate(run(latency_ms=lambda t: 10.0 if t < 400 else 12.0), "p99")["passed"]


def test_a_jvm_s_heap_growing_within_its_bound_passes_and_growth_outside_it_fails():
    """The broker's heap grows as G1 commits regions up to -Xmx: by design, not a leak. What grows
    outside the heap (threads, buffers, metaspace) is judged."""
    heap_grows = gate(run(broker=lambda t: (300 + 4 * t / 60, 150 + 4 * t / 60)), "every service process")
    assert heap_grows["passed"]
    leaks = gate(run(broker=lambda t: (300 + 7 * t / 60, 150 + 4 * t / 60)), "every service process")
    assert not leaks["passed"] and leaks["worst"]["process"] == "kafka broker 13"
    assert leaks["worst"]["judged"] == "RSS outside the committed heap" and leaks["worst"]["heap_bound_mib"] == 512
