"""Rate profiles: how many events per second the load generator aims for at time t.

A profile is a pure function of seconds since the run started, so a run is
reproducible and tests can check the shape without a clock. `None` or `constant:0`
means unthrottled (as fast as Kafka accepts); a shaped profile at 0 pauses instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from streamlearn.errors import ConfigError


class Profile(Protocol):
    def rate_at(self, t: float) -> float:
        """Target events/s at `t` seconds after the start."""
        ...


def _check_rates(**rates: float) -> None:
    for name, value in rates.items():
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite rate >= 0 events/s, got {value}")


def _check_seconds(*, at_s: float | None = None, **spans: float) -> None:
    if at_s is not None and (not math.isfinite(at_s) or at_s < 0):
        raise ConfigError(f"at_s is seconds after the start, >= 0, got {at_s}")
    for name, value in spans.items():
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a positive number of seconds, got {value}")


@dataclass(frozen=True)
class Constant:
    rate: float

    def __post_init__(self):
        _check_rates(rate=self.rate)

    def rate_at(self, t: float) -> float:
        return self.rate


@dataclass(frozen=True)
class Ramp:
    """Linear from `start` to `end` over `over_s` seconds, then holds `end`."""

    start: float
    end: float
    over_s: float

    def __post_init__(self):
        _check_rates(start=self.start, end=self.end)
        _check_seconds(over_s=self.over_s)

    def rate_at(self, t: float) -> float:
        frac = min(max(t / self.over_s, 0.0), 1.0)
        return self.start + (self.end - self.start) * frac


@dataclass(frozen=True)
class Step:
    """`low` until `at_s`, then `high`: the sudden load jump the autoscaler must follow."""

    low: float
    high: float
    at_s: float

    def __post_init__(self):
        _check_rates(low=self.low, high=self.high)
        _check_seconds(at_s=self.at_s)

    def rate_at(self, t: float) -> float:
        return self.low if t < self.at_s else self.high


@dataclass(frozen=True)
class Spike:
    """`base`, with `peak` for `width_s` seconds starting at `at_s`, then `base` again."""

    base: float
    peak: float
    at_s: float
    width_s: float

    def __post_init__(self):
        _check_rates(base=self.base, peak=self.peak)
        _check_seconds(at_s=self.at_s, width_s=self.width_s)

    def rate_at(self, t: float) -> float:
        return self.peak if self.at_s <= t < self.at_s + self.width_s else self.base


@dataclass(frozen=True)
class Sine:
    """`mean + amplitude * sin(2πt/period)`; amplitude may not exceed mean (no negative rates)."""

    mean: float
    amplitude: float
    period_s: float

    def __post_init__(self):
        _check_rates(mean=self.mean, amplitude=self.amplitude)
        _check_seconds(period_s=self.period_s)
        if self.amplitude > self.mean:
            raise ConfigError(f"sine amplitude {self.amplitude} exceeds mean {self.mean}: the rate would go negative")

    def rate_at(self, t: float) -> float:
        return self.mean + self.amplitude * math.sin(2 * math.pi * t / self.period_s)


_FORMS = {
    "constant": (Constant, "constant:RATE"),
    "ramp": (Ramp, "ramp:START:END:OVER_S"),
    "step": (Step, "step:LOW:HIGH:AT_S"),
    "spike": (Spike, "spike:BASE:PEAK:AT_S:WIDTH_S"),
    "sine": (Sine, "sine:MEAN:AMPLITUDE:PERIOD_S"),
}
ACCEPTED_FORMS = ", ".join(form for _, form in _FORMS.values())


def parse_profile(text: str) -> Profile:
    """`"ramp:100:5000:60"` -> Ramp(100, 5000, 60). Rates in events/s, times in seconds."""
    name, *args = text.strip().split(":")
    kind = _FORMS.get(name.lower())
    if kind is None:
        raise ConfigError(f"unknown rate profile {text!r}; accepted forms: {ACCEPTED_FORMS}")
    cls, form = kind
    if len(args) != form.count(":"):
        raise ConfigError(f"rate profile {text!r} needs {form.count(':')} number(s); accepted forms: {ACCEPTED_FORMS}")
    try:
        return cls(*(float(a) for a in args))
    except ValueError as e:  # float() or the profile's own check (ConfigError is a ValueError)
        problem = str(e) if isinstance(e, ConfigError) else "every parameter must be a number"
        raise ConfigError(f"rate profile {text!r}: {problem}; accepted forms: {ACCEPTED_FORMS}") from None
