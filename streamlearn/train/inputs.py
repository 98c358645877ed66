"""What the driver hands every worker of a group (train/trainer.py).

A module of its own, without torch: Ray Train's controller unpickles it at every group start
(inside the run's train_loop_config) and would import whatever module defined it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamlearn.config import KafkaSettings, TrainConfig


@dataclass(frozen=True)
class WorkerInputs:
    train: TrainConfig
    kafka: KafkaSettings
    controller: Any = None  # the run's ScaleController handle; None: a fixed size (tests)
    gen: int = 0  # which group of the run: a resize's next group is gen + 1
    warm: bool = False  # started beside the running group: wait for its hand-over first
    consumed_at_start: int = 0  # what earlier groups consumed, against --max-events
    started_at: float | None = None  # when `streamlearn train` started (wall clock)
    fault: str = ""  # an aimed fault to arm (streamlearn/faults.py; tests only)
