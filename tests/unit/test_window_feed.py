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
    lanes = [asyncio.create_task(feed.next(None, 5.0, lane=lane)) for lane in (0, 1)]
    await asyncio.sleep(0.01)  # both lanes wait before any window is put, as at a group's start
    for seq in put_order:
        await asyncio.sleep(0)  # each put is an actor call of its own
        await feed.put(Window(seq, {0: (100 * seq, 100 * seq + 100)}))
    return [window.seq for window in await asyncio.gather(*lanes)]


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
            window = await feed.next(after, 1.0, lane=0)
            seqs.append(window.seq)
            after = window.seq
        return seqs

    assert asyncio.run(run()) == [0, 1, 2]
