"""Rank 0's job: decide each window, and when to checkpoint and stop; every rank obeys.

One rank deciding and broadcasting is what keeps DDP in lockstep on a live stream: all
ranks take the same windows, the same number of steps, checkpoint at the same window and
stop at the same window, so no rank is ever left waiting at a collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
    last_checkpoint_t: float = field(default_factory=time.monotonic)
    last_data_t: float = field(default_factory=time.monotonic)
    planned_since_checkpoint: int = 0
    _partitions: list[int] = field(default_factory=list)
    _partitions_t: float = 0.0
    _last_empty: bool = False

    def next_window(self) -> Window:
        if self._last_empty:
            time.sleep(self.cfg.poll_interval_s)  # nothing new last time: don't spin on the broker
        now = time.monotonic()
        idle_stop = self.cfg.until_idle_s is not None and now - self.last_data_t >= self.cfg.until_idle_s
        try:
            highs = {p: high for p, (_low, high) in self.reader.watermarks(self._current_partitions(now)).items()}
        except (KafkaException, KafkaUnavailable) as e:
            # Broker away: plan nothing and ask again. Training idles instead of failing the
            # run, and every rank keeps waiting in the plan broadcast, not in an allreduce.
            log("kafka_unreachable", level="warning", error=str(e)[:200])
            highs = {}
        window = self.planner.next(highs, stop=idle_stop)
        if window.size:
            self.last_data_t = now
        self._last_empty = window.size == 0
        self.planned_since_checkpoint += window.size
        due = (now - self.last_checkpoint_t >= self.cfg.checkpoint_every_s
               or self.planned_since_checkpoint * self.expected_steps_per_event >= self.cfg.checkpoint_every_steps)
        if self.planned_since_checkpoint and (due or window.stop):
            window = Window(window.seq, window.ranges, checkpoint=True, stop=window.stop)
            self.planned_since_checkpoint = 0
            self.last_checkpoint_t = now
        return window

    def _current_partitions(self, now: float) -> list[int]:
        # Partitions can be added to a live topic; look again every few seconds, not every window.
        if now - self._partitions_t > 5.0 or not self._partitions:
            self._partitions = self.reader.partitions()
            self._partitions_t = now
        return self._partitions
