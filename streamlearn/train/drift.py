"""Drift: the trainer raises a hand when the world its model learned moves (issue 16).

Rank 0 watches the events it trains on with river's ADWIN (an adaptive window that finds the
point where a stream's mean changed, with a false-alarm bound `delta`), one detector per signal:

- **error** — how wrong the model was on events it had not yet learned (each is scored before
  its step): for regression the mean |score - target|; for classification, split by class since
  fraud is rare and its base rate follows the hour of day: "error.negative" is the mean score of
  legitimate events, "error.positive" the frauds' shortfall (the share of the step's legitimate
  events scored above each: an AUC per fraud, blind to calibration). Only a rise is an alarm: the
  error falling is the model learning.
- **input** — the mean of each watched feature column ("input.<name>"), either way; for
  classification also over the positive class alone ("positive.<name>"): what fraud looks like.
  That is where a new fraud pattern shows first: frauds are 1-2 % of events, so their move
  hardly shifts a column's overall mean, while among frauds it is plain within a few dozen.
  A pipeline names its columns (`Pipeline.drift_inputs`); seasonal ones (the hour of day) move
  by design and are left out.

The error and positive-class detectors see each training step's means (a step holds a few
frauds); the overall input detectors the means over INPUT_EVENTS events. An update per event and
column would cost ~45 detector updates an event; this costs ~0.5 µs an event on rank 0
(DECISIONS §21 has the figures).

An alarm is logged, counted in Prometheus (deploy/prometheus/alerts.yml turns it into an alert),
kept in the checkpoint's history and drawn on the report. Training goes on: the model adapts,
which is the point of learning online.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streamlearn.errors import PipelineError
from streamlearn.pipeline import Pipeline
from streamlearn.prequential import SlidingWindow
from streamlearn.train.evidence import EvidenceSampler

INPUT_EVENTS = 1024  # events per update of the overall input detectors
ERROR_DELTA = 0.002  # river's default
INPUT_DELTA = 1e-4  # tens of columns, each a chance of a false alarm: a stricter bound for each


def _load_adwin() -> type:
    """river's ADWIN without the rest of `river.drift`. The package's `__init__` imports every
    detector it has and their datasets (KSWIN brings scipy.stats): 1.0-1.3 s of one core in
    every Ray Train worker's start, where ADWIN's own module takes 0.02 s (measured). The package
    is stood in for, uninitialised, while ADWIN's module loads, then dropped: a later
    `import river.drift` runs the real `__init__`, which finds the same ADWIN module loaded."""
    if "river.drift" in sys.modules:
        return sys.modules["river.drift"].ADWIN
    sys.modules["river.drift"] = importlib.util.module_from_spec(importlib.util.find_spec("river.drift"))
    try:
        from river.drift.adwin import ADWIN
    finally:
        del sys.modules["river.drift"]
    return ADWIN


ADWIN = _load_adwin()


@dataclass(frozen=True)
class Alarm:
    signal: str  # "error", "error.positive", "error.negative", "input.<feature>" or "positive.<feature>"
    before: float  # the signal's mean over the detector's window before the alarm ...
    after: float  # ... and over the newer part ADWIN kept when it cut the window (it may still hold
    # much from before the change: ADWIN cuts where the difference is proven, not where it began)
    events: int  # events this monitor had seen when it fired

    def as_dict(self) -> dict:
        return {"signal": self.signal, "before": round(self.before, 5), "after": round(self.after, 5),
                "events": self.events}


def for_pipeline(pipeline: Pipeline, width: int) -> DriftMonitor:
    """The monitor of the columns `pipeline.drift_inputs` names (all of them when it is None)."""
    inputs = {f"x{i}": i for i in range(width)} if pipeline.drift_inputs is None else pipeline.drift_inputs
    outside = {name: column for name, column in inputs.items() if not 0 <= column < width}
    if outside:
        raise PipelineError(f"{pipeline.name}.drift_inputs names columns outside its {width} features: {outside}; "
                            f"columns are 0..{width - 1}")
    return DriftMonitor(pipeline.task, inputs)


class DriftMonitor:
    def __init__(self, task: str, inputs: dict[str, int]):
        """`inputs`: watched feature name -> its column in the feature matrix."""
        self.classification = task == "classification"
        self.names = list(inputs)
        self.columns = np.fromiter(inputs.values(), np.int64, len(inputs))
        errors = ("error.positive", "error.negative") if self.classification else ("error",)
        kinds = ("input", "positive") if self.classification else ("input",)
        # clock=1: look for a change at every update (one per step, not per event).
        self.detectors = {name: ADWIN(delta=ERROR_DELTA, clock=1) for name in errors}
        self.detectors |= {f"{kind}.{name}": ADWIN(delta=INPUT_DELTA, clock=1) for kind in kinds for name in inputs}
        # Per kind, the signals and their detectors in column order: the per-step loop over ~90 of
        # them is most of the monitor's cost, so it walks two lists, not dict lookups and calls.
        self._kinds = {kind: ([f"{kind}.{name}" for name in inputs],
                              [self.detectors[f"{kind}.{name}"] for name in inputs]) for kind in kinds}
        self.events = 0
        self._input_sums, self._input_n = np.zeros(len(inputs)), 0  # of the events not yet fed

    def update(self, scores: np.ndarray, targets: np.ndarray, features: np.ndarray) -> list[Alarm]:
        """One training step's events, scored before the step. Returns the alarms they raised."""
        inputs = features[:, self.columns]  # once a step: the hot path's copy
        return self._inputs(inputs) + self._judge(scores, targets, inputs)

    def watch_inputs(self, features: np.ndarray) -> list[Alarm]:
        """The detectors that need no label: each watched column's mean over INPUT_EVENTS events."""
        return self._inputs(features[:, self.columns])

    def judge(self, scores: np.ndarray, targets: np.ndarray, features: np.ndarray) -> list[Alarm]:
        """The detectors that need labels (final ones: with delayed feedback, Watch gives them
        matured rows only): how wrong the model was, and what fraud looks like."""
        return self._judge(scores, targets, features[:, self.columns])

    def _inputs(self, inputs: np.ndarray) -> list[Alarm]:
        self.events += len(inputs)
        self._input_sums += inputs.sum(axis=0, dtype=np.float64)
        self._input_n += len(inputs)
        if self._input_n < INPUT_EVENTS:
            return []
        alarms = self._observe("input", (self._input_sums / self._input_n).tolist(), only_rise=False)
        self._input_sums[:], self._input_n = 0.0, 0
        return alarms

    def _judge(self, scores: np.ndarray, targets: np.ndarray, inputs: np.ndarray) -> list[Alarm]:
        if len(scores) == 0:
            return []
        scores = scores.astype(np.float64)
        if not self.classification:
            return self._feed("error", float(np.abs(scores - targets).mean()), only_rise=True)
        alarms = []
        positive = targets > 0.5
        negatives = np.sort(scores[~positive])
        if len(negatives):
            alarms += self._feed("error.negative", float(negatives.mean()), only_rise=True)
        if len(negatives) and positive.any():
            above = len(negatives) - (np.searchsorted(negatives, scores[positive], "left")
                                      + np.searchsorted(negatives, scores[positive], "right")) / 2
            alarms += self._feed("error.positive", float(above.mean()) / len(negatives), only_rise=True)
        if positive.any():  # frauds are few: every step that has one feeds their means
            alarms += self._observe("positive", inputs[positive].mean(axis=0, dtype=np.float64).tolist(),
                                    only_rise=False)
        return alarms

    def _observe(self, kind: str, means: list[float], only_rise: bool) -> list[Alarm]:
        signals, detectors = self._kinds[kind]
        return self._update(signals, detectors, means, only_rise)

    def _feed(self, signal: str, value: float, only_rise: bool) -> list[Alarm]:
        return self._update((signal,), (self.detectors[signal],), (value,), only_rise)

    def _update(self, signals, detectors, values, only_rise: bool) -> list[Alarm]:
        alarms = []
        for signal, detector, value in zip(signals, detectors, values, strict=True):
            before = detector.estimation
            detector.update(value)
            if detector.drift_detected:
                after = detector.estimation  # ADWIN dropped the older part: the mean of the newer part it kept
                if not (only_rise and after <= before):
                    alarms.append(Alarm(signal, before, after, self.events))
        return alarms


