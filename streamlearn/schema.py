"""Declarative event schemas: decode bytes, validate, and say exactly what is wrong.

A pipeline declares its schema; nothing here knows about banking. Every rejection is a
`BadEvent` whose reason reads `<code>: <detail>` — the code (before the colon) is what
metrics count by, the whole reason is what the dead-letter topic carries.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal

import msgspec
import orjson

from streamlearn.errors import BadEvent, ConfigError

Kind = Literal["str", "float", "int", "bool"]
_JSON_NAMES = {"str": "string", "float": "number", "int": "integer", "bool": "boolean"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


@dataclass(frozen=True)
class Field:
    """One field of an event. Optional fields take `default` when absent."""

    name: str
    kind: Kind
    required: bool = True
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    max_len: int = 128
    default: Any = None

    def __post_init__(self):
        if self.kind not in _JSON_NAMES:
            raise ConfigError(f"field {self.name!r}: kind must be one of {sorted(_JSON_NAMES)}, got {self.kind!r}")
        if not self.required and self.default is None:
            raise ConfigError(f"field {self.name!r} is optional, so give it a default")

    def fast_test(self, var: str) -> str:
        """A Python expression, True for every valid value of `var`. The hot path tests types
        with `is` and builds no message; only a failing event pays for `check`'s reason."""
        lo = "" if self.min is None else f"{self.min!r} <= {var}"
        hi = "" if self.max is None else f"{var} <= {self.max!r}"
        bounds = " and ".join(b for b in (lo, hi) if b) or "True"
        if self.kind == "str":
            if self.choices:
                return f"(type({var}) is str and {var} in {frozenset(self.choices)!r})"
            return f"(type({var}) is str and len({var}) <= {self.max_len})"
        if self.kind == "bool":
            return f"(type({var}) is bool)"
        if self.kind == "int":
            return f"(type({var}) is int and {bounds})"
        # orjson never yields inf and NaN fails any comparison; unbounded floats test finiteness.
        finite = "" if self.min is not None and self.max is not None else f" and {var} - {var} == 0"
        return f"((type({var}) is float or type({var}) is int) and {bounds}{finite})"

    def check(self, value: Any) -> Any:
        """Return the value in its canonical Python type, or raise BadEvent."""
        name, kind = self.name, self.kind
        got = _json_type(value)
        if kind == "str":
            if got != "string":
                raise BadEvent(f"wrong_type: {name!r} must be a string, got {got}")
            if len(value) > self.max_len:
                raise BadEvent(f"too_long: {name!r} has {len(value)} characters, limit {self.max_len}")
            if self.choices is not None and value not in self.choices:
                raise BadEvent(f"unknown_value: {name!r} is {value[:32]!r}, expected one of {', '.join(self.choices)}")
            return value
        if kind == "bool":
            if got != "boolean":
                raise BadEvent(f"wrong_type: {name!r} must be a boolean, got {got}")
            return value
        if got not in ("integer", "number") or (kind == "int" and got != "integer"):
            raise BadEvent(f"wrong_type: {name!r} must be {'an integer' if kind == 'int' else 'a number'}, got {got}")
        if got == "number" and not math.isfinite(value):
            raise BadEvent(f"not_finite: {name!r} is {value}")
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            # float() of an integer past 1e308 overflows; JSON parsers other than orjson make such ints
            shown = value if abs(value) < 1e15 else f"{float(value):.3g}" if abs(value) < 1e300 else "beyond 1e300"
            raise BadEvent(f"out_of_range: {name!r} is {shown}, allowed [{self.min}, {self.max}]")
        return float(value) if kind == "float" else value


