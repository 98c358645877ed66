from types import SimpleNamespace

from streamlearn.config import TrainConfig
from streamlearn.ingest.windows import Window, WindowPlanner, _fair_share
from streamlearn.train.lineage import Lineage
from streamlearn.train.loop import _coordinator


def test_each_partition_goes_whole_to_one_rank_and_every_offset_once():
    window = Window(0, {0: (10, 21), 1: (0, 3), 2: (5, 5), 3: (7, 9)})
    for world in (1, 2, 3, 4):
        seen = {p: [] for p in window.ranges}
        for rank in range(world):
            for p, (lo, hi) in window.slice_for(rank, world).items():
                assert p % world == rank  # the same rank every window: its reads stay contiguous
                seen[p].extend(range(lo, hi))
        for p, (start, end) in window.ranges.items():
            assert seen[p] == list(range(start, end))


def test_planner_splits_ranges_only_with_fewer_partitions_than_ranks():
    assert WindowPlanner({0: 0, 1: 0}, window_events=100, world=2).next({0: 50, 1: 50}).by_partition
    assert not WindowPlanner({0: 0}, window_events=100, world=2).next({0: 50}).by_partition


def test_slices_cover_each_range_exactly_once_and_evenly():
    window = Window(0, {0: (10, 21), 1: (0, 3), 2: (5, 5)}, by_partition=False)
    for world in (1, 2, 3, 5):
        seen = {p: [] for p in window.ranges}
        for rank in range(world):
            for p, (lo, hi) in window.slice_for(rank, world).items():
                seen[p].extend(range(lo, hi))
        for p, (start, end) in window.ranges.items():
            assert seen[p] == list(range(start, end))
        sizes = [sum(hi - lo for lo, hi in window.slice_for(r, world).values()) for r in range(world)]
        assert max(sizes) - min(sizes) <= len(window.ranges)


def test_planner_advances_and_caps_the_window():
    planner = WindowPlanner({0: 0, 1: 0}, window_events=100)
    first = planner.next({0: 80, 1: 80})
    assert first.size == 100 and first.ranges[0][0] == 0
    second = planner.next({0: 80, 1: 80})
    assert second.size == 60
    assert {p: r[0] for p, r in second.ranges.items()} == first.end_positions()
    assert planner.next({0: 80, 1: 80}).size == 0


def test_budget_stops_exactly_at_max_events():
    planner = WindowPlanner({0: 0}, window_events=40, budget=100)
    sizes = []
    while True:
        w = planner.next({0: 1000})
        sizes.append(w.size)
        if w.stop:
            break
    assert sum(sizes) == 100


def test_new_partition_starts_at_zero():
    planner = WindowPlanner({0: 5}, window_events=100)
    w = planner.next({0: 10, 1: 3})
    assert w.ranges == {0: (5, 10), 1: (0, 3)}


def test_fair_share_is_proportional_and_exact():
    take = _fair_share({0: 1000, 1: 10, 2: 0}, 101)
    assert sum(take.values()) == 101 and take[2] == 0 and take[1] >= 1
    assert _fair_share({0: 3, 1: 4}, 100) == {0: 3, 1: 4}


def test_labels_backlog_drains_at_the_events_pace_then_at_its_own():
    """A run that starts behind on both topics reads its labels no faster than its events (a
    report read before its arrival row is corrected before it is learned, and a whole backlog of
    reports read at once is held at once); once the events are caught up, labels take a window."""
    planner = WindowPlanner({0: 0, 1: 0}, window_events=1000, label_positions={0: 0, 1: 0})
    events, labels = {0: 5000, 1: 5000}, {0: 500, 1: 500}
    shares = []
    while planner.available(events, labels):
        window = planner.next(events, label_highs=labels)
        shares.append((window.size, window.label_size))
    # Nine windows of events carry a tenth of the labels each; the last takes the rest.
    assert shares[:9] == [(1000, 100)] * 9 and shares[9] == (1000, 100) and len(shares) == 10
    # Caught up: new labels are read a window at a time, with no event waiting.
    labels = {0: 2000, 1: 2000}
    assert planner.next(events, label_highs=labels).label_size == 1000
    assert planner.next(events, label_highs=labels).label_size == 1000
    # The stop window reads nothing.
    assert planner.next(events, label_highs={0: 9000, 1: 9000}, stop=True).label_size == 0


def test_behind_a_backlog_each_rank_of_a_group_past_two_gets_half_a_window_between_averages():
    """The group's coordinator (train/loop._coordinator, what rank 0 builds) plans `window_events`
    for 1 or 2 ranks and half of it a rank beyond: with --sync window each window ends in an
    average of the ranks' weights, and a fixed window split 4 ways averaged twice as often per
    event (docs/BENCHMARKS.md, "What a worker costs")."""
    class Backlog:  # 8 partitions, each far behind
        def partitions(self):
            return list(range(8))

        def watermarks(self, partitions):
            return {p: (0, 10**9) for p in partitions}

    def planned(world: int, **cfg) -> int:
        stream = SimpleNamespace(reader=Backlog(), read_lanes=world)
        lineage = Lineage(topic="t", start_offsets={p: 0 for p in range(8)}, positions={p: 0 for p in range(8)})
        coordinator = _coordinator(TrainConfig(topic="t", workers=world, **cfg), stream, lineage, world, None, 0)
        return coordinator.next_window().size

    assert [planned(w) for w in (1, 2, 3, 4, 8)] == [8192, 8192, 12288, 16384, 32768]
    assert [planned(w, window_events=1000) for w in (2, 4)] == [1000, 2000]  # a chosen size scales alike
