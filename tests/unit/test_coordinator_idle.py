"""Rank 0's idle stop (--until-idle): only a broker answering "nothing new" counts as idle.

The reader here is a script of what the broker answers, and the clock is the test's, so
each case states exactly what rank 0 saw and when. The integration tests run the same
code against a real broker that really stops (tests/integration/test_faults.py).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from streamlearn.config import TrainConfig
from streamlearn.ingest.windows import WindowPlanner
from streamlearn.train.coordinator import MAX_IDLE_TICK_S, Coordinator

DOWN = "down"


class ScriptedBroker:
    """Answers the coordinator's questions from a list: a high watermark, or DOWN."""

    def __init__(self, answers: list):
        self.answers = list(answers)

    def partitions(self) -> list[int]:
        return [0]

    def watermarks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        answer = self.answers.pop(0)
        if answer == DOWN:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return {0: (0, answer)}


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def plan(answers: list, gaps: list[float], until_idle_s: float = 10.0) -> list:
    """The windows planned for each answer, `gaps[i]` seconds after the previous plan, up to
    the first stop (the training loop asks for no window after it)."""
    clock = Clock()
    cfg = TrainConfig(topic="t", until_idle_s=until_idle_s, poll_interval_s=0.001, checkpoint_every_s=1e9,
                      checkpoint_every_steps=10**9, workers=1)
    coordinator = Coordinator(cfg, ScriptedBroker(answers), WindowPlanner(positions={0: 0}, window_events=1000),
                              expected_steps_per_event=0.0, clock=clock)
    windows = []
    for gap in gaps:
        clock.t += gap
        windows.append(coordinator.next_window())
        if windows[-1].stop:
            break
    return windows


def stops(windows: list) -> list[int]:
    return [i for i, w in enumerate(windows) if w.stop]


def test_stops_after_the_stream_was_seen_empty_for_until_idle():
    # Data once, then an empty answer every second: the clock starts at the first empty answer.
    windows = plan([5] + [5] * 20, [1.0] * 21)
    assert windows[0].size == 5
    assert stops(windows) == [11]  # empty answers at t=1..11: 10 s seen empty


def test_new_data_restarts_the_idle_clock():
    windows = plan([5, 5, 5, 5, 5, 9] + [9] * 20, [1.0] * 26)
    assert windows[5].size == 4 and not windows[5].stop
    assert stops(windows) == [16]


def test_an_unreachable_broker_is_not_an_idle_stream():
    # Empty for 8 s, down for a minute, back with nothing new: idle counts again from its return.
    answers = [5] + [5] * 8 + [DOWN] * 30 + [5] * 20
    windows = plan(answers, [1.0] * 9 + [2.0] * 30 + [1.0] * 20)
    assert stops(windows) == [39 + 10]


def test_time_blocked_between_plans_is_not_idle_time():
    # The CI failure: a checkpoint's offset commit waited out a 50 s outage between two plans.
    # The next empty answer adds at most MAX_IDLE_TICK_S, so the run goes on and learns the
    # events that arrive a few seconds later.
    windows = plan([5, 5, 5, 5, 7], [1.0, 1.0, 1.0, 50.0, 3.0])
    assert not stops(windows)
    assert windows[4].size == 2


def test_an_idle_stop_never_leaves_data_it_has_just_seen():
    # Idle long enough, but this answer has data: learn it instead of stopping.
    windows = plan([5] + [5] * 11 + [8, 8, 8], [1.0] * 15, until_idle_s=10.0)
    assert stops(windows) == [11]  # the stop came before the data arrived, at the 10 s mark
    windows = plan([5] + [5] * 10 + [8] + [8] * 11, [1.0] * 23, until_idle_s=10.0)
    assert windows[11].size == 3 and not windows[11].stop
    assert stops(windows) == [22]


def test_one_plan_adds_at_most_max_idle_tick():
    windows = plan([5] * 12, [1.0] + [MAX_IDLE_TICK_S * 3] * 11, until_idle_s=10.0)
    assert stops(windows) == [6]  # five ticks of MAX_IDLE_TICK_S after the first empty answer
