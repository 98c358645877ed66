"""Fraud detection with the label a chargeback or an analyst gives later (issue 16).

The same model and features as `fraud`; the events come without `is_fraud`, and each label
arrives on `<topic>.labels` when the bank learns it (`streamlearn load --label-delay ...`).
The trainer learns an event once its label has come, at most `ttl_s` after it.
"""

from __future__ import annotations

from pipelines.banking import LABEL, UNLABELLED_TRANSACTION
from pipelines.fraud import Fraud
from streamlearn.pipeline import JoinedLabels


class FraudDelayed(Fraud):
    name = "fraud_delayed"
    schema = UNLABELLED_TRANSACTION
    labels = JoinedLabels(LABEL, ttl_s=3_600.0)


PIPELINE = FraudDelayed
