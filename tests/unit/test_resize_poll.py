"""Rank 0 hears "stop for a resize" beside training: a plan reads the answer the poller already
has, instead of asking at the plan and reading the answer one window later. The controller
here is a queue of answers the test hands out; tests/integration/test_autoscale.py and
test_resize.py run the same code against a real controller, Ray Train groups and a broker."""

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


def coordinator_with(poller: StopPoller) -> Coordinator:
    cfg = TrainConfig(topic="t", checkpoint_every_s=1e9, checkpoint_every_steps=10**9, workers=1)
    c = Coordinator(cfg, Backlog(), WindowPlanner(positions={0: 0}, window_events=1000), expected_steps_per_event=0.0,
                    controller=object())
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
    answers.put(None)
    answers.put(None)
    assert not c.next_window().stop  # no resize due yet: the group learns on
    answers.put(2)  # a warm group of 2 is ready: the controller says stop
    poller.join(5)
    window = c.next_window()
    assert window.stop and window.checkpoint and c.resize_to == 2  # this very plan, not the next one
    assert len(asked) == 3  # one answer per group: the poller asked no more once it had it
    assert c.next_window().stop  # and every later plan (none are made) would stop too


def test_a_failed_ask_is_asked_again_and_close_stops_asking():
    calls = []

    def ask():
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("controller busy")
        return None

    poller = StopPoller(ask, poll_s=0.001)
    c = coordinator_with(poller)
    while len(calls) < 3:  # it went on after the failure
        assert not c.next_window().stop
    c.close()
    poller.join(5)
    assert not poller.is_alive() and poller.answer is None
