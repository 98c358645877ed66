"""A Ray Data read lane lives exactly as long as its group: it ends when the group's window feed
is gone, whether it was waiting for the next window or for events that never come (a stopped
broker, offsets not yet written). Before, a lane of a finished test's group kept reading a
stopped broker for minutes beside the next test's Dataset (the CI stall in DECISIONS §1).
And a lane reads and decodes in one task: Ray Data fuses the two stages."""

from __future__ import annotations

import contextlib
import io
import time

import ray

from streamlearn.ingest.raydata_source import WindowFeed, build, read_lane
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import load_pipeline


@ray.remote(num_cpus=0.1)
def _lane(settings, topic, feed, fetch_timeout_s) -> int:
    return sum(1 for _ in read_lane(settings, topic, "lanes-test", feed, 0, 1, fetch_timeout_s=fetch_timeout_s))


def _ends_soon(ref, within_s: float) -> int:
    ready, _ = ray.wait([ref], timeout=within_s)
    assert ready, f"the lane still ran {within_s:.0f} s after its feed was gone"
    return ray.get(ref)


def _lanes(feed, within_s: float) -> dict:
    deadline = time.monotonic() + within_s
    while not (lanes := ray.get(feed.state.remote())["lanes"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lanes, f"no lane asked the feed for a window within {within_s:.0f} s"
    return lanes


def test_a_lane_waiting_for_its_next_window_ends_with_its_feed(kafka_settings, ray_cluster, topic):
    feed = WindowFeed.remote()
    lane = _lane.remote(kafka_settings, topic, feed, 2.0)
    # The lane is asking for a window no one feeds (once its task has started: seconds on a busy machine).
    assert _lanes(feed, within_s=60)[0]["after"] is None
    ray.kill(feed)
    assert _ends_soon(lane, 30) == 0


def test_a_lane_waiting_on_kafka_ends_with_its_feed(kafka_settings, ray_cluster, topic):
    feed = WindowFeed.remote()
    ray.get(feed.put.remote(Window(seq=1, ranges={0: (0, 10)})))  # ten events that are never written
    lane = _lane.remote(kafka_settings, topic, feed, 2.0)
    _lanes(feed, within_s=60)
    time.sleep(5)  # past one fetch timeout: the lane found its feed alive and reads on
    ready, _ = ray.wait([lane], timeout=0)
    assert not ready, "a lane gave up on a window while its group lived"
    ray.kill(feed)
    assert _ends_soon(lane, 30) == 0


def test_a_lane_reads_and_decodes_in_one_task(kafka_settings, ray_cluster, topic):
    """Ray Data fuses the decode into the read only while both ask the same CPUs and pool size;
    unfused, the decode is a stage of its own (more processes, an object-store hop per slice)
    and the mode learned at 0.72x the direct path instead of 0.95x (DECISIONS.md §1)."""
    ctx = ray.data.DataContext.get_current()
    saved = ctx.target_max_block_size, ctx.enable_progress_bars  # build() sets both for its group
    feed = WindowFeed.remote()
    try:
        ds = build(kafka_settings, topic, "fused-test", load_pipeline("fraud"), feed, 2, "fused-test")
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            ds.explain()  # plans only: nothing runs
        optimized = shown.getvalue().split("Physical Plan (Optimized)")[-1]
        assert "TaskPoolMapOperator[ReadKafkaWindows->MapBatches(decode)]" in optimized, shown.getvalue()
    finally:
        ray.kill(feed)
        ctx.target_max_block_size, ctx.enable_progress_bars = saved
