"""The banking-transaction event: one card or account transaction, keyed by customer id.

Shared by the pipelines that learn from the bank's transaction stream (fraud, amount).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamlearn.schema import Field, Schema

CURRENCIES = ("EUR", "USD", "GBP", "CHF", "PLN", "SEK")
MERCHANT_CATEGORIES = ("grocery", "restaurant", "travel", "electronics", "fuel", "fashion",
                       "gaming", "crypto", "utilities", "health", "cash", "transfer")
COUNTRIES = ("DE", "FR", "NL", "ES", "IT", "GB", "US", "PL", "CH", "SE", "NG", "RU", "CN", "BR")
CHANNELS = ("pos", "ecom", "atm", "mobile")

TRANSACTION = Schema(
    name="banking_transaction",
    fields=(
        Field("event_id", "str", max_len=64),
        Field("event_time", "int", min=0, max=4_102_444_800_000),  # epoch ms, before 2100
        Field("customer_id", "str", max_len=64),
        Field("amount", "float", min=0.0, max=10_000_000.0),
        Field("currency", "str", choices=CURRENCIES),
        Field("merchant_category", "str", choices=MERCHANT_CATEGORIES),
        Field("merchant_country", "str", choices=COUNTRIES),
        Field("channel", "str", choices=CHANNELS),
        Field("card_present", "bool"),
        Field("customer_age", "int", min=18, max=120),
        Field("account_tenure_days", "int", min=0, max=36_500),
        Field("is_fraud", "bool"),
    ),
)


# With delayed labels (streamlearn/loadgen/labels.py) a transaction comes without is_fraud, and its label later.
UNLABELLED_TRANSACTION = Schema(name="banking_transaction_unlabelled",
                                fields=tuple(f for f in TRANSACTION.fields if f.name != "is_fraud"))
LABEL = Schema(
    name="banking_label",
    fields=(
        Field("event_id", "str", max_len=64),
        Field("label", "bool"),
        Field("label_time", "int", min=0, max=4_102_444_800_000),
    ),
    max_bytes=160,  # join.LABEL_BYTES: a waiting label is kept whole for its dead letter
)

# A chargeback or fraud claim (delayed feedback, pipelines/fraud_chargebacks.py): the label, and
# where its transaction is in the events topic (a bank's report names the transaction it disputes).
REPORT = Schema(
    name="banking_report",
    fields=(*LABEL.fields, Field("partition", "int", min=0, max=1_000_000),
            Field("offset", "int", min=0, max=2**62)),
    max_bytes=200,
)

def one_hot(values: list[str], vocabulary: tuple[str, ...]) -> np.ndarray:
    index = {v: i for i, v in enumerate(vocabulary)}
    out = np.zeros((len(values), len(vocabulary)), dtype=np.float32)
    out[np.arange(len(values)), [index[v] for v in values]] = 1.0
    return out


def column(events: list[dict[str, Any]], name: str, dtype=np.float32) -> np.ndarray:
    return np.fromiter((e[name] for e in events), dtype=dtype, count=len(events))


def hour_of_day(events: list[dict[str, Any]]) -> np.ndarray:
    return (column(events, "event_time", np.int64) // 3_600_000 % 24).astype(np.float32)


CATEGORICAL = (("currency", CURRENCIES), ("merchant_category", MERCHANT_CATEGORIES),
               ("merchant_country", COUNTRIES), ("channel", CHANNELS))
N_CATEGORICAL = sum(len(vocabulary) for _, vocabulary in CATEGORICAL)


def categorical_columns(start: int) -> dict[str, int]:
    """`field=value` -> its column in the one-hot blocks that `with_categoricals` puts at `start`."""
    names = [f"{name}={value}" for name, vocabulary in CATEGORICAL for value in vocabulary]
    return {name: start + i for i, name in enumerate(names)}


def with_categoricals(numeric: np.ndarray, events: list[dict[str, Any]]) -> np.ndarray:
    """Numeric columns followed by a one-hot block per categorical field, as float32."""
    blocks = [one_hot([e[name] for e in events], vocabulary) for name, vocabulary in CATEGORICAL]
    return np.concatenate([numeric, *blocks], axis=1, dtype=np.float32)
