"""What the scorer's quality gate judges a checkpoint on: the newest events rank 0 learned since
the checkpoint before it, with the scores the training model gave them just before it learned
them (predict-then-learn) and their targets.

No model older than the previous checkpoint has learned these events, so the served model (always
an older version) can score the same rows in the scorer and the two be compared event by event
(serve/paired.py). Kept only where drift is watched (rank 0): one rank's share of the window is a
fair sample of it, and the other ranks are spared the copy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np


class EvidenceSampler:
    def __init__(self, size: int):
        self.size = size
        self._parts: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._n = 0

    def add(self, scores: np.ndarray, targets: np.ndarray, features: Callable[[], np.ndarray]) -> None:
        if not len(scores) or not self.size:
            return
        # Views of the window's arrays, copied once at `take`: a step pays for a reference, not a copy.
        self._parts.append((features(), scores, targets))
        self._n += len(scores)
        while self._n - len(self._parts[0][1]) >= self.size:
            self._n -= len(self._parts.popleft()[1])

    def take(self) -> dict[str, np.ndarray] | None:
        """The newest `size` events since the last take, and start afresh (the next checkpoint's
        evidence must be events no version up to this one has learned)."""
        if not self._parts:
            return None
        features, scores, targets = (np.concatenate([p[i] for p in self._parts])[-self.size:] for i in range(3))
        self._parts.clear()
        self._n = 0
        return {"features": features.astype(np.float32, copy=False), "scores": scores.astype(np.float32, copy=False),
                "targets": targets.astype(np.float32, copy=False)}
