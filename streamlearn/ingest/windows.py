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
    # ... and goes on in the next group of a resize, which restores its checkpoint: state that waits
    # (delayed feedback's reports held back from learning) stays waiting, not learned at once.
    hand_over: bool = False
    by_partition: bool = True  # each partition's range goes whole to rank partition % world
    # Joined labels: the labels topic's ranges, partition p's going to the rank that reads
    # partition p of the events (windows with labels are always by partition).
    labels: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    @property
    def label_size(self) -> int:
        return sum(end - start for start, end in self.labels.values())

    @property
    def messages(self) -> int:
        """Events and labels: what the window has to read."""
        return self.size + self.label_size

    def end_positions(self) -> dict[int, int]:
        return {p: end for p, (_, end) in self.ranges.items()}

    def label_end_positions(self) -> dict[int, int]:
        return {p: end for p, (_, end) in self.labels.items()}

    def label_slice_for(self, rank: int, world: int) -> dict[int, tuple[int, int]]:
        return {p: r for p, r in self.labels.items() if p % world == rank and r[1] > r[0]}

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
    label_positions: dict[int, int] | None = None  # joined labels: the labels topic's next offsets

    def next(self, high_watermarks: dict[int, int], *, label_highs: dict[int, int] | None = None,
             checkpoint: bool = False, stop: bool = False) -> Window:
        cap = self.window_events if self.budget is None else min(self.window_events, self.budget - self.planned)
        waiting = _waiting(self.positions, high_watermarks)
        ranges = _take(self.positions, high_watermarks, max(cap, 0) if not stop else 0)
        size = sum(end - start for start, end in ranges.values())
        labels = {} if self.label_positions is None else _take(self.label_positions, label_highs or {},
                                                                self._label_cap(label_highs or {}, size, waiting, stop))
        window = Window(self.seq, ranges, checkpoint=checkpoint, stop=stop or self.exhausted(extra=size),
                        by_partition=self.label_positions is not None or len(self.positions) >= self.world,
                        labels=labels)
        self.seq += 1
        self.planned += window.size
        return window

    def _label_cap(self, label_highs: dict[int, int], taken: int, waiting: int, stop: bool) -> int:
        """Labels take up to a window of their own (the budget counts events, and a window of labels
        only, the events all read and their labels still coming, must still move), but while events
        are behind, only the share of the labels' backlog that this window takes of the events': a
        run that starts behind (a restart after downtime) would otherwise apply every waiting report
        in its first windows, before the arrivals they correct, and hold them all at once (30
        simulated days of chargebacks: 1.5 GiB at the start where 1.0 GiB after)."""
        if stop:
            return 0
        if taken >= waiting:  # the events are caught up (or nothing waits): labels at their own pace
            return self.window_events
        backlog = _waiting(self.label_positions, label_highs)
        return min(self.window_events, math.ceil(backlog * taken / waiting))

    def available(self, high_watermarks: dict[int, int], label_highs: dict[int, int] | None = None) -> int:
        """Events (and labels) Kafka has that no window has planned yet."""
        waiting = _waiting(self.positions, high_watermarks)
        if self.label_positions is not None:
            waiting += _waiting(self.label_positions, label_highs or {})
        return waiting

    def exhausted(self, extra: int = 0) -> bool:
        return self.budget is not None and self.planned + extra >= self.budget


def _waiting(positions: dict[int, int], highs: dict[int, int]) -> int:
    return sum(max(0, high - positions.get(p, 0)) for p, high in highs.items())


def _take(positions: dict[int, int], highs: dict[int, int], cap: int) -> dict[int, tuple[int, int]]:
    """Up to `cap` offsets past `positions` (advanced in place), shared fairly across partitions."""
    for p in highs:
        positions.setdefault(p, 0)  # a partition added while running starts at its beginning
    available = {p: max(0, highs.get(p, pos) - pos) for p, pos in positions.items()}
    ranges = {p: (positions[p], positions[p] + n) for p, n in _fair_share(available, cap).items() if n > 0}
    for p, (_, end) in ranges.items():
        positions[p] = end
    return ranges


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
