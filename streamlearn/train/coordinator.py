"""Rank 0's job: decide each window, and when to checkpoint and stop; every rank obeys.

One rank deciding and broadcasting is what keeps DDP in lockstep on a live stream: all
ranks take the same windows, the same number of steps, checkpoint at the same window and
stop at the same window, so no rank is ever left waiting at a collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
import torch.distributed as dist
from confluent_kafka import KafkaException

from streamlearn.config import TrainConfig
from streamlearn.errors import KafkaUnavailable
from streamlearn.ingest.reader import RangeReader
from streamlearn.ingest.windows import Window, WindowPlanner
from streamlearn.logs import log


def broadcast(obj, rank: int):
    """Send rank 0's object to every rank (a no-op with one worker)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class Coordinator:
    cfg: TrainConfig
    reader: RangeReader
    planner: WindowPlanner
    expected_steps_per_event: float
    world: int = 1
    controller: Any = None  # this run's ScaleController handle (None: fixed size, e.g. in tests)
    last_checkpoint_t: float = field(default_factory=time.monotonic)
    empty_since: float = field(default_factory=time.monotonic)  # first of the current run of empty plans
    planned_since_checkpoint: int = 0
    _partitions: list[int] = field(default_factory=list)
    _partitions_t: float = 0.0
    _last_empty: bool = False
    _learned: int = 0
    _resize_asked_t: float = 0.0
    resize_to: int | None = None

    def next_window(self) -> Window:
        if self._last_empty:
            time.sleep(self.cfg.poll_interval_s)  # nothing new last time: don't spin on the broker
        now = time.monotonic()
        # Idle means plans kept finding nothing for that long, not that the last plan with data is
        # that old: a slow window (seconds on a busy machine) is not an idle stream.
        idle_stop = (self.cfg.until_idle_s is not None and self._last_empty
                     and now - self.empty_since >= self.cfg.until_idle_s)
        try:
            highs = {p: high for p, (_low, high) in self.reader.watermarks(self._current_partitions(now)).items()}
        except (KafkaException, KafkaUnavailable) as e:
            # Broker away: plan nothing and ask again. Training idles instead of failing the
            # run, and every rank keeps waiting in the plan broadcast, not in an allreduce.
            log("kafka_unreachable", level="warning", error=str(e)[:200])
            highs = {}
            # An unreachable broker is not an empty stream: the idle clock starts again once it
            # answers (a run with --until-idle ended mid-outage with events still to come).
            idle_stop, self.empty_since, self._last_empty = False, now, True
        window = self.planner.next(highs, stop=idle_stop or self._resize_due(now))
        if window.size == 0 and not self._last_empty:
            self.empty_since = now
        self._last_empty = window.size == 0
        self.planned_since_checkpoint += window.size
        due = (now - self.last_checkpoint_t >= self.cfg.checkpoint_every_s
               or self.planned_since_checkpoint * self.expected_steps_per_event >= self.cfg.checkpoint_every_steps)
        if self.planned_since_checkpoint and (due or window.stop):
            window = Window(window.seq, window.ranges, checkpoint=True, stop=window.stop)
            self.planned_since_checkpoint = 0
            self.last_checkpoint_t = now
        return window

    def learned(self, window: Window) -> None:
        """After a window is learned: tell the controller (its learned rate, a resize's end).
        The last report before a resize waits for delivery, so the pause is measured from it."""
        if self.controller is None or not window.size and not window.stop:
            return
        self._learned += window.size
        ref = self.controller.progress.remote(self._learned, self.world, time.time())
        if window.stop:
            ray.get(ref, timeout=10)

    def _resize_due(self, now: float) -> bool:
        # Polled once a second: a regroup is rare, and the answer must not cost a window's latency.
        if self.controller is None or self.resize_to is not None or now - self._resize_asked_t < 1.0:
            return self.resize_to is not None
        self._resize_asked_t = now
        try:
            self.resize_to = ray.get(self.controller.resize_due.remote(), timeout=5)
        except (ray.exceptions.RayError, TimeoutError) as e:
            log("scaler_unreachable", level="warning", error=str(e)[:200])  # keep training at this size
        if self.resize_to is not None:
            log("resize_stop", workers=self.world, to=self.resize_to)
        return self.resize_to is not None

    def _current_partitions(self, now: float) -> list[int]:
        # Partitions can be added to a live topic; look again every few seconds, not every window.
        if now - self._partitions_t > 5.0 or not self._partitions:
            self._partitions = self.reader.partitions()
            self._partitions_t = now
        return self._partitions
