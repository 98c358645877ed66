"""The worker loop's read-ahead (train/loop.py: ReadAhead): deep behind a backlog, shallow once
caught up with the stream, never past the window that stops the run. Ray Data's pipeline learns
fastest with many windows in flight (DECISIONS §1), but at the stream's pace every window ahead
holds new events back one more window."""

from __future__ import annotations

from types import SimpleNamespace

from streamlearn.ingest.windows import Window
from streamlearn.phases import Phases
from streamlearn.train.loop import ReadAhead, Startup

FULL = 1000


class Planner:
    """Rank 0's coordinator: windows of the given sizes, in turn."""

    def __init__(self, sizes: list[int], stop_at: int | None = None):
        self.sizes, self.stop_at, self.seq = list(sizes), stop_at, 0

    def next_window(self) -> Window:
        size = self.sizes.pop(0) if self.sizes else 0
        window = Window(self.seq, {0: (self.seq * FULL, self.seq * FULL + size)}, stop=self.seq == self.stop_at)
        self.seq += 1
        return window


def _ahead(planner: Planner) -> int:
    stream = SimpleNamespace(lookahead=24, lookahead_at_pace=12, prefetch=lambda window: window)
    readahead = ReadAhead(stream, planner, 0, Phases(0), Startup(None), FULL)
    readahead.fill()
    return len(readahead.ahead)


def test_behind_a_backlog_it_plans_the_stream_s_whole_lookahead():
    assert _ahead(Planner([FULL] * 100)) == 24


def test_caught_up_it_plans_only_the_lookahead_at_pace():
    assert _ahead(Planner([FULL, 10])) == 12  # the backlog's last window, then the stream's trickle
    assert _ahead(Planner([])) == 12  # an idle stream: empty windows


def test_the_window_that_stops_the_run_is_the_last_planned():
    assert _ahead(Planner([FULL] * 100, stop_at=5)) == 6
