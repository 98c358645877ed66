"""One resize at a time, as a small state machine the scale controller drives (pure; unit-tested).

A resize is warm when the cluster has room for the whole new group beside the running one:
the new group starts while the old one keeps learning, its workers come up (processes, torch,
gloo, Kafka clients) and wait before restoring; only then is the old group told to checkpoint
and stop, and the new one restores that checkpoint. The pause (no optimizer step) is a
checkpoint, a restore and a first window, not a Ray Train run's start:

    warming   room beside the old group: the driver is to start the new one
    started   the driver started it; Ray Train is bringing its workers up
    ready     its workers wait before restoring; the old group is told to stop at a checkpoint
    handed    the old group checkpointed and stopped; the new group restores and learns

A resize is cold when that room does not come within `warm_wait_s` (a cluster at its node
limit): the old group stops first and the new one starts after it, as every restart does:

    stopping  the old group is told to checkpoint and stop
    stopped   it did; the driver starts the new group once the old one's fit() returns
    restarting  the driver started it

Both end at the new group's first optimizer step. Exactly-once needs nothing new: either way a
resize is a checkpoint followed by a restore of that checkpoint.

Each resize's record says where its seconds went, from the policy's decision on: waiting for room
(the autoscaler adding nodes), the new group's start (processes, imports, model), the old group's
way to a checkpoint to stop at, and the pause. `decision_to_first_step_s` is the figure an
operator waits through; `requested_at` (room there, the resize begun) is kept for what came before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Resize:
    frm: int
    to: int
    reason: str
    requested_at: float
    warm: bool
    state: str
    gen: int | None = None  # the warm group's number, once the driver started it
    stopped_at: float | None = None  # the old group's last optimizer step
    decided_at: float | None = None  # when the policy first wanted this size (before any room)
    started_at: float | None = None  # the driver started the new group
    ready_at: float | None = None  # a warm group's workers up and waiting

    def describe(self) -> dict[str, Any]:
        return {"from": self.frm, "to": self.to, "reason": self.reason, "requested_at": self.requested_at,
                "mode": "warm" if self.warm else "cold"}


class Resizer:
    def __init__(self, group: int, warm_wait_s: float):
        self.group = group  # size of the group learning now (or about to, after a handover)
        self.warm_wait_s = warm_wait_s
        self.current: Resize | None = None
        self._want_since: float | None = None  # when the target first differed from the group
        self._outcomes: dict[int, str] = {}  # warm group number -> "go" | "abort"

    # --- the controller, each sample and each rank-0 poll -------------------------------
    def consider(self, target: int, reason: str, now: float, *, room_beside: bool, room_after: bool) -> Resize | None:
        """Begin a resize if one is due; return it when one began."""
        r = self.current
        if r is not None and r.state == "warming":  # not started yet: follow the target
            if target == self.group:
                self.current = None
            else:
                r.to = target
        if self.current is not None:
            return None
        if target == self.group:
            self._want_since = None
            return None
        if self._want_since is None:
            self._want_since = now
        if room_beside and self._warm_allowed(now):
            self.current = Resize(self.group, target, reason, now, warm=True, state="warming",
                                  decided_at=self._want_since)
        elif room_after and not self._warm_allowed(now):
            self.current = Resize(self.group, target, reason, now, warm=False, state="stopping",
                                  decided_at=self._want_since)
        return self.current

    def bundles_to_ask(self, target: int, now: float) -> int:
        """Worker bundles to ask the autoscaler for beyond what running groups hold."""
        r = self.current
        if r is not None:
            if r.warm:
                return r.to if r.state in ("warming", "started") else 0  # a started group asks for itself
            return max(0, r.to - r.frm) if r.state != "restarting" else 0
        if target == self.group:
            return 0
        return target if self._warm_allowed(now) else max(0, target - self.group)

    def _warm_allowed(self, now: float) -> bool:
        return self.warm_wait_s > 0 and (self._want_since is None or now - self._want_since < self.warm_wait_s)

    # --- the driver -----------------------------------------------------------------------
    def warm_plan(self, gen: int, now: float | None = None) -> int | None:
        """The size of a group to start now beside the running one (numbered `gen`), or None."""
        r = self.current
        if r is not None and r.state == "started" and r.gen == gen:
            return r.to  # asked again (a reply lost on the way): the same answer
        if r is None or not r.warm or r.state != "warming":
            return None
        r.state, r.gen, r.started_at = "started", gen, now
        return r.to

    def warm_failed(self, gen: int) -> None:
        """The warm group's run ended before the handover: drop it, or finish the resize cold if
        the old group was already told to stop."""
        r = self.current
        if r is None or r.gen != gen or r.state == "handed":
            return
        self._outcomes[gen] = "abort"
        if r.state == "stopping":
            r.warm = False  # the old group stops anyway; the driver starts the new one after it
        else:
            self.current = None

    def take(self, now: float | None = None) -> tuple[str, int | None]:
        """After the running group's fit() returned: ("warm", n) the new group already learns,
        ("cold", n) start one of n now, ("end", None) training ended for another reason."""
        r = self.current
        if r is None:
            return "end", None
        if r.state == "handed":
            return "warm", r.to
        if r.state in ("stopped", "restarting"):  # "restarting": asked again, same answer
            if r.state == "stopped":
                r.started_at = now
            r.state = "restarting"
            return "cold", r.to
        # The old group ended for another reason (its bound, idle): a waiting group goes home.
        if r.gen is not None:
            self._outcomes[r.gen] = "abort"
        self.current = None
        return "end", None

    # --- the workers ----------------------------------------------------------------------
    def warm_ready(self, gen: int, now: float | None = None) -> bool:
        """The warm group's rank 0, its workers up: the old group may be told to stop now."""
        r = self.current
        if r is None or r.gen != gen or r.state != "started":
            return False
        r.state, r.ready_at = "ready", now
        return True

    def handover(self, gen: int) -> str:
        """Every rank of a warm group polls this: "go" (restore and learn), "abort", or "wait"."""
        return self._outcomes.get(gen, "wait")

    def stop_due(self) -> int | None:
        """The running group's rank 0 polls this: a size to checkpoint and stop for, or None."""
        r = self.current
        if r is None or r.state not in ("ready", "stopping"):
            return None
        r.state = "stopping"
        return r.to

    def stopped(self, last_step_t: float) -> bool:
        """The old group's rank 0, after its last checkpoint: the new group takes over from it."""
        r = self.current
        if r is None or r.state != "stopping":
            return False
        r.stopped_at, self.group = last_step_t, r.to
        if r.warm:
            r.state = "handed"
            self._outcomes[r.gen] = "go"
        else:
            r.state = "stopped"
        self._want_since = None
        return True

    def first_step(self, step_t: float) -> dict[str, Any] | None:
        """The new group's first optimizer step ends the resize: its record, pause included."""
        r = self.current
        if r is None or r.state not in ("handed", "restarting"):
            return None
        self.current = None
        return {"t": step_t, **r.describe(), "pause_s": round(max(0.0, step_t - r.stopped_at), 2),
                "decided_at": r.decided_at, "decision_to_first_step_s": _since(r.decided_at, step_t),
                "seconds": _seconds(r, step_t)}

    def state(self) -> dict[str, Any] | None:
        return None if self.current is None else {**asdict(self.current)}


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start), 2)


def _seconds(r: Resize, step_t: float) -> dict[str, float | None]:
    """Where a resize's seconds went, decision to first step, in order (None: not known). Warm:
    the new group starts while the old learns on, then the old one is told to stop. Cold: the
    old one stops first, then the new one starts (its start is inside the pause)."""
    if r.warm:
        return {"waiting_for_room": _since(r.decided_at, r.requested_at),
                "until_started": _since(r.requested_at, r.started_at),
                "group_start": _since(r.started_at, r.ready_at),
                "old_group_to_stop": _since(r.ready_at, r.stopped_at),
                "pause": _since(r.stopped_at, step_t)}
    return {"waiting_for_room": _since(r.decided_at, r.requested_at),
            "old_group_to_stop": _since(r.requested_at, r.stopped_at),
            "group_start": _since(r.started_at, step_t),
            "pause": _since(r.stopped_at, step_t)}
