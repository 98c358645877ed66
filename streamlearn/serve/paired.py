"""Two models' answers to the same events, compared with their noise: the quality gate's test.

A candidate's metric and the served model's, each on a window of its own, differ by the
windows as much as by the models: a lucky window became a bar no later model could pass
(issue 44). Here both answer the same events and the test is paired, so what the events
have in common (an easy or a hard stretch of the stream) cancels out:

- classification (AUC): DeLong's test for two correlated ROC curves (DeLong, DeLong and
  Clarke-Pearson 1988), in Sun and Xu's O(n log n) form (2014): the variance of the AUC
  difference from each event's placement among the other class;
- regression (MAE): a paired z-test on the per-event absolute errors.

`hold` is True only when the candidate is worse than the served model by more than
`tolerance` with confidence 1 - alpha (one-sided): what is held must be shown worse, since a gate
that holds a model on noise freezes serving. DECISIONS.md, "The quality gate", has the
measured rates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

MIN_EACH_CLASS = 10  # fewer positives (or negatives) than this and an AUC difference means nothing
MIN_EVENTS = 30  # regression


@dataclass(frozen=True)
class Comparison:
    metric: str  # auc | mae
    events: int
    positives: int | None  # classification only
    candidate: float | None
    served: float | None
    better_by: float | None  # candidate over served, oriented so that > 0 is better
    se: float | None  # standard error of better_by
    hold: bool | None  # None: too little evidence to say
    why: str

    def describe(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def compare(task: str, candidate: np.ndarray, served: np.ndarray, targets: np.ndarray, *,
            tolerance: float, alpha: float) -> Comparison:
    """Judge `candidate`'s scores against `served`'s on the same events with `targets`."""
    z = NormalDist().inv_cdf(1.0 - alpha)
    candidate, served, targets = (np.asarray(a, dtype=np.float64) for a in (candidate, served, targets))
    if task == "classification":
        return _auc(candidate, served, targets, tolerance, z)
    return _mae(candidate, served, targets, tolerance, z)


def _verdict(metric: str, events: int, positives: int | None, cand: float, serv: float, better_by: float,
             se: float, tolerance: float, z: float) -> Comparison:
    # Nine: the Comparison's own fields, computed by the two tests that call this; once a judgement.
    upper = better_by + z * se  # the best the candidate may be, relative to served, at this confidence
    hold = upper < -tolerance
    why = (f"{metric} {cand:.4f} against the served model's {serv:.4f} on the same {events} events: "
           f"{'worse' if better_by < 0 else 'better'} by {abs(better_by):.4f} (se {se:.4f}); "
           + (f"worse by more than {tolerance} even at the upper bound {upper:+.4f}" if hold
              else f"not shown worse by more than {tolerance} (upper bound {upper:+.4f})"))
    return Comparison(metric, events, positives, cand, serv, better_by, se, hold, why)


def _auc(candidate: np.ndarray, served: np.ndarray, targets: np.ndarray, tolerance: float, z: float) -> Comparison:
    positive = targets > 0.5
    m, n = int(positive.sum()), int((~positive).sum())
    if min(m, n) < MIN_EACH_CLASS:
        return Comparison("auc", len(targets), m, None, None, None, None, None,
                          f"too little evidence: {m} positive and {n} negative events, "
                          f"{MIN_EACH_CLASS} of each needed")
    aucs, v10, v01 = [], [], []
    for scores in (candidate, served):
        x, y = scores[positive], scores[~positive]
        all_ranks = _midranks(np.concatenate([x, y]))
        tx, ty = _midranks(x), _midranks(y)
        placements_x = (all_ranks[:m] - tx) / n  # each positive: share of negatives it outranks
        placements_y = 1.0 - (all_ranks[m:] - ty) / m  # each negative: share of positives above it
        aucs.append(float(placements_x.mean()))
        v10.append(placements_x)
        v01.append(placements_y)
    s10, s01 = np.cov(np.vstack(v10)), np.cov(np.vstack(v01))
    var = (s10[0, 0] + s10[1, 1] - 2 * s10[0, 1]) / m + (s01[0, 0] + s01[1, 1] - 2 * s01[0, 1]) / n
    se = math.sqrt(max(float(var), 0.0))
    return _verdict("auc", len(targets), m, aucs[0], aucs[1], aucs[0] - aucs[1], se, tolerance, z)


def _mae(candidate: np.ndarray, served: np.ndarray, targets: np.ndarray, tolerance: float, z: float) -> Comparison:
    if len(targets) < MIN_EVENTS:
        return Comparison("mae", len(targets), None, None, None, None, None, None,
                          f"too little evidence: {len(targets)} events, {MIN_EVENTS} needed")
    cand_err, serv_err = np.abs(candidate - targets), np.abs(served - targets)
    gain = serv_err - cand_err  # > 0: the candidate's error is smaller
    se = float(gain.std(ddof=1) / math.sqrt(len(gain)))
    return _verdict("mae", len(targets), None, float(cand_err.mean()), float(serv_err.mean()), float(gain.mean()),
                    se, tolerance, z)


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties averaged."""
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    boundaries = np.flatnonzero(np.diff(ordered)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(x)]])
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + ends - 1) / 2.0 + 1.0, ends - starts)
    return ranks
