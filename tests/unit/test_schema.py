import json
import math

import orjson
import pytest

from pipelines.banking import TRANSACTION
from streamlearn.errors import BadEvent, ConfigError
from streamlearn.schema import Field, Schema, reason_code

GOOD = {"event_id": "e1", "event_time": 1_767_225_600_000, "customer_id": "c1", "amount": 12.5, "currency": "EUR",
        "merchant_category": "grocery", "merchant_country": "DE", "channel": "pos", "card_present": True,
        "customer_age": 40, "account_tenure_days": 900, "is_fraud": False}


def reason_of(raw) -> str:
    with pytest.raises(BadEvent) as e:
        TRANSACTION.decode(raw)
    return e.value.reason


def with_(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()  # json: orjson refuses ints over 64 bits


def test_round_trip():
    assert TRANSACTION.decode(TRANSACTION.encode(GOOD)) == GOOD


def test_extra_fields_are_ignored_by_default_and_dropped():
    assert TRANSACTION.decode(with_(loyalty_tier="gold")) == GOOD


@pytest.mark.parametrize("raw, code, mentions", [
    (b"", "empty", ""),
    (b"x" * 5000, "oversized", "5000"),
    (b"\xff\xfe\x00", "undecodable", "UTF-8"),
    (b'{"event_id": "e1",', "not_json", "position"),
    (b"[1, 2]", "not_object", "array"),
    (b'"a string"', "not_object", "string"),
    (orjson.dumps({k: v for k, v in GOOD.items() if k != "amount"}), "missing_field", "'amount'"),
    (with_(amount="12.5"), "wrong_type", "'amount'"),
    (with_(customer_age=40.5), "wrong_type", "'customer_age'"),
    (with_(card_present=1), "wrong_type", "'card_present'"),
    (with_(amount=None), "missing_field", "'amount'"),
    (with_(amount=-1.0), "out_of_range", "'amount'"),
    (with_(amount=10**30), "out_of_range", "'amount'"),
    (with_(customer_age=300), "out_of_range", "'customer_age'"),
    (with_(currency="XYZ"), "unknown_value", "'currency'"),
    (with_(customer_id="c" * 65), "too_long", "'customer_id'"),
    (b'{"amount": NaN}', "not_finite", "NaN"),
    (b'{"amount": 1e400}', "not_finite", "infinite"),
])
def test_every_kind_of_bad_event_gets_its_reason(raw, code, mentions):
    reason = reason_of(raw)
    assert reason_code(reason) == code
    assert mentions in reason


BAD_VALUES = [raw for raw, _code, _mentions in test_every_kind_of_bad_event_gets_its_reason.pytestmark[0].args[1]]


def _as_columns(events: list[dict]) -> dict[str, list]:
    return {f.name: [e[f.name] for e in events] for f in TRANSACTION.fields}


@pytest.mark.parametrize("bad", BAD_VALUES + [None])
def test_columns_give_the_same_verdicts_as_events(bad):
    """decode_columns is decode_many as columns: a slice with one bad value among good ones."""
    values = [with_(event_id="a"), bad, with_(event_id="b", amount=3)]
    columns, kept, rejected = TRANSACTION.decode_columns(values)
    events, kept_many, rejected_many = TRANSACTION.decode_many(values)
    assert (kept, rejected) == (kept_many, rejected_many) == ([0, 2], rejected_many)
    assert len(rejected) == 1 and rejected[0][0] == 1
    assert columns == _as_columns(events)


def test_an_all_valid_slice_is_checked_as_columns_without_event_dicts(monkeypatch):
    values = [with_(event_id=f"e{i}", amount=float(i), card_present=i % 2 == 0) for i in range(50)]
    expected = _as_columns(TRANSACTION.decode_many(values)[0])
    monkeypatch.setattr(Schema, "decode_many", lambda *_: pytest.fail("the column fast path fell back"))
    columns, kept, rejected = TRANSACTION.decode_columns(values)
    assert columns == expected and kept == list(range(50)) and rejected == []
    assert TRANSACTION.decode_columns([]) == ({f.name: [] for f in TRANSACTION.fields}, [], [])


def test_columns_of_optional_fields_take_their_default():
    schema = Schema("s", (Field("a", "float"), Field("b", "str", required=False, default="x")))
    assert schema.decode_columns([b'{"a": 1}', b'{"a": 2.5, "b": "y"}']) == ({"a": [1.0, 2.5], "b": ["x", "y"]},
                                                                         [0, 1], [])


def test_reject_mode_names_unknown_fields():
    strict = Schema("strict", (Field("a", "int"),), extra="reject")
    with pytest.raises(BadEvent, match="unknown_field: 'b'"):
        strict.validate({"a": 1, "b": 2})


def test_optional_fields_take_their_default():
    schema = Schema("s", (Field("a", "float"), Field("b", "str", required=False, default="x")))
    assert schema.validate({"a": 1}) == {"a": 1.0, "b": "x"}


def test_unbounded_float_rejects_non_finite_on_validate():
    schema = Schema("s", (Field("a", "float"),))
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(BadEvent, match="not_finite"):
            schema.validate({"a": bad})


def test_config_errors_say_how_to_fix():
    with pytest.raises(ConfigError, match="give it a default"):
        Field("a", "int", required=False)
    with pytest.raises(ConfigError, match="twice"):
        Schema("s", (Field("a", "int"), Field("a", "int")))


def test_json_schema_lists_required_fields_and_enums():
    js = TRANSACTION.json_schema()
    assert "amount" in js["required"]
    assert js["properties"]["currency"]["enum"][0] == "EUR"
