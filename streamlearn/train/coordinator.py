"""Rank 0's job: decide each window, and when to checkpoint and stop; every rank obeys.

One rank deciding and broadcasting is what keeps DDP in lockstep on a live stream: all
ranks take the same windows, the same number of steps, checkpoint at the same window and
stop at the same window, so no rank is ever left waiting at a collective.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from confluent_kafka import KafkaException

from streamlearn import faults
from streamlearn.autoscale.controller import call
from streamlearn.config import TrainConfig
from streamlearn.errors import KafkaUnavailable
from streamlearn.ingest.reader import RangeReader
from streamlearn.ingest.windows import Window, WindowPlanner
from streamlearn.logs import log

# The most one plan adds to the idle clock: an empty plan comes every poll interval plus a few
# collectives; anything longer was time blocked elsewhere, not the stream seen empty.
MAX_IDLE_TICK_S = 2.0
# While the backlog already seen covers a whole window, plan from the watermarks last asked
# for, this long at most: a query is a broker round trip per partition, on every window.
MAX_WATERMARK_AGE_S = 1.0
# How often rank 0 asks the controller, beside training, whether to stop (a resize, a drain).
RESIZE_POLL_S = 0.5


def await_handover(controller, gen: int, rank: int, poll_s: float = 0.1) -> bool:
    """A warm group's workers, up and before restoring: wait until the running group has stopped
    at a checkpoint (True: restore it and learn), or the resize was called off (False: go home).
    Every rank asks the controller itself: a wait in a collective would time out."""
    if rank == 0 and call(controller.warm_ready, gen):
        log("handover_waiting", gen=gen)
    while (answer := call(controller.handover, gen)) == "wait":
        time.sleep(poll_s)
    if answer == "go":
        faults.point("handover_go")
    return answer == "go"


@dataclass
class Coordinator:
    cfg: TrainConfig
    reader: RangeReader
    planner: WindowPlanner
    expected_steps_per_event: float
    world: int = 1
    controller: Any = None  # this run's ScaleController handle (None: fixed size, e.g. in tests)
    label_reader: RangeReader | None = None  # joined labels: where the labels topic's watermarks come from
    checkpoint_at_stop: bool = False  # the last window checkpoints even if it planned nothing (loop._holds_reports)
    clock: Callable[[], float] = time.monotonic
    last_checkpoint_t: float = field(default_factory=time.monotonic)
    idle_s: float = 0.0  # how long the broker has answered "nothing new", at the loop's own pace
    planned_since_checkpoint: int = 0
    _partitions: list[int] = field(default_factory=list)
    _partitions_t: float = 0.0
    _last_empty: bool = False
    _empty_answer_t: float | None = None  # when the broker last answered "nothing new"
    _learned: int = 0
    _stop_poller: StopPoller | None = None
    _highs: dict[int, int] | None = None
    _label_highs: dict[int, int] | None = None
    _highs_t: float = 0.0
    resize_to: int | None = None

    def next_window(self) -> Window:
        if self._last_empty:
            time.sleep(self.cfg.poll_interval_s)  # nothing new last time: don't spin on the broker
        highs = self._high_watermarks()
        now = self.clock()
        self._track_idle(highs, now)
        idle = self._idle_stop(highs)
        resize = not idle and self._resize_due()  # a run that ends asks the controller nothing
        window = self.planner.next(highs or {}, label_highs=self._label_highs if highs else None, stop=idle or resize)
        if window.stop and resize:
            window = replace(window, hand_over=True)
        self._last_empty = window.messages == 0
        self.planned_since_checkpoint += window.messages
        due = (now - self.last_checkpoint_t >= self.cfg.checkpoint_every_s
               or self.planned_since_checkpoint * self.expected_steps_per_event >= self.cfg.checkpoint_every_steps)
        if (self.planned_since_checkpoint and (due or window.stop)) or (window.stop and self.checkpoint_at_stop):
            window = replace(window, checkpoint=True)
            self.planned_since_checkpoint = 0
            self.last_checkpoint_t = now
        return window

    def _high_watermarks(self) -> dict[int, int] | None:
        """partition -> next offset to be written; None while the broker cannot answer."""
        now = self.clock()
        if (self._highs and now - self._highs_t < MAX_WATERMARK_AGE_S
                and self.planner.available(self._highs) >= self.planner.window_events):
            return self._highs
        try:
            partitions = self._current_partitions()
            self._highs = {p: high for p, (_low, high) in self.reader.watermarks(partitions).items()}
            if self.label_reader is not None:  # the labels topic has the events topic's partitions
                self._label_highs = {p: high for p, (_low, high) in self.label_reader.watermarks(partitions).items()}
            self._highs_t = now
            return self._highs
        except (KafkaException, KafkaUnavailable) as e:
            # Broker away: plan nothing and ask again. Training idles instead of failing the
            # run, and every rank keeps waiting in the plan broadcast, not in an allreduce.
            log("kafka_unreachable", level="warning", error=str(e)[:200])
            return None

    def _track_idle(self, highs: dict[int, int] | None, now: float) -> None:
        """Idle is the broker answering "nothing new" plan after plan, for --until-idle.

        An unreachable broker is not an empty stream (a run ended mid-outage with events still
        to come). Nor is time spent blocked between two plans: a checkpoint's offset commit
        waits out a broker outage, and a CI run stopped the moment the broker came back, its
        idle clock having run through the whole outage. So one plan adds at most
        MAX_IDLE_TICK_S, and the clock restarts whenever there is data or no answer.
        """
        if highs is None or self.planner.available(highs, self._label_highs):
            self.idle_s, self._empty_answer_t = 0.0, None
            return
        if self._empty_answer_t is not None:
            self.idle_s += min(now - self._empty_answer_t, max(MAX_IDLE_TICK_S, 2 * self.cfg.poll_interval_s))
        self._empty_answer_t = now

    def _idle_stop(self, highs: dict[int, int] | None) -> bool:
        """--until-idle's stop, once the stream has been empty that long, and a drain's: the first
        plan that finds nothing new (always a fresh query of the broker) once every event the topic
        held when `streamlearn drain` asked is planned."""
        if self.cfg.until_idle_s is not None and self.idle_s >= self.cfg.until_idle_s:
            return True
        poller = self._poller()
        drain_to = poller.drain_to if poller is not None else None
        if drain_to is None or highs is None or self.planner.available(highs, self._label_highs):
            return False
        return all(self.planner.positions.get(p, 0) >= end for p, end in drain_to.items())

    def learned(self, window: Window) -> None:
        """After a window is learned: tell the controller (its learned rate, a resize's end).
        The last report before a resize waits for delivery, so the pause is measured from it.
        No other report waits: the controller's sampler holds its lock through calls to Ray's
        autoscaler, and a run's last window waited 0.3-1.3 s on it (profiled)."""
        if self.controller is None or not window.size and not window.stop:
            return
        if not self._learned:  # the group's first window: a resize's warm pool starts workers in this env
            self.controller.learn_env.remote("worker", ray.get_runtime_context().get_runtime_env_string())
        self._learned += window.size
        ref = self.controller.progress.remote(self._learned, self.world, time.time())
        if window.stop and self.resize_to is not None:
            ray.get(ref, timeout=10)

    def stopped(self) -> None:
        """After the checkpoint a resize stopped at: the next group may restore it now."""
        if self.controller is not None and self.resize_to is not None:
            faults.point("handover_stop_published")
            call(self.controller.group_stopped)

    def _resize_due(self) -> bool:
        """Whether to stop at the window planned now, for a resize. The controller's answer comes
        from a thread beside training (StopPoller): a plan never waits on the controller, and
        reads an answer that came while the last window trained, not one asked for at this plan."""
        if self.controller is None or self.resize_to is not None:
            return self.resize_to is not None
        self.resize_to = self._poller().answer
        if self.resize_to is not None:
            log("resize_stop", workers=self.world, to=self.resize_to)
        return self.resize_to is not None

    def _poller(self) -> StopPoller | None:
        """The controller's answers, asked beside training (None: no controller, e.g. in tests)."""
        if self._stop_poller is None and self.controller is not None:
            controller = self.controller
            self._stop_poller = StopPoller(lambda: ray.get(controller.stop_due.remote(), timeout=10))
            self._stop_poller.start()
        return self._stop_poller

    def close(self) -> None:
        if self._stop_poller is not None:
            self._stop_poller.close()

    def _current_partitions(self) -> list[int]:
        # Partitions can be added to a live topic; look again every few seconds, not every window.
        now = self.clock()
        if now - self._partitions_t > 5.0 or not self._partitions:
            self._partitions = self.reader.partitions()
            self._partitions_t = now
        return self._partitions


class StopPoller(threading.Thread):
    """Rank 0 asks the controller every `poll_s` whether to stop, beside training: for a resize
    (a worker count, the last answer it asks for) or to drain (asked on: a resize may still come).

    Asked at each plan, the answer came back one plan later: with a heavy model's windows of
    seconds, the old group of a warm resize learned a whole window more before its stop window
    (2.2 s of the 5.5 s from the new group ready to the old one stopped, test_autoscale,
    2026-11-26). A plan now reads the answer this thread already has. Asking never blocks
    training: the controller's sampler can hold it for a while."""

    def __init__(self, ask: Callable[[], tuple[int | None, dict[int, int] | None]], poll_s: float = RESIZE_POLL_S):
        super().__init__(name="stop-poll", daemon=True)
        self.ask, self.poll_s = ask, poll_s
        self.answer: int | None = None  # once set, the controller expects this group to stop
        self.drain_to: dict[int, int] | None = None  # once set, the run ends when planned past these
        self._closed = threading.Event()

    def run(self) -> None:
        failing = False
        while not self._closed.wait(self.poll_s):
            try:
                answer, drain_to = self.ask()
            except (ray.exceptions.RayError, TimeoutError) as e:
                if not failing:  # once per outage, not twice a second: training goes on at this size
                    log("scaler_unreachable", level="warning", error=str(e)[:200])
                failing = True
                continue
            failing = False
            self.drain_to = drain_to or self.drain_to
            if answer is not None:
                self.answer = answer
                return  # one answer per group: it stops for it

    def close(self) -> None:
        """The group is done planning: ask no more (a later answer would be for the next group)."""
        self._closed.set()
