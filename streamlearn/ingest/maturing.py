"""Delayed feedback's matured negatives: events whose attribution window ended with no report.

With delayed feedback every event is learned at once as legitimate (feedback.py), so a window's
own targets are fake negatives: ~1-2 % of them are frauds whose reports have not come yet. The
quality signals that use labels (the scorer's gate and rank 0's drift detectors) must judge on
matured labels only (issue 45): a fraud once its report came (a report row, matured as it
arrives) and a legitimate payment once its attribution window (`DelayedFeedback.ttl_s`, in the
partition's event time) ended with no report. This module finds the second kind.

Per partition it keeps marks (event time, end offset) of the windows learned, at most MARKS of
them over one attribution window (a window's mark joins the newest when they are less than
ttl_s / MARKS apart), so memory does not grow with the delay or the rate. When the partition's
clock (its newest event's Kafka timestamp) passes a mark's time plus ttl_s, every event up to the
mark's offset has matured. Marks mature in bursts (a chargeback window of 120 days makes a mark
every 11 hours), but the gate judges every checkpoint, so the matured events are drawn from
steadily: each window takes as many of the matured offsets, oldest first, as it learned new
events of the partition, and reads back one in DENSITY of them not reported (at most SAMPLE a
window over the rank's partitions) from the row store (rowstore.py: one `pread` each), as the
window's matured negatives. Drawn at the learning pace, the matured offsets not drawn yet stay
within about one burst. They are scored, never learned: learning and exactly-once do not depend
on them. Without a row store (`--no-feedback-rows`) there are none, and the gate and the drift
detectors see the reports alone (the gate then has too little evidence and says so).

The marks are part of the join state in each checkpoint (a few KB), so a restart does not wait a
whole attribution window for its first matured negative.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from streamlearn.ingest.rowstore import RowStore

MARKS = 256  # per partition and attribution window: a mark is at most ttl_s / 256 late (0.4 %)
SAMPLE = 128  # matured negatives read back per window, at most, over the rank's partitions: ~1 ms of rank 0
# One matured offset in this many is read back: at a live pace (a few thousand events between
# checkpoints) a checkpoint's evidence holds ~100-300 matured negatives beside its reports; a
# catch-up's full windows stop at SAMPLE.
DENSITY = 16


class Maturing:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self.marks: dict[int, deque[tuple[float, int]]] = {}  # partition -> (event time, end offset), oldest first
        self.matured_to: dict[int, int] = {}  # partition -> offsets below this have matured
        self.matured_t: dict[int, float] = {}  # partition -> the event time they arrived by
        self.drawn_to: dict[int, int] = {}  # partition -> matured offsets below this were drawn from
        self.pace: dict[int, int] = {}  # partition -> events learned since the last draw (as many are drawn)

    def learned(self, p: int, start: int, end: int, t: float) -> None:
        """Partition p's events [start, end) are learned, the newest of them at event time `t`."""
        marks = self.marks.setdefault(p, deque())
        self.matured_to.setdefault(p, start)
        self.drawn_to.setdefault(p, start)
        self.pace[p] = self.pace.get(p, 0) + end - start
        span = self.ttl_s / MARKS
        if marks and marks[-1][0] // span == t // span:  # the same slice of time: that mark moves on
            marks[-1] = (max(t, marks[-1][0]), max(end, marks[-1][1]))
        else:
            marks.append((t, end))

    def due(self, p: int, clock: float) -> tuple[int, int]:
        """The offsets [start, end) of partition p that matured since last asked, at event time `clock`."""
        marks = self.marks.get(p)
        start = end = self.matured_to.get(p, 0)
        while marks and marks[0][0] + self.ttl_s <= clock:
            t, at = marks.popleft()
            end = max(end, at)
            self.matured_t[p] = t
        self.matured_to[p] = end
        return start, end

    def sample(self, rows: RowStore, clocks: dict[int, float], reported: dict[int, set[int]],
               size: int = SAMPLE) -> np.ndarray | None:
        """Features of up to `size` events that matured unreported by `clocks` (partition -> event
        time): of each partition's matured offsets not drawn from yet, as many as were learned
        since the last draw, one in DENSITY of them read back, spread evenly; None when none was drawn."""
        spans = self._draw(clocks)
        total = sum(end - start for start, end in spans.values())
        found = []
        for p, (start, end) in sorted(spans.items()):
            want = min(int(np.ceil(min(size, total / DENSITY) * (end - start) / total)), end - start)  # its share
            done = reported.get(p, ())
            spread = np.unique(np.linspace(start, end - 1, want).astype(np.int64))
            offsets = [o for o in spread.tolist() if o not in done]
            found += [x for x in rows.read(p, offsets) if x is not None]
        return np.stack(found) if found else None

    def _draw(self, clocks: dict[int, float]) -> dict[int, tuple[int, int]]:
        """Each partition's offsets [start, end) drawn now: matured by its clock, not drawn before,
        at most as many as were learned of it since the last draw."""
        spans = {}
        for p, clock in clocks.items():
            _, matured = self.due(p, clock)
            start = self.drawn_to.get(p, matured)
            self.drawn_to[p] = end = min(matured, start + self.pace.pop(p, 0))
            if end > start:
                spans[p] = (start, end)
        return spans

    def state(self) -> dict[str, np.ndarray]:
        out = {}
        for p, marks in self.marks.items():
            out[f"p{p}/matured.marks"] = np.array(marks, np.float64).reshape(-1, 2)
            out[f"p{p}/matured.to"] = np.array([self.matured_to.get(p, 0), self.matured_t.get(p, -np.inf),
                                                 self.drawn_to.get(p, self.matured_to.get(p, 0))], np.float64)
        return out

    def restore(self, p: int, named: dict[str, np.ndarray]) -> None:
        if "matured.marks" in named:
            self.marks[p] = deque((float(t), int(o)) for t, o in named["matured.marks"].tolist())
        if "matured.to" in named:
            self.matured_to[p] = int(named["matured.to"][0])
            if np.isfinite(named["matured.to"][1]):
                self.matured_t[p] = float(named["matured.to"][1])
            # A checkpoint from before the steady draw has no third entry: drawn from where it matured.
            self.drawn_to[p] = int(named["matured.to"][2 if len(named["matured.to"]) > 2 else 0])

    def age_s(self, clocks: dict[int, float]) -> float | None:
        """How far behind the partitions' clocks the newest matured events arrived (about ttl_s)."""
        ages = [clocks[p] - t for p, t in self.matured_t.items() if p in clocks]
        return max(ages) if ages else None
