"""Where each rank's time goes: per-phase totals, and an opt-in Chrome trace (the timeline).

Phases: plan (agree on the next window), wait_data (blocked on the reader), fetch (Kafka
reads) and decode (parse, validate, featurize), both in the reader thread, sync (the
per-window size exchange: time here is waiting for the slowest rank), train (one window's
steps) holding forward, backward and step, and checkpoint. With the timeline on, allreduce
spans (DDP's gradient buckets, on their own track) overlap backward. The trace opens in
chrome://tracing or ui.perfetto.dev; one file per rank. A scorer replica writes its own file
too (`serve up --timeline`): a "swap" span per model it loads and swaps in, a "rejected" span
per checkpoint its gates turn away, so a slow or refused swap shows beside the training.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager


class Phases:
    def __init__(self, rank: int, timeline: str = "", *, process: str = ""):
        """`rank` is the trace's pid; `process` names a process that is not a training rank
        (a scorer replica: its OS pid as `rank`, so merged files keep every process apart)."""
        self.rank = rank
        self.totals: dict[str, float] = defaultdict(float)
        self.last: dict[str, float] = {}  # each phase's latest span, seconds
        self._lock = threading.Lock()
        self._file = None
        if timeline:
            path = f"{timeline}.{process.replace(' ', '-') if process else f'rank{rank}'}.json"
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._file = open(path, "w")
            self._file.write("[\n")  # Chrome's JSON-array trace format; a crash leaves it still readable
            self._file.write(json.dumps({"name": "process_name", "ph": "M", "pid": rank,
                                         "args": {"name": process or f"rank {rank}"}}))
            self._first = False

    @contextmanager
    def __call__(self, name: str, **args):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self.totals[name] += elapsed
                self.last[name] = elapsed
                if self._file is not None:
                    event = {"name": name, "ph": "X", "pid": self.rank, "tid": threading.current_thread().name,
                             "ts": int((time.time() - elapsed) * 1e6), "dur": int(elapsed * 1e6), "args": args}
                    self._file.write(("" if self._first else ",\n") + json.dumps(event))
                    self._first = False

    @property
    def tracing(self) -> bool:
        return self._file is not None

    def record(self, name: str, wall_start: float, elapsed: float, tid: str, **args) -> None:
        """A span measured elsewhere (a callback on another thread, say)."""
        with self._lock:
            self.totals[name] += elapsed
            if self._file is not None:
                event = {"name": name, "ph": "X", "pid": self.rank, "tid": tid, "ts": int(wall_start * 1e6),
                         "dur": int(elapsed * 1e6), "args": args}
                self._file.write(("" if self._first else ",\n") + json.dumps(event))
                self._first = False

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

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


def trace_allreduce(model, phases: Phases) -> bool:
    """With the timeline on, time DDP's gradient allreduce: one span per bucket, from the moment
    backward hands the bucket over to the moment its reduction completes (on CUDA, when NCCL's
    work is queued on the stream rather than done). The hook does what DDP does by default
    (average over ranks), so only timing changes; without a timeline DDP keeps its own path."""
    if not phases.tracing or not hasattr(model, "register_comm_hook"):
        return False
    import torch.distributed as dist

    def timed_allreduce(_state, bucket):
        wall, started = time.time(), time.perf_counter()
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        size, index = tensor.numel() * tensor.element_size(), bucket.index()

        def done(future):
            phases.record("allreduce", wall, time.perf_counter() - started, tid="allreduce", bucket=index,
                          bytes=size)
            return future.value()[0]

        return dist.all_reduce(tensor, async_op=True).get_future().then(done)

    model.register_comm_hook(None, timed_allreduce)
    return True
