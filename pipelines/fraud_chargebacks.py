"""Fraud detection as a bank hears of fraud: a chargeback for a fraud, weeks later, and nothing
for the rest (delayed feedback, issue 45).

The same model and features as `fraud`; events come without `is_fraud`. Each event is learned at
once as legitimate (`unlabelled_as=0.0`): nothing waits, so memory and checkpoints do not grow
with how late chargebacks come. A chargeback on `<topic>.labels` names its transaction (its id
and its place in the events topic) and comes however late, up to the events topic's retention;
the trainer then learns that transaction again as a fraud, and the loss is weighted for the
double count (FNW: streamlearn/train/feedback.py). `streamlearn load --label-delay
lognormal:5d:1 --fraud-labels-only` sends such a stream.

`ttl_s` is the chargeback window of the quality signals (an answer counts as legitimate once it
passed with no chargeback: card schemes allow 120 days). For labels that come within minutes and
for every event, `fraud_delayed` joins each event to its label instead (README: which to choose).
"""

from __future__ import annotations

from pipelines.banking import REPORT, UNLABELLED_TRANSACTION
from pipelines.fraud import Fraud
from streamlearn.pipeline import DelayedFeedback


class FraudChargebacks(Fraud):
    name = "fraud_chargebacks"
    schema = UNLABELLED_TRANSACTION
    labels = DelayedFeedback(REPORT, ttl_s=120 * 86_400.0, unlabelled_as=0.0)


PIPELINE = FraudChargebacks
