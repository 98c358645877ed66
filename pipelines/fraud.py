"""Fraud detection: is this transaction fraud? Binary classification with a small MLP."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from pipelines.banking import N_CATEGORICAL, TRANSACTION, categorical_columns, column, hour_of_day, with_categoricals
from streamlearn.pipeline import Pipeline


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
        return FraudMLP(self.n_features)


class FraudMLP(nn.Module):
    def __init__(self, n_features: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


PIPELINE = Fraud
