"""What a group of each size learns, measured on the running job (issue 48).

The policy's need assumes each worker adds `capacity` events/s; on two cores a second DDP worker
made learning slower, and on any machine the gain falls as workers share cores, memory bandwidth or
the network. So each saturated sample also goes into a curve: the whole group's learned rate by
its size, an EWMA per size. A size measured to learn no more than a smaller one (by `min_gain`) is
not asked for again, and a group found at such a size goes back to the smaller one, until the
measurement is older than `memory_s` (the load's cost per event changes: a new pipeline version,
a feature, a node type). Sizes not yet measured are modelled linearly from the largest smaller
size measured, as the policy assumed before: a first try is how the curve is learned."""

from __future__ import annotations

from dataclasses import dataclass

SAMPLES = 2  # saturated samples a size needs before its rate is trusted (one can straddle a stall)


@dataclass(frozen=True)
class Point:
    workers: int
    rate: float  # events/s the whole group learned while saturated (EWMA)
    t: float  # newest sample
    samples: int = 1
    # When the group was sent back from this size because it did not pay: the verdict holds for
    # memory_s, whatever the smaller size's noisy rate does meanwhile (a CI run saw 1 worker's
    # EWMA wander 1,500-1,940/s and 2's 1,728/s "pay" again, and the policy re-add it).
    ruled_out_at: float | None = None


Curve = tuple[Point, ...]  # by size, at most one point each


def record(curve: Curve, workers: int, rate: float, t: float, alpha: float) -> Curve:
    """The curve with a saturated sample of a group of `workers` folded in."""
    old = next((p for p in curve if p.workers == workers), None)
    new = Point(workers, rate, t) if old is None else \
        Point(workers, old.rate + alpha * (rate - old.rate), t, old.samples + 1)
    return tuple(sorted([p for p in curve if p.workers != workers] + [new], key=lambda p: p.workers))


def measured(curve: Curve, workers: int, now: float, memory_s: float) -> Point | None:
    """The trusted, fresh measurement of a group of `workers`, if there is one."""
    point = next((p for p in curve if p.workers == workers), None)
    return point if point is not None and point.samples >= SAMPLES and now - point.t <= memory_s else None


def predicted(curve: Curve, workers: int, now: float, memory_s: float) -> float | None:
    """What a group of `workers` learns: measured; else interpolated between the nearest sizes
    measured below and above it; else linear from the nearest below (the policy's assumption
    before the curve); None when nothing smaller is measured."""
    if (point := measured(curve, workers, now, memory_s)) is not None:
        return point.rate
    fresh = [p for p in curve if measured(curve, p.workers, now, memory_s) is not None]
    below = [p for p in fresh if p.workers < workers]
    above = [p for p in fresh if p.workers > workers]
    if not below:
        return None
    a = below[-1]
    if above:
        b = above[0]
        return a.rate + (b.rate - a.rate) * (workers - a.workers) / (b.workers - a.workers)
    return a.rate * workers / a.workers


def no_gain(curve: Curve, smaller: int, larger: int, now: float, memory_s: float, min_gain: float) -> str:
    """Why `larger` workers do not pay over `smaller` (measured), by the curve; "" when they may."""
    lo = measured(curve, smaller, now, memory_s)
    rate = predicted(curve, larger, now, memory_s)
    if lo is None or rate is None or rate > lo.rate * (1 + min_gain):
        return ""
    hi = measured(curve, larger, now, memory_s)
    seen = f"measured {now - hi.t:.0f} s ago" if hi else "interpolated between measured sizes"
    return (f"a group of {larger} {'learned' if hi else 'would learn'} {rate:.0f}/s, of {smaller} {lo.rate:.0f}/s: "
            f"{larger - smaller} more worker{'s' if larger - smaller > 1 else ''} did not pay "
            f"(≥ {min_gain:.0%} more wanted; {seen}, forgotten after {memory_s:.0f} s)")


def rule_out(curve: Curve, workers: int, now: float) -> Curve:
    """The curve with a verdict on `workers`: the group was sent back from it."""
    return tuple(Point(p.workers, p.rate, p.t, p.samples, now) if p.workers == workers else p for p in curve)


def ruled_out(curve: Curve, workers: int, now: float, memory_s: float) -> str:
    """Why `workers` stays ruled out, or "" when it is not (or no longer): it, or a larger size,
    was sent back from (a curve that flattens by R flattens before it, too)."""
    point = next((p for p in curve if p.workers >= workers and p.ruled_out_at is not None
                  and now - p.ruled_out_at <= memory_s), None)
    if point is None:
        return ""
    return (f"a group of {point.workers} learned {point.rate:.0f}/s: it did not pay over a smaller one "
            f"(sent back {now - point.ruled_out_at:.0f} s ago; tried again after {memory_s:.0f} s)")


def worth_adding(curve: Curve, current: int, target: int, now: float, memory_s: float,
                 min_gain: float) -> tuple[int, str]:
    """The largest size in (current, target] the curve does not rule out, or `current` and why
    none pays."""
    for size in range(target, current, -1):
        if not ruled_out(curve, size, now, memory_s) and not no_gain(curve, current, size, now, memory_s, min_gain):
            return size, ""
    # `target` was turned down too, so one of these says why
    return current, ruled_out(curve, target, now, memory_s) or no_gain(curve, current, target, now, memory_s,
                                                                         min_gain)


def as_good_smaller(curve: Curve, current: int, least: int, now: float, memory_s: float,
                    min_gain: float) -> tuple[int, str]:
    """The smallest measured size (>= least) that the current group learns no more than, and why;
    (current, "") when there is none."""
    for size in range(least, current):
        if measured(curve, size, now, memory_s) is not None and measured(curve, current, now, memory_s) is not None:
            if why := no_gain(curve, size, current, now, memory_s, min_gain):
                return size, why
    return current, ""
