"""The Ray Data lanes' window feed (ingest/raydata_source.py `WindowFeed`), as the class it is, in one
event loop: Ray runs an async actor's calls out of order, so rank 0's puts of windows 0, 1, 2 may
land 1 first. Lanes waiting for their first window must still start at window 0: started at "the
oldest held" they began at 1, never read window 0, and the group stalled 30 s later with "Ray Data
lost its slices" (issue 47)."""

from __future__ import annotations

import asyncio

from streamlearn.ingest.raydata_source import WindowFeed
from streamlearn.ingest.windows import Window

Feed = WindowFeed.__ray_metadata__.modified_class.__ray_actor_class__  # the class under @ray.remote


async def _first_windows(put_order: list[int]) -> list[int]:
    feed = Feed()
    lanes = [asyncio.create_task(feed.take(None, 1, 5.0, lane=lane)) for lane in (0, 1)]
    await asyncio.sleep(0.01)  # both lanes wait before any window is put, as at a group's start
    for seq in put_order:
        await asyncio.sleep(0)  # each put is an actor call of its own
        await feed.put(Window(seq, {0: (100 * seq, 100 * seq + 100)}))
    return [window.seq for taken in await asyncio.gather(*lanes) for window in taken]


def test_lanes_start_at_window_0_whatever_order_the_puts_ran_in():
    assert asyncio.run(_first_windows([1, 2, 0])) == [0, 0]
    assert asyncio.run(_first_windows([0, 1, 2])) == [0, 0]


def test_a_lane_takes_windows_in_seq_order_after_its_first():
    async def run() -> list[int]:
        feed = Feed()
        for seq in (2, 0, 1):
            await feed.put(Window(seq, {}))
        seqs, after = [], None
        for _ in range(3):
            [window] = await feed.take(after, 1, 1.0, lane=0)
            seqs.append(window.seq)
            after = window.seq
        return seqs

    assert asyncio.run(run()) == [0, 1, 2]


def test_a_lane_takes_the_windows_held_after_its_last_at_once_and_waits_for_the_first_only():
    # Ray Data's cost is per block: a lane behind a backlog sends what the feed holds in one.
    async def run() -> list[list[int]]:
        feed = Feed()
        for seq in (0, 1, 2, 4):  # 3 not put yet: a run stops at the gap
            await feed.put(Window(seq, {}))
        got = [[w.seq for w in await feed.take(None, 8, 1.0, lane=0)],
               [w.seq for w in await feed.take(0, 1, 1.0, lane=0)]]
        waiting = asyncio.create_task(feed.take(2, 8, 5.0, lane=0))
        await asyncio.sleep(0.01)
        await feed.put(Window(3, {}))
        got.append([w.seq for w in await waiting])
        await feed.put(Window(5, {}, stop=True))
        await feed.put(Window(6, {}))
        got.append([w.seq for w in await feed.take(4, 8, 1.0, lane=0)])  # nothing after the stop
        got.append([w.seq for w in await feed.take(6, 8, 0.05, lane=0)])  # none in time
        return got

    assert asyncio.run(run()) == [[0, 1, 2], [1], [3, 4], [5], []]
