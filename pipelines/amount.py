"""Spend prediction: how much will this customer spend in this kind of transaction?

A regression on the same banking stream (log amount from who, where and how), proving
that nothing in streamlearn is specific to classification or to the fraud pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipelines.banking import N_CATEGORICAL, TRANSACTION, categorical_columns, column, with_categoricals
from streamlearn.pipeline import Pipeline

if TYPE_CHECKING:
    from torch import nn


class Amount(Pipeline):
    name = "amount"
    version = "1"
    task = "regression"
    schema = TRANSACTION
    learning_rate = 3e-3
    n_features = 3 + N_CATEGORICAL
    drift_inputs = {"customer_age": 0, "account_tenure_days": 1, "card_present": 2, **categorical_columns(3)}

    def features(self, events: list[dict[str, Any]]) -> np.ndarray:
        numeric = np.stack([
            column(events, "customer_age") / 100.0,
            np.log1p(column(events, "account_tenure_days")) / 10.0,
            column(events, "card_present"),
        ], axis=1)
        return with_categoricals(numeric, events)

    def targets(self, events: list[dict[str, Any]]) -> np.ndarray:
        return np.log1p(column(events, "amount"))  # log space: amounts span five orders of magnitude

    def build_model(self) -> nn.Module:
        from torch import nn  # only here: see streamlearn/pipeline.py

        head = nn.Linear(32, 1)
        # Start at the typical log amount (~4.3, i.e. ~75 in currency), as a classifier starts
        # at the prior odds: the first events then teach the pattern, not the scale.
        nn.init.constant_(head.bias, 4.3)
        return nn.Sequential(nn.Linear(self.n_features, 32), nn.ReLU(), head, nn.Flatten(0))


PIPELINE = Amount
