"""This replica's recent scoring figures for GET /model (and so `streamlearn status`).

A bounded deque of (finished at, seconds, status): appending is atomic under the GIL, so the
request path takes no lock; GET /model, which is rare, does the sorting.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np


class ScoringStats:
    def __init__(self, capacity: int = 4096, window_s: float = 60.0):
        self.window_s = window_s
        self.total = 0  # a lost increment between two threads would only blur a display figure
        self._recent: deque[tuple[float, float, int]] = deque(maxlen=capacity)

    def add(self, status: int, seconds: float) -> None:
        self.total += 1
        self._recent.append((time.time(), seconds, status))

    def summary(self) -> dict:
        now = time.time()
        recent = [r for r in list(self._recent) if now - r[0] <= self.window_s]
        out = {"requests": self.total, "recent": len(recent), "window_s": self.window_s,
               "errors": sum(1 for r in recent if r[2] >= 400), "p50_ms": None, "p99_ms": None, "rate": 0.0}
        if recent:
            ms = np.array([r[1] for r in recent]) * 1000.0
            span = max(now - recent[0][0], 1.0)  # a full ring covers less than the window
            out.update(p50_ms=round(float(np.percentile(ms, 50)), 3), p99_ms=round(float(np.percentile(ms, 99)), 3),
                       rate=round(len(recent) / min(span, self.window_s), 3))
        return out
