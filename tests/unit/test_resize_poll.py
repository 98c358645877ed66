"""Rank 0 hears "stop for a resize" or "drain" beside training: a plan reads the answer the
poller already has, instead of asking at the plan and reading the answer one window later. The
controller here is a queue of answers the test hands out; tests/integration/test_autoscale.py and
test_resize.py run the same code against a real controller, Ray Train groups and a broker, and
the fault tests end their runs with a real drain (test_faults.finish_training)."""

from __future__ import annotations

import queue

from streamlearn.config import TrainConfig
from streamlearn.ingest.windows import WindowPlanner
from streamlearn.train.coordinator import Coordinator, StopPoller


class Backlog:
    """A broker with a backlog that never runs out: every plan is a full window."""

    def partitions(self) -> list[int]:
        return [0]

    def watermarks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        return {0: (0, 10**9)}


class Topic:
    """A broker whose partition 0 holds `high` events: the test moves it."""

    def __init__(self, high: int):
        self.high = high

    def partitions(self) -> list[int]:
        return [0]

    def watermarks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        return {0: (0, self.high)}


def coordinator_with(poller: StopPoller, broker=None) -> Coordinator:
    cfg = TrainConfig(topic="t", checkpoint_every_s=1e9, checkpoint_every_steps=10**9, workers=1,
                      poll_interval_s=0.001)
    c = Coordinator(cfg, broker or Backlog(), WindowPlanner(positions={0: 0}, window_events=1000),
                    expected_steps_per_event=0.0, controller=object())
    c._stop_poller = poller
    poller.start()
    return c


def test_the_plan_after_the_answer_stops_and_nobody_asks_again():
    answers, asked = queue.Queue(), []

    def ask():
        asked.append(1)
        return answers.get(timeout=5)

    poller = StopPoller(ask, poll_s=0.001)
    c = coordinator_with(poller)
    answers.put((None, None))
    answers.put((None, None))
    assert not c.next_window().stop  # no resize due yet: the group learns on
    answers.put((2, None))  # a warm group of 2 is ready: the controller says stop
    poller.join(5)
    window = c.next_window()
    assert window.stop and window.checkpoint and c.resize_to == 2  # this very plan, not the next one
    assert window.hand_over  # the run goes on in the next group: what waits stays waiting
    assert len(asked) == 3  # one answer per group: the poller asked no more once it had it
    assert c.next_window().stop  # and every later plan (none are made) would stop too


def test_a_failed_ask_is_asked_again_and_close_stops_asking():
    calls = []

    def ask():
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("controller busy")
        return None, None

    poller = StopPoller(ask, poll_s=0.001)
    c = coordinator_with(poller)
    while len(calls) < 3:  # it went on after the failure
        assert not c.next_window().stop
    c.close()
    poller.join(5)
    assert not poller.is_alive() and poller.answer is None


def test_a_drain_stops_at_the_first_empty_plan_past_its_offsets_not_at_a_leader_s_lagging_answer():
    drain_to = {}
    poller = StopPoller(lambda: (None, dict(drain_to) or None), poll_s=0.001)
    topic = Topic(high=1000)
    c = coordinator_with(poller, topic)
    first = c.next_window()
    assert (first.size, first.stop) == (1000, False)
    drain_to[0] = 3200  # `streamlearn drain`: the topic held 3,200 events when it asked
    while poller.drain_to is None:
        pass
    topic.high = 900  # a new leader answers a high watermark behind the old one's: nothing new, for now
    dip = c.next_window()
    assert dip.size == 0 and not dip.stop  # not past the drain's offsets: not the end
    topic.high = 3200
    planned = [first, dip]
    for _ in range(20):  # 3 windows and the empty stop; an ignored drain never stops
        planned.append(c.next_window())
        if planned[-1].stop:
            break
    assert sum(w.size for w in planned) == 3200  # nothing the topic held was left to a later run
    assert planned[-1].size == 0 and planned[-1].checkpoint  # it ends at an empty plan, at a checkpoint
    assert not planned[-1].hand_over  # the run's end: no group restores it
    assert all(not w.stop for w in planned[:-1])
    c.close()


def test_without_a_drain_an_empty_plan_is_only_idle():
    poller = StopPoller(lambda: (None, None), poll_s=0.001)
    c = coordinator_with(poller, Topic(high=0))
    assert not any(c.next_window().stop for _ in range(20))
    c.close()