class Watch(SlidingWindow):
    """What a rank keeps of each step's scored events: the prequential window (every rank) and,
    on rank 0, the drift monitor and the gate's evidence fed with the same events; alarms wait for
    the next checkpoint's history row after `on_alarm` has logged and counted them.

    With delayed feedback (`silent`: the pipeline's silent answer) a step's rows of the silent
    answer are fake negatives, so the signals that use labels judge matured rows only, given
    before each window is learned (`observe_matured`): its reports (final as they come) and the
    events that matured unreported in it, scored together by one model, so neither class is
    scored by a newer model than the other (load/bench/gate_feedback.py measured why). They are
    also kept in `matured`, for their own metric. The prequential window and the input detectors
    see every learned row, as without."""

    def __init__(self, size: int, drift: DriftMonitor | None = None, on_alarm: Callable[[Alarm], None] | None = None,
                 evidence: EvidenceSampler | None = None, silent: float | None = None):
        super().__init__(size)
        self.drift, self.on_alarm, self.evidence, self.silent = drift, on_alarm, evidence, silent
        self.matured = SlidingWindow(size) if silent is not None else None
        self.matured_age_s: float | None = None
        self._alarms: list[Alarm] = []
        # Delayed feedback: the newest matured negatives (the gate's, beside the reports held back
        # from learning: train/learner.py, `judge_pool`), and the evidence judged at the checkpoint.
        self._negatives: deque[np.ndarray] = deque()
        self._pooled: dict[str, np.ndarray] | None = None

    def observe(self, scores: np.ndarray, targets: np.ndarray, features: Callable[[], np.ndarray]) -> None:
        """`features` is called only where drift is watched or evidence kept: other ranks skip the copy."""
        self.add(scores, targets)
        if self.silent is not None:  # delayed feedback: labels judged in observe_matured
            if self.drift is not None:
                self._raise(self.drift.watch_inputs(features()))
            return
        if self.evidence is not None:
            self.evidence.add(scores, targets, features)
        if self.drift is not None:
            self._raise(self.drift.update(scores, targets, features()))

    def observe_matured(self, scores: np.ndarray, targets: np.ndarray, features: np.ndarray,
                        age_s: float | None = None) -> None:
        """Delayed feedback, before a window is learned: its matured rows, scored by the model as
        it stands. `age_s`: how long before the partitions' clocks the newest events that matured
        unreported arrived (None: none has yet)."""
        if age_s is not None:
            self.matured_age_s = age_s
        if not len(scores):
            return
        self.matured.add(scores, targets)
        if self.evidence is not None and len(negatives := features[targets == self.silent]):
            self._negatives.append(negatives)
            while sum(map(len, self._negatives)) - len(self._negatives[0]) >= self.evidence.size:
                self._negatives.popleft()
        if self.drift is not None:
            self._raise(self.drift.judge(scores, targets, features))

    def _raise(self, alarms: list[Alarm]) -> None:
        for alarm in alarms:
            self._alarms.append(alarm)
            if self.on_alarm:
                self.on_alarm(alarm)

    def gate_negatives(self) -> np.ndarray | None:
        """Delayed feedback: the newest matured negatives' features (at most the evidence's size)."""
        if self.evidence is None or not self._negatives:
            return None
        return np.concatenate(self._negatives)[-self.evidence.size:]

    def pooled(self, evidence: dict[str, np.ndarray]) -> None:
        """Delayed feedback: the checkpoint's evidence, judged as the window ended (`judge_pool`)."""
        self._pooled = evidence

    def take_evidence(self) -> dict[str, np.ndarray] | None:
        if self.silent is not None:
            evidence, self._pooled = self._pooled, None
            return evidence
        return self.evidence.take() if self.evidence is not None else None

    def take_alarms(self) -> list[Alarm]:
        alarms, self._alarms = self._alarms, []
        return alarms
