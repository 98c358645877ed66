"""Fraud detection: is this transaction fraud? Binary classification with a small MLP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipelines.banking import N_CATEGORICAL, TRANSACTION, categorical_columns, column, hour_of_day, with_categoricals
from streamlearn.pipeline import Pipeline

if TYPE_CHECKING:
    from torch import nn


class Fraud(Pipeline):
    name = "fraud"
    version = "1"
    task = "classification"
    schema = TRANSACTION
    learning_rate = 3e-3
    n_features = 7 + N_CATEGORICAL
    # Watched for drift: all but the hour of day (columns 4-6), which cycles by design.
    drift_inputs = {"amount": 0, "customer_age": 1, "account_tenure_days": 2, "card_present": 3,
                    **categorical_columns(7)}

    def features(self, events: list[dict[str, Any]]) -> np.ndarray:
        hour = hour_of_day(events)
        numeric = np.stack([
            np.log1p(column(events, "amount")) / 10.0,
            column(events, "customer_age") / 100.0,
            np.log1p(column(events, "account_tenure_days")) / 10.0,
            column(events, "card_present"),
            np.sin(hour * (2 * np.pi / 24)),
            np.cos(hour * (2 * np.pi / 24)),
            ((hour < 6) | (hour >= 22)).astype(np.float32),  # night: a classic fraud tell
        ], axis=1)
        return with_categoricals(numeric, events)

    def targets(self, events: list[dict[str, Any]]) -> np.ndarray:
        return column(events, "is_fraud")

    def build_model(self) -> nn.Module:
        # Torch only here: Ray Data's decode workers import this module to featurize (pipeline.py).
        from pipelines.mlp import FraudMLP

        return FraudMLP(self.n_features)


PIPELINE = Fraud
