"""Where each rank's time goes: per-phase totals, and an opt-in Chrome trace (the timeline).

Phases: plan (agree on the next window), wait_data (blocked on the reader), fetch (read +
decode + featurize, in the reader thread), sync (the per-window size exchange: time here is
waiting for the slowest rank), train (forward, backward with DDP's allreduce, step), and
checkpoint. The trace opens in chrome://tracing or ui.perfetto.dev; one file per rank.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager


class Phases:
    def __init__(self, rank: int, timeline: str = ""):
        self.rank = rank
        self.totals: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._file = None
        if timeline:
            path = f"{timeline}.rank{rank}.json"
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._file = open(path, "w")
            self._file.write("[\n")  # Chrome's JSON-array trace format; a crash leaves it still readable
            self._first = True

    @contextmanager
    def __call__(self, name: str, **args):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self.totals[name] += elapsed
                if self._file is not None:
                    event = {"name": name, "ph": "X", "pid": self.rank, "tid": threading.current_thread().name,
                             "ts": int((time.time() - elapsed) * 1e6), "dur": int(elapsed * 1e6), "args": args}
                    self._file.write(("" if self._first else ",\n") + json.dumps(event))
                    self._first = False

    def take(self) -> dict[str, float]:
        """Totals since the last take, rounded for logs."""
        with self._lock:
            out = {k: round(v, 3) for k, v in self.totals.items()}
            self.totals.clear()
        return out

    def close(self) -> None:
        if self._file is not None:
            with self._lock:
                self._file.write("\n]\n")
                self._file.close()
                self._file = None
