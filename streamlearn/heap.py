"""Python's garbage collector on the stream's hot paths: a window's objects die young, while the
process's heap (torch, Ray, the model) lives as long as the process.

With Python's defaults the collector walks the young objects every 700 allocations and, every
hundred of those, the whole heap: ~320k objects in a process that has imported torch and Ray
Train. A window allocates tens of thousands of tracked objects (each Kafka message is one), so
reading 600k events in such a process spent 1.3-1.7 s of its 2.2-3.2 s in collections, and the
trainer learns 8-26 % more events a second with the setting below (docs/DECISIONS.md §1 has the
figures). Nearly all of that garbage is freed by reference counting the moment it
is dropped; the collector exists for cycles, which the hot paths hardly make.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Allocations between young-generation collections: about one window's worth (8192 events, a
# message and a few containers each), so a window triggers one or two, not a hundred.
YOUNG_THRESHOLD = 50_000


def quiet_for_streaming() -> None:
    """For a process that streams until it ends (a Ray Train worker): freeze the heap built so
    far out of every collection and collect the young generation once per YOUNG_THRESHOLD
    allocations. Call it once start-up has imported and built what the loop needs. Cycles that
    start-up left behind stay (frozen objects are never collected): a one-time, bounded cost."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


@contextmanager
def quiet_while_streaming() -> Iterator[None]:
    """The same for a stretch of a process that others share (a Ray Data read lane runs in one of
    Ray's pooled workers): the collector's settings and its frozen heap are put back after."""
    thresholds = gc.get_threshold()
    quiet_for_streaming()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
