"""Fraud detection with a much wider network (1024 units, ~1M weights against fraud's ~7k):
for driving autoscaling on a small machine.

The fraud model learns tens of thousands of events/s on one core, so on a laptop a burst the
generator can send drains on one worker before the policy could ask for a second. This one
learns a few thousand events/s per worker (~11k on a 2-core test machine), so the same burst
outgrows one worker and the scaling path runs end to end: the autoscaling tests and
`load/bench/scaling.py` use it. The features, labels and events are fraud's.
"""

from __future__ import annotations

from pipelines.fraud import Fraud


class FraudHeavy(Fraud):
    name = "fraud_heavy"

    def build_model(self):
        from pipelines.mlp import FraudMLP

        return FraudMLP(self.n_features, hidden=1024)


PIPELINE = FraudHeavy
