"""The pipeline contract: what a data scientist supplies to train on a new stream.

A pipeline declares its event schema, how events become feature/target arrays, the
model, and the task (which fixes the loss and the online metrics). streamlearn never
names a pipeline: `load_pipeline("fraud")` imports `pipelines.fraud`, and any
`package.module:attribute` works for pipelines that live elsewhere.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from streamlearn.errors import PipelineError
from streamlearn.schema import Schema

Task = Literal["classification", "regression"]


class Pipeline(ABC):
    name: ClassVar[str]
    version: ClassVar[str]
    task: ClassVar[Task]
    schema: ClassVar[Schema]
    learning_rate: ClassVar[float] = 1e-3

    @abstractmethod
    def features(self, events: list[dict[str, Any]]) -> np.ndarray:
        """Validated events -> float32 array of shape (n, n_features)."""

    @abstractmethod
    def targets(self, events: list[dict[str, Any]]) -> np.ndarray:
        """Validated events -> float32 array of shape (n,): the label the model learns."""

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model mapping (n, n_features) -> (n,) raw outputs."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-event losses (no reduction): the trainer weights them so that ranks with
        uneven batches still average to the true mean over the global batch."""
        if self.task == "classification":
            return nn.functional.binary_cross_entropy_with_logits(output, target, reduction="none")
        return nn.functional.mse_loss(output, target, reduction="none")

    def score(self, output: torch.Tensor) -> torch.Tensor:
        """Raw model output -> what /score returns: a probability, or the predicted value."""
        return torch.sigmoid(output) if self.task == "classification" else output

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.learning_rate)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "task": self.task}


def load_pipeline(spec: str) -> Pipeline:
    """`fraud` -> pipelines.fraud.PIPELINE; `pkg.mod:obj` -> that object (class or instance)."""
    module_name, _, attr = spec.partition(":")
    if "." not in module_name and not attr:
        module_name = f"pipelines.{module_name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise PipelineError(
            f"pipeline {spec!r} not found ({e}); use a name under pipelines/ or 'package.module:attribute'"
        ) from None
    obj = getattr(module, attr or "PIPELINE", None)
    if obj is None:
        raise PipelineError(f"{module_name} has no {attr or 'PIPELINE'!r}; a pipeline module exports PIPELINE")
    pipeline = obj() if isinstance(obj, type) else obj
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(f"{spec!r} is a {type(pipeline).__name__}, not a streamlearn.pipeline.Pipeline")
    return pipeline
