"""The evaluator's settings, apart from the evaluator so the CLI reads its defaults without
importing Kafka clients."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from streamlearn.errors import ConfigError


@dataclass(frozen=True)
class EvaluatorConfig:
    topic: str = "transactions"
    run_dir: Path = Path(".")
    window: int = 5_000  # labelled answers per window (all versions, and each version)
    every_s: float = 5.0
    lookback_s: float | None = None  # default: the label TTL, at most an hour
    max_pending: int = 1_000_000  # per side of the join
    # The share of event ids judged. Delayed feedback holds each answer its whole attribution
    # window (weeks): answers a second x the window x sample must fit max_pending (quality.py).
    sample: float = 1.0

    def __post_init__(self):
        if self.window < 10 or self.every_s <= 0 or self.max_pending < 1:
            raise ConfigError(f"evaluator: window must be >= 10, every_s > 0 and max_pending >= 1; got "
                              f"{self.window}, {self.every_s}, {self.max_pending}")
        if not 0.0 < self.sample <= 1.0:
            raise ConfigError(f"evaluator: sample is the share of event ids judged, in (0, 1]; got {self.sample} "
                              f"(e.g. 0.01 judges one event in a hundred)")
