"""The fraud pipelines' model, apart from their features: importing a pipeline to parse and
featurize (Ray Data's decode workers) must not import torch (streamlearn/pipeline.py)."""

from __future__ import annotations

from torch import nn


class FraudMLP(nn.Module):
    def __init__(self, n_features: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)
