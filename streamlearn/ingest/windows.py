"""Offset windows: the unit of reading, training and exactly-once bookkeeping.

Rank 0 plans each window from the partitions' high watermarks and broadcasts it. With at
least as many partitions as ranks, each partition belongs to one rank (partition % world)
and that rank reads its whole range, window after window: its reads are contiguous, so
its consumer never seeks and what it prefetched is never thrown away (slicing every
partition's range across ranks made each rank fetch the others' events too and seek every
window: 1 s per 2-rank window, measured). DDP averages every step's gradient over all
ranks, so each step still learns from every partition. With fewer partitions than ranks,
each range is cut into contiguous per-rank slices instead. Checkpoints fall on window
boundaries, so "learned through offset X" is exact: nothing past the watermark is ever
half-learned, and a replay from a checkpoint starts clean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Window:
    seq: int
    ranges: dict[int, tuple[int, int]]  # partition -> [start, end) offsets
    checkpoint: bool = False  # checkpoint once this window is learned
    stop: bool = False  # the run ends after this window (it may be empty)
    by_partition: bool = True  # each partition's range goes whole to rank partition % world

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    def end_positions(self) -> dict[int, int]:
        return {p: end for p, (_, end) in self.ranges.items()}

    def slice_for(self, rank: int, world: int) -> dict[int, tuple[int, int]]:
        """This rank's ranges: its own partitions' whole ranges, or a contiguous share of each."""
        if self.by_partition:
            return {p: r for p, r in self.ranges.items() if p % world == rank and r[1] > r[0]}
        out = {}
        for p, (start, end) in self.ranges.items():
            n = end - start
            lo, hi = start + n * rank // world, start + n * (rank + 1) // world
            if hi > lo:
                out[p] = (lo, hi)
        return out


@dataclass
class WindowPlanner:
    """Turns "where we are" and "what Kafka has" into the next window. Runs on rank 0 only."""

    positions: dict[int, int]  # partition -> next offset to read
    window_events: int
    budget: int | None = None  # events left before the run stops (--max-events)
    world: int = 1  # ranks the windows are read by
    seq: int = 0
    planned: int = field(default=0)

    def next(self, high_watermarks: dict[int, int], *, checkpoint: bool = False, stop: bool = False) -> Window:
        for p in high_watermarks:
            self.positions.setdefault(p, 0)  # a partition added while running starts at its beginning
        available = {p: max(0, high_watermarks.get(p, pos) - pos) for p, pos in self.positions.items()}
        cap = self.window_events if self.budget is None else min(self.window_events, self.budget - self.planned)
        take = _fair_share(available, max(cap, 0)) if not stop else {}
        ranges = {p: (self.positions[p], self.positions[p] + n) for p, n in take.items() if n > 0}
        for p, (_, end) in ranges.items():
            self.positions[p] = end
        window = Window(self.seq, ranges, checkpoint=checkpoint, stop=stop or self.exhausted(extra=sum(take.values())),
                        by_partition=len(self.positions) >= self.world)
        self.seq += 1
        self.planned += window.size
        return window

    def available(self, high_watermarks: dict[int, int]) -> int:
        """Events Kafka has that no window has planned yet."""
        return sum(max(0, high - self.positions.get(p, 0)) for p, high in high_watermarks.items())

    def exhausted(self, extra: int = 0) -> bool:
        return self.budget is not None and self.planned + extra >= self.budget


def _fair_share(available: dict[int, int], cap: int) -> dict[int, int]:
    """Split `cap` across partitions in proportion to what each has, never more than it has.

    Proportional rather than first-come keeps a hot partition from starving the others'
    freshness, and keeps every partition's lag falling at the same relative pace.
    """
    total = sum(available.values())
    if total <= cap:
        return dict(available)
    take = {p: min(n, math.floor(cap * n / total)) for p, n in available.items()}
    leftover = cap - sum(take.values())
    for p in sorted(available, key=lambda p: available[p] - take[p], reverse=True):
        if leftover <= 0:
            break
        extra = min(leftover, available[p] - take[p])
        take[p] += extra
        leftover -= extra
    return take
