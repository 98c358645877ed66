"""Drift detectors (streamlearn/train/drift.py): a new fraud pattern raises a hand within
seconds of the generator's drift and never before it; error alarms only on a rise; a pipeline's
watched columns are checked up front; alarms wait for the checkpoint after being announced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.fraud import PIPELINE as Fraud
from streamlearn.errors import PipelineError
from streamlearn.loadgen.generator import BankingSimulator
from streamlearn.pipeline import Pipeline
from streamlearn.train.drift import DriftMonitor, Watch, for_pipeline


def feed(monitor: DriftMonitor, scores, targets, features, step: int = 256) -> list[tuple[int, str]]:
    """(events seen when it fired, signal) per alarm, fed in training steps of `step` events."""
    return [(a.events, a.signal) for s in range(0, len(scores), step)
            for a in monitor.update(scores[s:s + step], targets[s:s + step], features[s:s + step])]


def test_the_generators_new_fraud_pattern_is_caught_within_seconds_and_never_before():
    drift_at, n = 120_000, 160_000  # 5.5 simulated days before the drift: nights and days, no alarm
    pipeline = Fraud()
    events = BankingSimulator(7, drift_at=drift_at).events(n)
    x, y = pipeline.features(events), pipeline.targets(events)
    monitor = for_pipeline(pipeline, x.shape[1])
    alarms = feed(monitor, np.random.default_rng(7).random(n), y, x)
    assert alarms and all(at > drift_at for at, _ in alarms), alarms[:5]
    first_at, first = alarms[0]
    # 30 s at the demo's 2k events/s is 60k events; the first alarm comes well inside it, and it
    # names what changed: frauds moved to cash-outs at ATMs.
    assert first_at - drift_at < 30_000, alarms[:5]
    signals = {signal for _, signal in alarms}
    assert {"positive.merchant_category=cash", "positive.channel=atm"} <= signals, signals
    assert not any(s.startswith("input.hour") or s.startswith("positive.hour") for s in signals)  # not watched


def test_error_alarms_on_a_rise_only():
    rng = np.random.default_rng(0)
    n = 60_000
    x = rng.random((n, 1)).astype(np.float32)
    falling = np.where(np.arange(n) < n // 2, 1.0, 0.2) + rng.normal(0, 0.05, n)  # the model learning
    monitor = DriftMonitor("regression", {})
    assert feed(monitor, falling, np.zeros(n), x) == []
    rising = np.where(np.arange(n) < n // 2, 0.2, 1.0) + rng.normal(0, 0.05, n)
    alarms = feed(DriftMonitor("regression", {}), rising, np.zeros(n), x)
    assert [signal for _, signal in alarms] == ["error"] and n // 2 < alarms[0][0] < n // 2 + 20_000


def test_a_stationary_stream_raises_nothing():
    rng = np.random.default_rng(1)
    n = 200_000
    y = (rng.random(n) < 0.02).astype(np.float32)
    x = np.column_stack([rng.random(n) < np.where(y > 0, 0.6, 0.1), rng.normal(size=n)]).astype(np.float32)
    scores = np.clip(0.02 + 0.5 * y + rng.normal(0, 0.1, n), 0, 1)
    assert feed(DriftMonitor("classification", {"a": 0, "b": 1}), scores, y, x) == []


def test_watched_columns_are_checked_up_front_and_none_means_all():
    class Odd(Fraud):
        drift_inputs = {"amount": 0, "beyond": 99}

    with pytest.raises(PipelineError, match=r"drift_inputs names columns outside its 49 features: \{'beyond': 99\}"):
        for_pipeline(Odd(), 49)

    class Plain(Fraud):
        drift_inputs = None

    assert for_pipeline(Plain(), 3).names == ["x0", "x1", "x2"]
    assert Pipeline.drift_inputs is None


def test_alarms_are_announced_at_once_and_kept_for_the_next_checkpoint():
    heard = []
    monitor = DriftMonitor("regression", {})
    watch = Watch(100, monitor, heard.append)
    rising = np.where(np.arange(40_000) < 20_000, 0.1, 0.9)
    for s in range(0, 40_000, 256):
        watch.observe(rising[s:s + 256], np.zeros(len(rising[s:s + 256])), lambda: np.zeros((256, 0), np.float32))
    alarms = watch.take_alarms()
    assert alarms == heard and len(alarms) == 1 and alarms[0].after > alarms[0].before
    assert watch.take_alarms() == []
    assert len(watch.arrays()[0]) == 100  # and it is still the prequential window

    def never() -> np.ndarray:
        raise AssertionError("a rank without drift detectors must not copy features")

    Watch(10).observe(np.zeros(5), np.zeros(5), never)


def test_a_worker_loads_adwin_without_the_rest_of_river_drift():
    """river.drift's package imports KSWIN's scipy.stats and its datasets: over a second of every
    worker's start. The monitor loads ADWIN's module alone, and `river.drift` stays whole for
    whoever imports it later."""
    check = ("import sys; import streamlearn.train.drift as d; "
             "assert 'scipy.stats' not in sys.modules and 'river.drift' not in sys.modules, sorted(sys.modules); "
             "import river.drift; assert river.drift.ADWIN is d.ADWIN and river.drift.KSWIN")
    subprocess.run([sys.executable, "-c", check], check=True, cwd=Path(__file__).parents[2])
