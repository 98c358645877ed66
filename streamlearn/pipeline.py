"""The pipeline contract: what a data scientist supplies to train on a new stream.

A pipeline declares its event schema, how events become feature/target arrays, the
model, and the task (which fixes the loss and the online metrics). streamlearn never
names a pipeline: `load_pipeline("fraud")` imports `pipelines.fraud`, and any
`package.module:attribute` works for pipelines that live elsewhere.

Torch is imported where a model is built or run, not at import: Ray Data's read lanes
(`--ingest ray-data`) import the pipeline to parse and featurize, and each
`import torch` is ~2.4 s of one core on the machines this was measured on. Pipelines keep
to the same rule (pipelines/fraud.py).
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from streamlearn.errors import ConfigError, PipelineError
from streamlearn.schema import Schema

if TYPE_CHECKING:
    import torch
    from torch import nn

Task = Literal["classification", "regression"]


@dataclass(frozen=True)
class JoinedLabels:
    """A target that comes later, on a topic of its own (`<topic><suffix>`): one label message
    per event, joined to its event by `key` in the trainer (streamlearn/ingest/labelled.py).
    Either half waits for the other at most `ttl_s` (by the messages' Kafka timestamps), and at
    most `max_pending` rows per side wait across the run's partitions; what leaves unjoined is
    counted (events) or dead-lettered with its reason (labels).

    `unlabelled_as`: where only one class is ever reported (a bank hears of fraud through a
    chargeback; nobody reports a transaction as fine), an event whose label has not come within
    the TTL is learned with this target instead of leaving unlearned: the TTL is then the
    reporting window (a chargeback's), after which silence is the answer. An event pushed out by
    `max_pending` before its TTL passed is learned so too (the cap shortens the window: size it
    to rate x TTL; a label that comes after is dead-lettered), counted among the unlabelled."""

    schema: Schema  # of one label message
    key: str = "event_id"  # the field an event and its label share
    label: str = "label"  # the label message's field the model learns
    suffix: str = ".labels"
    ttl_s: float = 7 * 86_400.0
    max_pending: int = 1_000_000
    unlabelled_as: float | None = None

    def __post_init__(self):
        fields = {f.name for f in self.schema.fields}
        if not {self.key, self.label} <= fields:
            raise ConfigError(f"label schema {self.schema.name!r} needs the fields {self.key!r} and {self.label!r}; "
                              f"it has {sorted(fields)}")
        if self.ttl_s <= 0 or self.max_pending < 1:
            raise ConfigError(f"joined labels need ttl_s > 0 and max_pending >= 1, "
                              f"got {self.ttl_s} and {self.max_pending}")
        if self.unlabelled_as is not None and not math.isfinite(self.unlabelled_as):
            raise ConfigError(f"unlabelled_as is the target an event without a label is learned with (e.g. 0.0: "
                              f"no chargeback, no fraud) or None; got {self.unlabelled_as}")


@dataclass(frozen=True)
class DelayedFeedback(JoinedLabels):
    """A target a bank hears of late or never (a chargeback, weeks after the payment): every event
    is learned at once with the silent answer, `unlabelled_as` (required: 0.0, legitimate), with no
    waiting state; a report on `<topic><suffix>` that gives the other answer, however late, makes
    the trainer learn its event again with it (streamlearn/ingest/feedback.py). A report names
    its event by `key` and by its Kafka coordinates in the events topic (fields `partition` and
    `offset`): the trainer re-reads the event there, checks its `key`, and dead-letters a report
    whose event is unknown, past the topic's retention, or already reported.

    The learned stream then counts each reported event twice, once as a fake negative; `correction`
    says how the loss makes up for it: "fnw" (fake negative weighted, Ktena et al. 2019: each
    row weighted so the model estimates the true probability; train/feedback.py) or "none".
    `ttl_s` is the attribution window of the quality signals only (an answer counts once its
    report came or this window ended: observe/evaluator.py); the trainer never waits on it.

    `hold_events`, `hold_s`: a report's event is learned again once its partition has learned this
    many events after the report came, or its events' Kafka time has moved on `hold_s`, whichever
    is first (at a bank's 1,000 events/s over 8 partitions, 4,096 events are ~30 s; a slow stream
    waits a minute: nothing beside a report's days). Meanwhile no version has learned the report,
    so the quality gate judges every candidate and the served model on the same reports, hundreds
    where one checkpoint's own are tens (load/bench/gate_feedback.py). 0: learned as it comes."""

    correction: str = "fnw"
    hold_events: int = 4096
    hold_s: float = 60.0

    def __post_init__(self):
        super().__post_init__()
        if self.unlabelled_as is None:
            raise ConfigError("delayed feedback learns every event at once with the silent answer: set "
                              "unlabelled_as (e.g. 0.0: no chargeback, no fraud)")
        if self.correction not in ("fnw", "none"):
            raise ConfigError(f"delayed feedback's correction is 'fnw' or 'none', got {self.correction!r}")
        if self.hold_events < 0 or not self.hold_s >= 0:
            raise ConfigError(f"hold_events and hold_s bound how long a report waits before its event is learned "
                              f"again (0: at once), got {self.hold_events} and {self.hold_s}")
        fields = {f.name for f in self.schema.fields}
        if not {"partition", "offset"} <= fields:
            raise ConfigError(f"report schema {self.schema.name!r} needs the fields 'partition' and 'offset' "
                              f"(its event's place in the events topic); it has {sorted(fields)}")


class Pipeline(ABC):
    name: ClassVar[str]
    version: ClassVar[str]
    task: ClassVar[Task]
    schema: ClassVar[Schema]
    learning_rate: ClassVar[float] = 1e-3
    # None: each event carries its own target (`targets`). JoinedLabels: the target comes later
    # on its own topic and `label_targets` reads it from the label messages. DelayedFeedback (a
    # JoinedLabels): the silent answer at once, a report's answer when it comes.
    labels: ClassVar[JoinedLabels | None] = None
    # Feature columns the drift detectors watch (train/drift.py), by the name alarms give them.
    # None: every column, as x0, x1, ...; {}: none. Leave out what moves by design (time of day).
    drift_inputs: ClassVar[dict[str, int] | None] = None

    @abstractmethod
    def features(self, events: list[dict[str, Any]]) -> np.ndarray:
        """Validated events -> float32 array of shape (n, n_features)."""

    @abstractmethod
    def targets(self, events: list[dict[str, Any]]) -> np.ndarray:
        """Validated events -> float32 array of shape (n,): the label the model learns."""

    def label_targets(self, labels: dict[str, list[Any]]) -> np.ndarray:
        """Validated label messages, as columns (`Schema.decode_columns`) -> float32 targets
        (pipelines with JoinedLabels only)."""
        return np.asarray(labels[self.labels.label if self.labels else "label"], dtype=np.float32)

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model mapping (n, n_features) -> (n,) raw outputs."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-event losses (no reduction): the trainer weights them so that ranks with
        uneven batches still average to the true mean over the global batch."""
        from torch import nn

        if self.task == "classification":
            return nn.functional.binary_cross_entropy_with_logits(output, target, reduction="none")
        return nn.functional.mse_loss(output, target, reduction="none")

    def score(self, output: torch.Tensor) -> torch.Tensor:
        """Raw model output -> what /score returns: a probability, or the predicted value."""
        import torch

        return torch.sigmoid(output) if self.task == "classification" else output

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        import torch

        # fused: one kernel for every parameter's update, on CPUs too: 216 -> 103 µs a step for the
        # fraud MLP (one thread, measured); the same state, so older checkpoints restore into it.
        return torch.optim.Adam(params, lr=self.learning_rate, fused=True)

    def describe(self) -> dict[str, Any]:
        labels = "inline" if self.labels is None else f"joined from <topic>{self.labels.suffix}"
        if isinstance(self.labels, DelayedFeedback):
            labels = (f"{self.labels.unlabelled_as:g} at once, corrected by reports on <topic>{self.labels.suffix} "
                      f"({self.labels.correction})")
        elif self.labels is not None and self.labels.unlabelled_as is not None:
            labels += f", {self.labels.unlabelled_as:g} when none comes within {self.labels.ttl_s:g} s"
        return {"name": self.name, "version": self.version, "task": self.task, "labels": labels}


def load_pipeline(spec: str) -> Pipeline:
    """`fraud` -> pipelines.fraud.PIPELINE; `pkg.mod:obj` -> that object (class or instance)."""
    module_name, _, attr = spec.partition(":")
    if "." not in module_name and not attr:
        module_name = f"pipelines.{module_name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and not (module_name == e.name or module_name.startswith(e.name + ".")):
            # the module is there; something it imports is not
            raise PipelineError(f"pipeline {spec!r}: {module_name} imports {e.name!r}, which is not installed "
                                f"({e}); install it where the trainer and the scorer run") from None
        raise PipelineError(
            f"pipeline {spec!r} not found ({e}); use a name under pipelines/ or 'package.module:attribute'"
        ) from None
    except Exception as e:  # a SyntaxError, or the module's own code failing as it is imported
        where = f" ({e.filename}, line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise PipelineError(f"pipeline {spec!r}: importing {module_name} failed with "
                            f"{type(e).__name__}: {e}{where}") from None
    obj = getattr(module, attr or "PIPELINE", None)
    if obj is None:
        raise PipelineError(f"{module_name} has no {attr or 'PIPELINE'!r}; a pipeline module exports PIPELINE")
    pipeline = obj() if isinstance(obj, type) else obj
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(f"{spec!r} is a {type(pipeline).__name__}, not a streamlearn.pipeline.Pipeline")
    return pipeline