@dataclass(frozen=True)
class Schema:
    """The event contract of one pipeline.

    Unknown fields are ignored by default (producers may add fields before consumers
    learn them); `extra="reject"` dead-letters them instead.
    """

    name: str
    fields: tuple[Field, ...]
    max_bytes: int = 4096
    extra: Literal["ignore", "reject"] = "ignore"
    _by_name: dict[str, Field] = field(init=False, repr=False, compare=False)
    _all_valid: Any = field(init=False, repr=False, compare=False)
    _strict: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ConfigError(f"schema {self.name!r} declares a field twice: {names}")
        if self.extra not in ("ignore", "reject"):
            raise ConfigError(f"schema {self.name!r}: extra must be 'ignore' or 'reject'")
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fields})
        object.__setattr__(self, "_all_valid", _compile_fast_path(self.fields))
        object.__setattr__(self, "_strict", _compile_strict_decoder(self.name, self.fields))

    def decode(self, raw: bytes | None) -> dict[str, Any]:
        """Bytes of one Kafka message -> a validated event dict, or BadEvent."""
        if not raw:
            raise BadEvent("empty: message has no value")
        if len(raw) > self.max_bytes:
            raise BadEvent(f"oversized: {len(raw)} bytes, limit {self.max_bytes}")
        try:
            return msgspec.to_builtins(self._strict.decode(raw))
        except STRICT_REFUSED:
            return self._checked(raw)  # not necessarily bad (a field the schema does not know, a null optional)

    def _checked(self, raw: bytes) -> dict[str, Any]:
        """orjson and the schema's own checks: what decides a value the strict decoder refused,
        and says why it is bad."""
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise BadEvent(_json_reason(raw, e)) from None
        return self.validate(obj)

    def decode_many(self, values: list[bytes | None]) -> tuple[list[dict[str, Any]], list[int], list[tuple[int, str]]]:
        """`decode` over a whole slice: (events, index of each event's value, [(index, reason)] of the
        bad ones), with the same verdicts. A slice of events that hold the schema's fields and
        nothing else, all valid (the usual case), is parsed and checked by msgspec in one C loop,
        1.1 µs an event where orjson and the generated checks took 3.0 (docs/DECISIONS.md §6); any
        other slice goes message by message, each tried the same way before the checks that say why."""
        objs = self._strict_all(values)
        if objs is not None:
            return list(map(msgspec.to_builtins, objs)), list(range(len(values))), []
        return self._one_by_one(values)

    def _strict_all(self, values: list[bytes | None]) -> list | None:
        """The strict decoder's objects for a whole slice, or None if it refuses any value (or the
        slice is empty): then each value must be decided on its own."""
        try:
            if values and max(map(len, values)) <= self.max_bytes:
                return list(map(self._strict.decode, values))
        except (*STRICT_REFUSED, TypeError):  # TypeError: a None value (a tombstone)
            pass
        return None

    def _one_by_one(self, values: list[bytes | None]) -> tuple[list[dict[str, Any]], list[int], list[tuple[int, str]]]:
        events: list[dict[str, Any]] = []
        kept: list[int] = []
        bad: list[tuple[int, str]] = []
        for i, raw in enumerate(values):
            try:
                events.append(self.decode(raw))
                kept.append(i)
            except BadEvent as e:
                bad.append((i, e.reason))
        return events, kept, bad

    def decode_columns(self, values: list[bytes | None]) -> tuple[dict[str, list], list[int], list[tuple[int, str]]]:
        """`decode_many` as columns: ({field: [value of each valid event]}, index of each valid
        event's value, [(index, reason)] of the bad ones). An all-valid slice (the usual case) makes
        no event dict: msgspec's objects are read column by column, half the cost of `decode_many`
        for small messages such as labels (docs/DECISIONS.md §20)."""
        names = [f.name for f in self.fields]
        objs = self._strict_all(values)
        if objs is not None:
            columns = {name: list(map(attrgetter(_attr(i)), objs)) for i, name in enumerate(names)}
            return columns, list(range(len(values))), []
        events, kept, bad = self._one_by_one(values)
        return {name: [e[name] for e in events] for name in names}, kept, bad

    def validate(self, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise BadEvent(f"not_object: event must be a JSON object, got {_json_type(obj)}")
        if self.extra == "ignore" and self._all_valid(obj):
            return obj if len(obj) == len(self.fields) else {f.name: obj[f.name] for f in self.fields}
        out = {}
        for f in self.fields:
            value = obj.get(f.name)
            if value is None:
                if f.required:
                    raise BadEvent(f"missing_field: {f.name!r} is required")
                out[f.name] = f.default
            else:
                out[f.name] = f.check(value)
        if self.extra == "reject" and len(obj) > len(out):
            unknown = sorted(set(obj) - set(self._by_name))
            if unknown:
                raise BadEvent(f"unknown_field: {', '.join(map(repr, unknown[:5]))} not in schema {self.name!r}")
        return out

    def encode(self, event: dict[str, Any]) -> bytes:
        return orjson.dumps(event)

    def json_schema(self) -> dict[str, Any]:
        """The same contract as JSON Schema, for the scoring API's OpenAPI document."""
        props = {}
        for f in self.fields:
            p: dict[str, Any] = {"type": _JSON_NAMES[f.kind]}
            if f.choices:
                p["enum"] = list(f.choices)
            if f.min is not None:
                p["minimum"] = f.min
            if f.max is not None:
                p["maximum"] = f.max
            if f.kind == "str":
                p["maxLength"] = f.max_len
            props[f.name] = p
        return {"type": "object", "properties": props, "required": [f.name for f in self.fields if f.required]}


def _compile_fast_path(fields: tuple[Field, ...]):
    """One generated function testing every field inline: ~5x faster than looping over
    per-field checks, which matters because every event of the stream passes through it."""
    lines = ["def all_valid(obj):", "    get = obj.get"]
    for i, f in enumerate(fields):
        lines += [f"    v{i} = get({f.name!r})", f"    if not {f.fast_test(f'v{i}')}: return False"]
    lines.append("    return True")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102 - source built only from the schema's own declarations
    return namespace["all_valid"]


# What the strict decoder raises for a value it does not take: msgspec's own errors, and
# UnicodeDecodeError (a ValueError) for a string that is not UTF-8.
STRICT_REFUSED = (msgspec.DecodeError, ValueError)


def _attr(i: int) -> str:
    return f"f{i}"  # field names need not be identifiers; the struct's attributes must be


def _compile_strict_decoder(name: str, fields: tuple[Field, ...]) -> msgspec.json.Decoder:
    """A msgspec decoder taking exactly the events whose every field is present (or absent and
    optional) and passes its checks, and that hold no other field. What it takes, `decode`'s
    checks take with the same values; what it refuses goes to them, which accept it or say why.
    Refusing unknown fields is what makes the two agree: msgspec skips an unknown field's value
    without checking its UTF-8 or whether its number is finite, where orjson refuses the event."""
    specs = []
    for i, f in enumerate(fields):
        if f.kind == "str":
            kind = Literal[f.choices] if f.choices else typing.Annotated[str, msgspec.Meta(max_length=f.max_len)]
        elif f.kind == "bool":
            kind = bool
        else:
            bounds = {k: v for k, v in (("ge", f.min), ("le", f.max)) if v is not None}
            kind = int if f.kind == "int" else float  # msgspec's float takes integers too, as the checks do
            kind = typing.Annotated[kind, msgspec.Meta(**bounds)] if bounds else kind
        specs.append((_attr(i), kind) if f.required else (_attr(i), kind, f.default))
    struct = msgspec.defstruct(f"{name}_event", specs, forbid_unknown_fields=True, gc=False,
                               rename={_attr(i): f.name for i, f in enumerate(fields)})
    return msgspec.json.Decoder(struct)


def _json_reason(raw: bytes, error: orjson.JSONDecodeError) -> str:
    message = str(error).split(":", 1)[0]
    if "UTF-8" in message:
        return "undecodable: value is not UTF-8 text"
    if "infinity" in message or any(token in raw for token in (b"NaN", b"Infinity")):
        return f"not_finite: a number is NaN or infinite ({message} at position {error.pos})"
    return f"not_json: {message} at position {error.pos}"


def reason_code(reason: str) -> str:
    """`out_of_range: ...` -> `out_of_range`: the low-cardinality label for metrics."""
    return reason.split(":", 1)[0]
