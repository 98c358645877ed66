"""A Ray Data read lane lives exactly as long as its group: it ends when the group's window feed
is gone, whether it was waiting for the next window or for events that never come (a stopped
broker, offsets not yet written). Before, a lane of a finished test's group kept reading a
stopped broker for minutes beside the next test's Dataset and stalled CI.
And a lane reads and decodes in one task, with no stage after it; and every lane starts,
whatever a dead group left in Ray's AutoscalingCoordinator."""

from __future__ import annotations

import contextlib
import io
import re
import threading
import time

import pytest
import ray
from ray.data._internal.cluster_autoscaler import DefaultAutoscalingCoordinator, ResourceRequestPriority
from ray.util.placement_group import remove_placement_group

from streamlearn.ingest.raydata_source import WindowFeed, build, read_lane, reserve_lanes
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import load_pipeline

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=0.1)
def _lane(settings, topic, feed, fetch_timeout_s) -> int:
    return sum(1 for _ in read_lane(settings, topic, "lanes-test", feed, 0, 1, load_pipeline("fraud"),
                                    fetch_timeout_s=fetch_timeout_s))


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


@pytest.fixture
def lanes_dataset(kafka_settings, topic):
    """`build` for a test, its feed and placement group removed after, and the process's
    DataContext (which build() sets for its group) put back."""
    ctx = ray.data.DataContext.get_current()
    saved = (ctx.target_max_block_size, ctx.enable_progress_bars, ctx.scheduling_strategy,
             ctx.scheduling_strategy_large_args)
    made = []

    def make(name: str):
        feed, room = WindowFeed.remote(), reserve_lanes(f"{name}-lanes", 2)
        made.append((feed, room))
        return feed, build(kafka_settings, topic, name, load_pipeline("fraud"), feed, 2, name, room)

    yield make
    for feed, room in made:
        ray.kill(feed)
        remove_placement_group(room)
    (ctx.target_max_block_size, ctx.enable_progress_bars, ctx.scheduling_strategy,
     ctx.scheduling_strategy_large_args) = saved


def test_a_lane_reads_and_decodes_in_one_task(ray_cluster, lanes_dataset):
    """The lanes decode what they read: the Dataset's plan is the read alone. A decode stage of
    its own, even one Ray Data fuses into the read, takes the raw messages as a pickled row (~12 %
    of a lane's CPU); as actors it added two processes and an object-store hop per slice (0.72x
    the direct path instead of 0.95x; DECISIONS.md §1)."""
    _, ds = lanes_dataset("fused-test")
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        ds.explain()  # plans only: nothing runs
    optimized = shown.getvalue().split("Physical Plan (Optimized)")[-1]
    assert re.findall(r"\w+Operator\[([^\]]*)\]", optimized) == ["ReadKafkaWindows"], shown.getvalue()


def test_every_lane_starts_while_a_dead_group_s_requests_hold_the_cluster(ray_cluster, lanes_dataset, topic):
    """A group that died leaves its Train and Data requests in Ray's AutoscalingCoordinator for up
    to 180 s. Ray Data sized a new Dataset's budget from what the coordinator had left for it, and
    with nothing left started one lane of two: the ranks waited 57 s for the other lane's slices
    (DECISIONS §1). Scheduled into the lanes' own placement group, both start at once."""
    stale = DefaultAutoscalingCoordinator(requester_id=f"dead-group-{topic}")
    stale.request_resources([{"CPU": ray.cluster_resources()["CPU"]}], expire_after_s=120,
                            priority=ResourceRequestPriority.HIGH)
    feed, ds = lanes_dataset(f"starved-{topic}")
    iterator = ds.streaming_split(1, equal=False)[0]
    # Pulling starts the Dataset; no window is fed, so the lanes only ask the feed for one.
    pulling = threading.Thread(target=_pull_all, args=(iterator,), daemon=True)
    pulling.start()
    try:
        deadline = time.monotonic() + 60
        while len(asked := ray.get(feed.state.remote())["lanes"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sorted(asked) == [0, 1], f"lanes that asked the feed for a window within 60 s: {sorted(asked)}"
    finally:
        stale.cancel_request()
        ray.kill(feed)  # the lanes end, and with them the Dataset and the pull
        pulling.join(60)


def _pull_all(iterator) -> None:
    try:
        for _ in iterator.iter_batches(batch_size=None, prefetch_batches=0):
            pass
    except Exception:  # noqa: BLE001 -- the Dataset may end in an error once its feed is gone: not the test's
        pass
