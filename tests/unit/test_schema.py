import json
import math
import random

import msgspec
import orjson
import pytest

from pipelines.banking import TRANSACTION
from streamlearn.errors import BadEvent, ConfigError
from streamlearn.schema import STRICT_REFUSED, Field, Schema, reason_code

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
    # A field the schema does not know is still part of the event: msgspec would skip these values.
    (with_(loyalty_tier="gold")[:-1] + b', "note": "\xff"}', "undecodable", "UTF-8"),
    (with_(loyalty_tier="gold")[:-1] + b', "score": 1e999}', "not_finite", "infinite"),
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


def test_an_all_valid_slice_is_decoded_by_the_strict_decoder_alone(monkeypatch):
    values = [with_(event_id=f"e{i}", amount=float(i), card_present=i % 2 == 0) for i in range(50)]
    expected = [{**GOOD, "event_id": f"e{i}", "amount": float(i), "card_present": i % 2 == 0} for i in range(50)]
    monkeypatch.setattr(Schema, "_checked", lambda *_: pytest.fail("the strict decoder fell back"))
    assert TRANSACTION.decode_many(values) == (expected, list(range(50)), [])
    assert TRANSACTION.decode_columns(values) == (_as_columns(expected), list(range(50)), [])
    assert TRANSACTION.decode_columns([]) == ({f.name: [] for f in TRANSACTION.fields}, [], [])


def test_what_the_strict_decoder_takes_the_checks_take_with_the_same_values():
    """The strict decoder (msgspec) is only a faster way to the verdicts of orjson and the
    schema's checks (`_checked`): 20,000 events with a field's value swapped for another JSON
    value and bytes flipped, dropped or swapped for JSON-significant ones, and every event it takes
    must pass the checks as the same event. It may refuse more (those go to the checks), never take more."""
    rng = random.Random(7)
    specials = [b'"', b"\\", b"\xff", b"\xed\xa0\x80", b"\x00", b"e999", b"-", b".", b"0", b",", b"}", b"{", b"[",
                b"null", b"true", b"1e400", b"\\ud800", b" "]
    seeds = [with_(), with_(amount=3), with_(customer_age=18, amount=0), with_(extra_field=[1, {"x": None}]),
             orjson.dumps({k: v for k, v in GOOD.items() if k != "is_fraud"})]
    tokens = [b'"EUR"', b'"E\\u0055R"', b'"\\u00e9"', b'"' + b"c" * 64 + b'"', b'"' + b"c" * 65 + b'"',
              b'"' + b"\\u00e9" * 64 + b'"', b'"\xc3\xa9"', b"0", b"-0", b"-0.0", b"18", b"120", b"121", b"1e2",
              b"1E+2", b"0.1e-5", b"10000000.0", b"10000000.0000001", b"4102444800000", b"4102444800001",
              b"18446744073709551616", b"1.5", b"true", b"false", b"null", b"[]", b"{}"]
    taken = 0
    for _ in range(20_000):
        if rng.random() < 0.5:  # a field's value swapped for another JSON value
            event = {name: orjson.dumps(value) for name, value in GOOD.items()}
            for name in rng.sample(list(event), rng.randint(1, 2)):
                event[name] = rng.choice(tokens)
            seed = b"{" + b",".join(b'"%s":%s' % (name.encode(), value) for name, value in event.items()) + b"}"
        else:
            seed = rng.choice(seeds)
        raw = bytearray(seed)
        for _ in range(rng.choice((0, 1, 1, 2))):
            at = rng.randrange(len(raw))
            what = rng.random()
            if what < 0.4:
                raw[at:at + 1] = rng.choice(specials)
            elif what < 0.7:
                raw[at] = rng.randrange(256)
            else:
                del raw[at]
        raw = bytes(raw)
        try:
            strict = TRANSACTION._strict.decode(raw)
        except STRICT_REFUSED:
            continue
        taken += 1
        assert msgspec.to_builtins(strict) == TRANSACTION._checked(raw), raw
    assert taken > 1_000, taken  # many changes leave the event valid: the comparison ran


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
