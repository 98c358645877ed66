"""Fraud detection as a bank hears of fraud: a chargeback for a fraud, nothing for the rest (issue 16).

The same model and features as `fraud`; events come without `is_fraud`, and only frauds get a
label, on `<topic>.labels`, when the chargeback comes (`streamlearn load --label-delay ...
--fraud-labels-only`). An event whose chargeback has not come within `ttl_s` is learned as
legitimate (`unlabelled_as=0.0`): learning only the reported frauds would teach the model that
everything is fraud. The TTL is the chargeback window: months at a bank (and the join state's
cap, `max_pending`, sized to the events of that window); here 30 s, for the generator's delays
of seconds. A fraud whose chargeback comes after it was learned as legitimate is dead-lettered
with its reason (docs/DECISIONS.md §20).
"""

from __future__ import annotations

from pipelines.banking import LABEL, UNLABELLED_TRANSACTION
from pipelines.fraud import Fraud
from streamlearn.pipeline import JoinedLabels


class FraudChargebacks(Fraud):
    name = "fraud_chargebacks"
    schema = UNLABELLED_TRANSACTION
    labels = JoinedLabels(LABEL, ttl_s=30.0, unlabelled_as=0.0)


PIPELINE = FraudChargebacks
