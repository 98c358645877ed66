"""Prequential (predict-then-learn) metrics over a sliding window of recent events.

Each event is scored by the model before the model learns from it, so the metric is an
honest online estimate of how the served model does on events it has not seen.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class SlidingWindow:
    def __init__(self, size: int):
        self.size = size
        self._scores: deque[np.ndarray] = deque()
        self._targets: deque[np.ndarray] = deque()
        self._n = 0

    def add(self, scores: np.ndarray, targets: np.ndarray) -> None:
        if len(scores) == 0:
            return
        self._scores.append(scores.astype(np.float64, copy=False))
        self._targets.append(targets.astype(np.float64, copy=False))
        self._n += len(scores)
        while self._n - len(self._scores[0]) >= self.size:
            self._n -= len(self._scores.popleft())
            self._targets.popleft()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._scores:
            return np.empty(0), np.empty(0)
        return np.concatenate(self._scores)[-self.size:], np.concatenate(self._targets)[-self.size:]


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Mann-Whitney AUC with ties averaged; None when only one class is present."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # Average ranks over ties so a constant model scores exactly 0.5.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    avg = (starts + ends - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def summarize(task: str, scores: np.ndarray, targets: np.ndarray) -> dict[str, float | int | None]:
    """The online metrics of a task over the given window."""
    n = len(scores)
    if n == 0:
        return {"window": 0}
    if task == "classification":
        p = np.clip(scores, 1e-7, 1 - 1e-7)
        logloss = float(-np.mean(targets * np.log(p) + (1 - targets) * np.log(1 - p)))
        return {"window": n, "auc": roc_auc(scores, targets), "logloss": logloss,
                "positive_rate": float(targets.mean())}
    err = scores - targets
    return {"window": n, "mae": float(np.abs(err).mean()), "rmse": float(np.sqrt((err ** 2).mean()))}


def headline(task: str) -> tuple[str, bool]:
    """(metric the quality gate and status line use, whether higher is better)."""
    return ("auc", True) if task == "classification" else ("mae", False)
