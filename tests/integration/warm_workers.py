"""Training worker processes kept ready on the session's Ray, started while the machine is idle.

Every test that trains starts a Ray Train group, and most of a group's start is its workers'
processes starting and importing torch and the loop (train/preload.py): ~5 CPU-s each, ~5 s of a
run's ~15 on two cores (measured: a 4,000-event run took 14.0-17.1 s cold and 9.2-10.5 s when its
two workers found processes started ahead, alternating; the five direct aimed-fault tests 129.6 s
without, 118.9 s with, their restarts taking what an idle moment had started). Ray hands an idle process to a new actor
started in the same runtime env, as a resize's warm pool does (autoscale/warmpool.py), so the
session keeps `KEEP` such processes ready on its node, and starts a replacement only while the
machine is mostly idle (a test waiting, asserting on one core), never beside a busy group start.

What a test checks is unchanged: the same actors run the same loop; only when their process was
born differs. A process nobody takes costs its imports and ~0.4 GB until the session ends.
"""

from __future__ import annotations

import json
import os
import threading

import psutil

from streamlearn.autoscale.warmpool import _prestart
from streamlearn.train.preload import SETUP_HOOK_ENV, WORKER_RUNTIME_ENV

# Worker processes: a 2-worker group, the suite's most common, and its restart after a test's
# kill. 0 turns the whole thing off (to measure the session without it).
KEEP = int(os.environ.get("STREAMLEARN_TEST_WARM_WORKERS", "4"))
# Ray Train's controller and the two helpers it starts in its own env (autoscale/warmpool.py):
# their processes are born with Ray imported, the rest of their imports come with the actor.
CONTROLLER_FAMILY = 3
BUSY_AT_MOST = 0.5  # of the machine's cores, over the last second, to start one
KEEP_ALIVE_S = 3 * 3600  # the session's length at most; Ray kills an untaken one after it


def runtime_envs() -> dict[str, str]:
    """The serialized runtime envs Ray Train 2.60 starts a group in, as the raylet compares them:
    the controller's (the variables Train propagates from the driver, and one default it adds),
    serialized as Ray's Python API writes it; the workers' (those and ours), as Ray's core worker
    rewrites it after merging it with the controller's (sorted keys, no spaces)."""
    from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR as WARN
    from ray.train.v2._internal.constants import (  # internal; Ray is pinned to 2.60
        DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE,
        get_env_vars_to_propagate,
    )

    controller = {WARN: DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE, **get_env_vars_to_propagate()}
    workers = {**controller, **WORKER_RUNTIME_ENV["env_vars"]}
    # Workers first: what the pool starts first when both are short, the larger share of a start.
    return {"worker": json.dumps({"env_vars": workers}, separators=(",", ":"), sort_keys=True),
            "controller": json.dumps({"env_vars": controller}, sort_keys=True)}


class WarmWorkers(threading.Thread):
    def __init__(self, raylet_address: str, raylet_pid: int):
        super().__init__(name="warm-workers", daemon=True)
        self.address, self.raylet = raylet_address, psutil.Process(raylet_pid)
        self.envs, self.keep = runtime_envs(), {"worker": KEEP, "controller": CONTROLLER_FAMILY}
        self.started, self._done = dict.fromkeys(self.envs, 0), threading.Event()

    def run(self) -> None:
        busy = _Busy()
        while not self._done.wait(1.0):
            if busy.fraction() > BUSY_AT_MOST:
                continue
            ready = self._ready()
            role = next((r for r in self.envs if ready[r] < self.keep[r]), None)
            if role is None:
                continue
            count = min(self.keep[role] - ready[role], 2)
            try:
                _prestart(self.address, self.envs[role], count, KEEP_ALIVE_S)
            except Exception as e:  # only the session's speed depends on it
                print(f"warm workers: prestart failed: {e}")
                return
            self.started[role] += count
            self._done.wait(3.0)  # their start makes the machine busy: look again after it
            busy.fraction()

    def stop(self) -> str:
        self._done.set()
        self.join(10)
        return f"warm workers: processes started ahead, by env: {self.started}"

    def _ready(self) -> dict[str, int]:
        """Idle processes of the session's raylet in each env: ours, or a run's standby."""
        ready = dict.fromkeys(self.envs, 0)
        for p in self.raylet.children():
            try:
                if (p.cmdline() or [""])[0].strip() == "ray::IDLE" and (role := _role(p.environ())):
                    ready[role] += 1
            except psutil.Error:
                pass
        return ready


def _role(environ: dict[str, str]) -> str | None:
    if SETUP_HOOK_ENV in environ:
        return "worker"
    # Train's controller env: the one default it adds, which a plain Ray process lacks.
    return "controller" if "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC" in environ else None


class _Busy:
    """The machine's busy share of all cores since the last call (/proc/stat)."""

    def __init__(self):
        self.last = _cpu()

    def fraction(self) -> float:
        now = _cpu()
        busy, total = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return busy / total if total else 1.0


def _cpu() -> tuple[int, int]:
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


def session_raylet() -> tuple[str, int]:
    """The raylet of the Ray this process started: its gRPC address and process id."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["Alive"] and n["NodeID"] == here)
    pid = next(p.pid for p in psutil.Process(os.getpid()).children(recursive=True) if p.name() == "raylet")
    return f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}", pid
