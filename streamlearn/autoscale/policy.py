"""How many training workers the stream needs now: a pure function of observations.

    decision, state = decide(observation, state, policy)

The workers needed to keep up and to clear the backlog within `target_drain_s`:

    need = (input_rate + backlog / target_drain_s) / capacity_per_worker

`backlog` is the lag beyond `normal_lag_s` of input: lag counts events not yet in a
checkpoint, so a pipeline that keeps up still shows about one checkpoint interval of it.
Capacity per worker is learned from the training metrics (learned_rate / workers): when the
workers are saturated that ratio is what they can do, otherwise only a lower bound, so it may
raise the estimate but never lower it. `capacity_floor` is the first estimate and the least:
set it a little below the measured rate per worker, so the policy starts on the safe side.

Changes are rationed because each resize stops learning for a few seconds:
- hysteresis: up only when need > current * (1 + up_margin), down only when
  need < current * (1 - down_margin);
- a change waits its direction's cool-down since the last change, and the need must have
  stayed past the threshold for that whole cool-down. A spike shorter than `up_cooldown_s`
  therefore never adds workers by its input rate alone; it is absorbed as backlog, and only
  if that backlog cannot drain within `target_drain_s` does the need stay high long enough
  to scale up. Down waits the (longer) down cool-down: over-provisioning costs money,
  falling behind costs freshness, so up reacts faster.
- up/down/up thus spans at least up_cooldown_s + down_cooldown_s: no thrash.

Workers help only while training, not Kafka, is the bottleneck (the input network saturates
first, the seed reports warn); `max_workers` caps what a misjudged need can cost, and the measured
curve (autoscale/curve.py) keeps the policy from asking again for a size that learned no more than
a smaller one, and takes a group at such a size back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from streamlearn.autoscale import curve as curves
from streamlearn.config import TrainConfig
from streamlearn.errors import ConfigError


@dataclass(frozen=True)
class ScalingPolicy:
    """The knobs, and what each trades (docs/OPERATIONS.md lists them for operators)."""

    min_workers: int = 1
    max_workers: int = 4
    target_drain_s: float = 30.0  # a backlog should be gone this long after it shows
    up_margin: float = 0.1  # fraction of current capacity the need must exceed to add workers
    down_margin: float = 0.25  # fraction it must fall below to remove them
    up_cooldown_s: float = 15.0
    down_cooldown_s: float = 60.0
    capacity_floor: float = 1000.0  # events/s one worker learns at the least; also the first estimate
    capacity_alpha: float = 0.3  # EWMA weight of a new capacity sample
    normal_lag_s: float = TrainConfig.checkpoint_every_s  # lag this many seconds of input is normal: it is
    # counted to the committed offsets, which move once per checkpoint
    settle_s: float = 15.0  # rates of a resized group are no capacity samples until it has run this long
    # How long a resize waits for room to start the new group beside the running one (a warm
    # handover: a pause of seconds) before it stops the running group first (cold: the pause
    # is a whole Ray Train start). 0: always cold, never more than one group's resources.
    warm_wait_s: float = 60.0
    # A bigger group must learn this much more than a smaller one measured, or it is left (and not
    # asked for again) until that measurement is curve_memory_s old (autoscale/curve.py).
    min_gain: float = 0.1
    curve_memory_s: float = 600.0  # 0: no curve, every size assumed to add a worker's capacity

    def __post_init__(self):
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        need(self.min_workers >= 1, f"min_workers must be >= 1 (training needs a worker; stop the job to pause it), "
                                    f"got {self.min_workers}")
        need(self.max_workers >= self.min_workers,
             f"max_workers ({self.max_workers}) must be >= min_workers ({self.min_workers})")
        need(self.target_drain_s > 0, f"target_drain_s must be > 0 seconds (e.g. 30), got {self.target_drain_s}")
        need(self.up_margin >= 0 and 0 <= self.down_margin < 1,
             f"up_margin must be >= 0 and down_margin in [0, 1) (e.g. 0.1 and 0.25), "
             f"got {self.up_margin} and {self.down_margin}")
        need(self.up_cooldown_s >= 0 and self.down_cooldown_s >= 0,
             "up_cooldown_s and down_cooldown_s must be >= 0; make them longer than a resize pause (~10 s)")
        need(self.capacity_floor > 0, f"capacity_floor must be > 0 events/s per worker (take it from "
                                      f"docs/BENCHMARKS.md), got {self.capacity_floor}")
        need(0 < self.capacity_alpha <= 1, f"capacity_alpha must be in (0, 1], got {self.capacity_alpha}")
        need(self.warm_wait_s >= 0, f"warm_wait_s must be >= 0 seconds (0: resize cold, stopping first), "
                                    f"got {self.warm_wait_s}")
        need(self.min_gain >= 0 and self.curve_memory_s >= 0,
             f"min_gain must be >= 0 (e.g. 0.1: a worker must add 10 %) and curve_memory_s >= 0 seconds (0: off), "
             f"got {self.min_gain} and {self.curve_memory_s}")
        need(self.normal_lag_s >= 0 and self.settle_s >= 0,
             "normal_lag_s (≈ checkpoint_every_s) and settle_s (≈ resize pause + sampling interval) must be >= 0")


@dataclass(frozen=True)
class Observation:
    """One sample of the stream, taken every few seconds by the controller from Kafka
    (lag, end offsets) and the training metrics (learned events)."""

    t: float  # seconds, any monotonic origin
    lag: int  # events not yet in a checkpoint (committed consumer-group lag)
    input_rate: float  # events/s produced, averaged over the last sampling interval
    learned_rate: float  # events/s learned over the same interval
    workers: int  # training workers running now

    def __post_init__(self):
        for name in ("t", "lag", "input_rate", "learned_rate", "workers"):
            value = getattr(self, name)
            if not math.isfinite(value) or (name != "t" and value < 0):
                raise ValueError(f"Observation.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Decision:
    """What to run now, and why in words an operator reads in the log and the dashboard."""

    desired: int
    reason: str
    need: float  # workers the load needs, before rounding and clamping


@dataclass(frozen=True)
class State:
    """What the policy remembers between observations; immutable so a trace replays exactly.
    Start from `State()`; keep the one `decide` returns."""

    desired: int | None = None  # what was last asked for; None: take the observed count
    last_change: float | None = None
    arrived: float | None = None  # first observation since the last change with the asked-for group running
    started: float | None = None  # first observation: cool-downs count from here too
    capacity: float | None = None  # events/s per worker; None: capacity_floor
    prev_lag: int | None = None
    needs: tuple[tuple[float, float], ...] = ()  # (t, need) over the longer cool-down
    curve: curves.Curve = ()  # the group's saturated learned rate by size


def decide(obs: Observation, state: State, policy: ScalingPolicy) -> tuple[Decision, State]:
    """The desired worker count after `obs`. It is compared with what was last asked for, not
    with `obs.workers`, so a resize still in progress is not asked for twice."""
    current = state.desired if state.desired is not None else obs.workers
    started = state.started if state.started is not None else obs.t
    arrived = state.arrived if obs.workers == current else None
    if arrived is None and obs.workers == current:
        arrived = obs.t
    capacity, saturated = _capacity(obs, state, policy, current, arrived)
    curve = curves.record(state.curve, obs.workers, obs.learned_rate, obs.t, policy.capacity_alpha) \
        if saturated and policy.curve_memory_s > 0 else state.curve
    backlog = max(0.0, obs.lag - obs.input_rate * policy.normal_lag_s)
    need = (obs.input_rate + backlog / policy.target_drain_s) / capacity
    horizon = obs.t - max(policy.up_cooldown_s, policy.down_cooldown_s)
    # Keep one observation older than the longest cool-down too: a need must be seen past its
    # threshold for the whole cool-down, and samples never land exactly on its start.
    older = [n for n in state.needs if n[0] < horizon][-1:]
    needs = tuple(older + [n for n in state.needs if n[0] >= horizon]) + ((obs.t, need),)
    anchor = max(started, state.last_change if state.last_change is not None else started)
    decision = _choose(obs, current, needs, anchor, capacity, backlog, policy)
    decision, curve = _on_the_curve(decision, obs, current, curve, anchor, policy)
    changed = decision.desired != current
    return decision, State(desired=decision.desired, last_change=obs.t if changed else state.last_change,
                           arrived=None if changed else arrived, started=started, capacity=capacity,
                           prev_lag=obs.lag, needs=needs, curve=curve)


def _on_the_curve(decision: Decision, obs: Observation, current: int, curve: curves.Curve, anchor: float,
                  policy: ScalingPolicy) -> tuple[Decision, curves.Curve]:
    """The load's decision held against what each group size was measured to learn: no more
    workers than pay, and back to a smaller group that learned as much as this one (a verdict
    that holds for curve_memory_s)."""
    now, memory, gain = obs.t, policy.curve_memory_s, policy.min_gain
    if decision.desired > current:
        size, why_not = curves.worth_adding(curve, current, decision.desired, now, memory, gain)
        if size == current:
            return Decision(current, f"{why_not}: staying at {current} (the load alone asks for "
                                     f"{decision.desired})", decision.need), curve
        if size < decision.desired:
            why = curves.ruled_out(curve, decision.desired, now, memory) or \
                curves.no_gain(curve, current, decision.desired, now, memory, gain)
            return Decision(size, f"{decision.reason}; only {size}: {why}", decision.need), curve
        return decision, curve
    if decision.desired == current and now - anchor >= policy.up_cooldown_s:
        smaller, why = curves.as_good_smaller(curve, current, policy.min_workers, now, memory, gain)
        if smaller < current:
            return Decision(smaller, f"{why}: {current} → {smaller}", decision.need), \
                curves.rule_out(curve, current, now)
    return decision, curve


def _capacity(obs: Observation, state: State, policy: ScalingPolicy, current: int,
              arrived: float | None) -> tuple[float, bool]:
    """EWMA of learned_rate / workers, and whether this sample is a saturated one. Only a
    saturated pipeline (lag above normal and growing, or twice normal) shows what a worker can
    do; an unsaturated one shows a lower bound, so it may only raise the estimate. Rates during
    a resize and in the new group's first `settle_s` (counted from when it was first seen
    running, not from the decision: a warm start can take half a minute) say nothing."""
    estimate = state.capacity if state.capacity is not None else policy.capacity_floor
    settled = obs.workers == current and (state.last_change is None or
                                          (arrived is not None and obs.t - arrived >= policy.settle_s))
    saturated = False
    if settled and obs.workers > 0:
        sample = obs.learned_rate / obs.workers
        normal = obs.input_rate * policy.normal_lag_s
        growing = state.prev_lag is not None and obs.lag > state.prev_lag
        saturated = obs.lag > normal and (growing or obs.lag > 2 * normal)
        if saturated or sample > estimate:
            estimate += policy.capacity_alpha * (sample - estimate)
    return max(estimate, policy.capacity_floor), saturated


def _choose(obs: Observation, current: int, needs: tuple[tuple[float, float], ...], anchor: float,
            capacity: float, backlog: float, policy: ScalingPolicy) -> Decision:
    lo, hi = policy.min_workers, policy.max_workers
    need = needs[-1][1]
    if not lo <= current <= hi:
        target = min(max(current, lo), hi)
        return Decision(target, f"{current} workers is outside [{lo}, {hi}]: {target}", need)
    up_at, down_at = current * (1 + policy.up_margin), current * (1 - policy.down_margin)

    if need > up_at:
        if current >= hi:
            return Decision(current, f"at max_workers {hi}: {_why(obs, need, capacity, backlog, policy)}; "
                                     "raise max_workers if training, not Kafka, is the bottleneck", need)
        run = _run(needs, lambda n: n > up_at)
        wait = _wait(obs.t, anchor, run[0][0], policy.up_cooldown_s, f"above {up_at:.1f}")
        # The smallest need of the cool-down: what the load has asked for all along, not its peak.
        target = min(hi, math.ceil(min(n for t, n in run if t >= obs.t - policy.up_cooldown_s)))
        why = _why(obs, target, capacity, backlog, policy)
        if wait:
            return Decision(current, f"{why}; {wait}", need)
        return Decision(target, f"{why}: {current} → {target}", need)

    if need < down_at and current > lo:
        run = _run(needs, lambda n: n < down_at)
        wait = _wait(obs.t, anchor, run[0][0], policy.down_cooldown_s, f"below {down_at:.1f}")
        # The largest need of the cool-down, so the smaller cluster fits every load just seen.
        peak = max(n for t, n in run if t >= obs.t - policy.down_cooldown_s)
        target = max(lo, math.ceil(peak))
        if target < current:
            if wait:
                return Decision(current, f"load fell to a need of {need:.1f} workers; {wait}", need)
            return Decision(target, f"load fell: at most {peak:.1f} workers needed for {policy.down_cooldown_s:.0f} s "
                                    f"(input {obs.input_rate:.0f}/s, lag {obs.lag}): {current} → {target}", need)
        return Decision(current, f"need {need:.1f}, but up to {peak:.1f} in the last {policy.down_cooldown_s:.0f} s: "
                                 f"{current} workers still needed", need)
    if need < down_at:
        return Decision(current, f"at min_workers {lo}: need {need:.1f}", need)
    return Decision(current, f"{current} workers fit: need {need:.1f} (up above {up_at:.1f}, down below "
                             f"{down_at:.1f}) at ~{capacity:.0f} events/s per worker", need)


def _wait(now: float, anchor: float, run_start: float, cooldown: float, past: str) -> str:
    """Why a change must wait, or "" when it may happen now."""
    since_change, since_run = now - anchor, now - run_start
    if since_change < cooldown and since_change <= since_run:
        return f"cool-down {cooldown - since_change:.0f} s left"
    if since_run < cooldown:
        return f"need must stay {past} {cooldown - since_run:.0f} s more"
    return ""


def _run(needs: tuple[tuple[float, float], ...], past: Callable[[float], bool]) -> tuple[tuple[float, float], ...]:
    """The newest unbroken stretch of observations past a threshold (the last one always is)."""
    start = len(needs) - 1
    while start > 0 and past(needs[start - 1][1]):
        start -= 1
    return needs[start:]


def _why(obs: Observation, workers: float, capacity: float, backlog: float, policy: ScalingPolicy) -> str:
    n = workers if isinstance(workers, int) else f"{workers:.1f}"
    if backlog > obs.input_rate * policy.target_drain_s * 0.1:  # the backlog, not the rate, drives it
        return f"lag {obs.lag} drains in {policy.target_drain_s:.0f} s only with {n} workers " \
               f"(input {obs.input_rate:.0f}/s, ~{capacity:.0f}/s per worker)"
    return f"input {obs.input_rate:.0f}/s needs {n} workers at ~{capacity:.0f}/s each"
