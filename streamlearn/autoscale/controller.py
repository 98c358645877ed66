"""The scale controller: feeds the policy, provisions nodes, and tells training when to regroup.

One Ray actor per training run (`scaler-<run_name>` in namespace `streamlearn`). Every
`sample_s` it reads Kafka (end offsets and the group's committed offsets, with kafka-python)
and rank 0's progress reports, asks the pure policy for a worker count, and exports what it
saw. A resize (the states are in handover.py) then goes:

1. the policy wants N workers → the Ray autoscaler is asked for room for a whole group of N
   beside the running one, so nodes start while training goes on;
2. warm, once that room is there: the driver starts the group of N, its workers come up and
   wait; rank 0 of the running group is told to stop, plans a last window that checkpoints,
   and reports `group_stopped`; the waiting group restores that checkpoint and learns;
3. cold, when that room does not come within the policy's `warm_wait_s`: the running group
   stops at a checkpoint first and the driver starts the group of N after it;
4. the new group's first optimizer step ends the resize; its pause (no optimizer step) goes
   to resizes.jsonl and the metrics.

Exactly-once needs nothing new: a resize is a checkpoint followed by a restore, which every
restart already is.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import ray

from streamlearn import metrics
from streamlearn.autoscale.handover import Resizer
from streamlearn.autoscale.naming import NAMESPACE, actor_name
from streamlearn.autoscale.policy import Observation, ScalingPolicy, State, decide
from streamlearn.autoscale.warmpool import WarmPool
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.logs import log
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint as ckpt


class _KafkaSampler:
    """Long-lived kafka-python clients: end offsets and committed offsets, once per sample."""

    def __init__(self, kafka: KafkaSettings, topic: str, group_id: str):
        self.kafka, self.topic, self.group_id = kafka, topic, group_id
        self._consumer = self._admin = None

    def lag_and_ends(self) -> tuple[dict[int, int], dict[int, int]]:
        from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = KafkaConsumer(**self.kafka.kafka_python(), enable_auto_commit=False,
                                           client_id="streamlearn-scaler", request_timeout_ms=10000)
            self._admin = KafkaAdminClient(**self.kafka.kafka_python(), client_id="streamlearn-scaler",
                                           request_timeout_ms=10000)
        try:
            partitions = sorted(self._consumer.partitions_for_topic(self.topic) or [])
            tps = [TopicPartition(self.topic, p) for p in partitions]
            ends = {tp.partition: off for tp, off in self._consumer.end_offsets(tps).items()}
            committed = self._admin.list_group_offsets(self.group_id).get(self.group_id, {})
        except Exception:
            self.close()  # reconnect next time: a broker restart leaves these clients stale
            raise
        done = {tp.partition: m.offset for tp, m in committed.items() if tp.topic == self.topic and m.offset >= 0}
        # Before the first commit the lineage starts at the oldest retained event, i.e. lag = all of it.
        return {p: max(0, end - done.get(p, 0)) for p, end in ends.items()}, ends

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            try:
                if client is not None:
                    client.close()
            except Exception:  # closing a client of a dead broker can raise; nothing to keep
                pass
        self._consumer = self._admin = None


def call(method, *args, timeout_s: float = 60.0):
    """Call the scale controller and wait for the answer, riding out its being briefly out of
    reach: on a loaded machine Ray answered ActorUnavailableError to a driver's poll, and the
    driver died with the run. Every method called this way gives the same answer when asked
    twice, so a retry after a lost reply is safe. A dead controller still raises."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(method.remote(*args), timeout=max(1.0, deadline - time.monotonic()))
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


@ray.remote(num_cpus=0, max_concurrency=8)
class ScaleController:
    def __init__(self, cfg: TrainConfig, kafka: KafkaSettings, policy: ScalingPolicy, workers: int,
                 sample_s: float = 2.0):
        self.cfg, self.policy, self.sample_s = cfg, policy, sample_s
        self.pipeline = load_pipeline(cfg.pipeline).name  # the tag every other metric of the run carries
        self.run_dir = Path(cfg.checkpoint_dir) / cfg.run_name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.kafka = _KafkaSampler(kafka, cfg.topic, cfg.group_id)
        self._lock = threading.Lock()
        self.resizer = Resizer(workers, policy.warm_wait_s)  # the size learning now, and any resize
        self.target = workers  # what the policy wants
        self.reason = "starting"
        self.state = State()
        self.learned_total, self.last_step_t = 0, None
        self._base = 0  # events learned by earlier groups (each group's rank 0 counts from zero)
        self._requester = None  # our requests to Ray's AutoscalingCoordinator
        self._told_to_stop = False  # the running group's rank 0 has been told to stop for a resize
        self._drain_to: dict[int, int] | None = None  # `drain`: the run ends once it learned up to these
        self.learning = False  # whether the running group has taken its first step
        self.resizes: deque[dict[str, Any]] = deque(maxlen=20)
        self.pool = WarmPool(cfg.cpus_per_worker, self.pipeline) if cfg.warm_pool else None
        self._snapshot: dict[str, Any] = {}
        self._prev: tuple[float, int, int] | None = None  # (t, produced, learned) of the last sample
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._loop, name="scaler", daemon=True)
        self._sampler.start()

    @property
    def group(self) -> int:
        return self.resizer.group

    # --- rank 0 -----------------------------------------------------------------------
    # The calls made per window or per poll keep no task events: Ray's GCS keeps each call's
    # events (~3 KB) up to 100,000 tasks, and `progress` alone (~30 calls/s at 2k events/s) grew
    # the GCS 5 MiB/min through the hour's soak (issue 47). The dashboard still lists the actor.
    @ray.method(enable_task_events=False)
    def progress(self, learned_total: int, workers: int, step_t: float) -> None:
        """Rank 0, after each window it learned: events learned by this group, and when."""
        with self._lock:
            if workers != self.group:
                return  # a late report from a group already replaced
            self.learned_total, self.last_step_t = self._base + learned_total, step_t
            self.learning = True
            record = self.resizer.first_step(step_t)
            if record:
                self._finish_resize(record)

    def learn_env(self, role: str, env: str, node_id: str | None = None) -> None:
        """A group's rank 0 (role "worker") and Ray Train's controller ("controller"): the runtime
        env its processes run in, which the warm pool starts the next group's processes in."""
        with self._lock:
            if self.pool is not None:
                self.pool.learn(role, env, node_id)
                if role == "worker":  # every group start, Ray Train's restart after a failure too
                    self.pool.group_started(time.time())

    @ray.method(enable_task_events=False)
    def stop_due(self) -> tuple[int | None, dict[int, int] | None]:
        """The running group's rank 0 polls this: a worker count to stop for now (or None), and
        the end offsets to drain to (`drain`; None: no drain asked)."""
        return self._resize_due(), self._drain_to

    def drain(self) -> dict[int, int]:
        """`streamlearn drain`: learn what the topic holds now, then end the run. Rank 0 stops at
        its first plan past these end offsets that finds nothing new, as --until-idle stops once
        the stream has been empty that long; a group started later (a restart, a resize) hears it
        too. The offsets, not "nothing new" alone: a partition's new leader can answer a high
        watermark behind the old one's for a moment, and rank 0 would have stopped short."""
        from streamlearn.kafka.admin import end_offsets

        ends = end_offsets(self.kafka.kafka, self.cfg.topic)  # its own client: the sampler's is its thread's
        self._drain_to = ends
        log("drain_requested", pipeline=self.pipeline, end_offsets=ends)
        return ends

    def _resize_due(self) -> int | None:
        with self._lock:
            self._begin_resize()
            to = self.resizer.stop_due()
            if to is not None and not self._told_to_stop:
                self._told_to_stop = True
                log("resize_requested", pipeline=self.pipeline, **self.resizer.current.describe())
            return to

    def group_stopped(self) -> bool:
        """The old group's rank 0, after the checkpoint it stopped at: the next group takes over."""
        with self._lock:
            if not self.resizer.stopped(self.last_step_t or time.time()):
                return False
            self._told_to_stop, self.learning = False, False
            self._base = self.learned_total  # the new group counts from zero again
            return True

    def warm_ready(self, gen: int) -> bool:
        """A warm group's rank 0, its workers up: the old group may stop. False: go home."""
        with self._lock:
            ok = self.resizer.warm_ready(gen, time.time())
            if ok:
                self._provision(self.target)  # the new group's placement group holds its room now
                log("warm_group_ready", pipeline=self.pipeline, gen=gen, workers=self.resizer.current.to)
            return ok

    @ray.method(enable_task_events=False)
    def handover(self, gen: int) -> str:
        """Every rank of a warm group polls this: "go", "abort" or "wait"."""
        with self._lock:
            return self.resizer.handover(gen)

    # --- driver -----------------------------------------------------------------------
    @ray.method(enable_task_events=False)
    def warm_plan(self, gen: int) -> int | None:
        """The driver polls this while a group runs: a size to start beside it now (as group `gen`)."""
        with self._lock:
            self._begin_resize()
            to = self.resizer.warm_plan(gen, time.time())
            if to is not None:
                log("warm_group_starting", pipeline=self.pipeline, gen=gen, **self.resizer.current.describe())
            return to

    def warm_failed(self, gen: int, error: str) -> None:
        with self._lock:
            log("warm_group_failed", level="warning", pipeline=self.pipeline, gen=gen, error=error[:300])
            self.resizer.warm_failed(gen)

    def take_resize(self) -> tuple[str, int | None]:
        """The driver, after the running group's fit() returned: ("warm", n) the next group
        already learns, ("cold", n) start one of n, ("end", None) training ended otherwise."""
        with self._lock:
            return self.resizer.take(time.time())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._snapshot)

    def stop(self) -> None:
        """End sampling with one last sample: the run's final commits are in by now, so the lag
        the dashboard keeps showing is the run's end state, not a reading from before its last
        checkpoint (test_metrics once saw a finished run's lag stuck at its last burst)."""
        self._stop.set()
        self._sampler.join(timeout=30)  # kafka-python clients are not shared between threads
        try:
            self._sample()
        except Exception as e:
            log("scaler_sample_failed", level="warning", pipeline=self.pipeline, error=str(e)[:200])
        self.kafka.close()
        with self._lock:
            if self._requester is not None:
                self._requester.cancel_request()  # nothing held for this run any more: idle nodes may go

    # --- the loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.sample_s):
            try:
                self._sample()
            except Exception as e:  # a sample can fail (broker away); the next one may not
                log("scaler_sample_failed", level="warning", pipeline=self.pipeline, error=str(e)[:200])

    def _sample(self) -> None:
        lag, ends = self.kafka.lag_and_ends()
        now, produced = time.time(), sum(ends.values())
        with self._lock:
            learned = self.learned_total
            prev, self._prev = self._prev, (now, produced, learned)
            if prev is None:
                return
            dt = max(now - prev[0], 1e-3)
            obs = Observation(t=time.monotonic(), lag=sum(lag.values()), input_rate=max(0, produced - prev[1]) / dt,
                              learned_rate=max(0, learned - prev[2]) / dt, workers=self.group)
            standby = False
            if self.learning:
                self._decide(obs)
                standby = self.pool is not None and self.target == self.group and self.resizer.current is None
            else:
                # A group starting up learns nothing and its lag grows: no capacity sample and no
                # reason to resize again. Deciding here re-added the workers just removed.
                self.reason = f"group of {self.group} starting: no decision until its first step"
            self._snapshot = self._make_snapshot(now, obs, lag, learned)

        if standby:  # outside the lock: it may ask Ray for its actors and the raylets for processes
            self.pool.standby(time.time())
        metrics.record_scaling(self._snapshot)
        self._append("scaling.jsonl", {k: self._snapshot[k] for k in (
            "t", "lag", "input_rate", "learned_rate", "workers_active", "workers_desired", "reason")})

    def _decide(self, obs: Observation) -> None:
        decision, self.state = decide(obs, self.state, self.policy)
        if decision.desired != self.target:
            log("scale_decision", pipeline=self.pipeline, desired=decision.desired, running=self.group,
                reason=decision.reason)
        self.target, self.reason = decision.desired, decision.reason
        self._warm_pool()
        self._begin_resize()
        # Again each sample: the ask expires, and must follow the target.
        self._provision(self.target)
        r = self.resizer.current
        if self.target != self.group and (r is None or r.state == "warming"):
            self.reason += f"; waiting for the autoscaler to add room for a group of {self.target}" \
                if r is None else f"; starting a group of {r.to} beside the running one"

    def _begin_resize(self) -> None:
        """Start a resize when one is due and the cluster has room for it (warm or cold)."""
        if not self.learning:
            return  # a group starting up: its samples say nothing about capacity yet
        per, gpu = self.cfg.cpus_per_worker, int(self.cfg.use_gpu)
        more = self.target - self.group
        began = self.resizer.consider(self.target, self.reason, time.time(),
                                      room_beside=self._room(self.target * per, self.target * gpu),
                                      room_after=self._room(more * per, more * gpu))
        if began is not None:
            log("resize_begins", pipeline=self.pipeline, **began.describe())
            self._warm_pool()  # room came: the nodes it is on can start the new group's workers now

    def _warm_pool(self) -> None:
        """While a resize is wanted, have the next group's processes started ahead of it
        (autoscale/warmpool.py); forget what was started once none is."""
        if self.pool is None:
            return
        if self.target != self.group:
            self.pool.prepare(self.target)
        elif self.resizer.current is None:
            self.pool.reset()

    def _make_snapshot(self, now: float, obs: Observation, lag: dict[int, int], learned: int) -> dict[str, Any]:
        newest = ckpt.newest(self.run_dir)
        meta = ckpt.read_meta(newest) if newest else None
        return {"t": now, "pipeline": self.pipeline, "run_name": self.cfg.run_name, "topic": self.cfg.topic,
                "lag": obs.lag, "lag_by_partition": {str(p): n for p, n in sorted(lag.items())},
                "input_rate": round(obs.input_rate, 1), "learned_rate": round(obs.learned_rate, 1),
                "learned_total": learned, "workers_active": self.group, "workers_desired": self.target,
                "reason": self.reason, "capacity_per_worker": round(self.state.capacity or 0.0, 1),
                "min_workers": self.policy.min_workers, "max_workers": self.policy.max_workers,
                "checkpoint": None if meta is None else {
                    "version": meta["version"], "written_at": meta.get("written_at"),
                    "online": meta.get("metrics", {}).get("online", {}),
                    "matured": meta.get("metrics", {}).get("matured"),
                    "ingest": meta.get("metrics", {}).get("ingest", {}),
                    "join": meta.get("metrics", {}).get("join")},
                "resizing": self.resizer.state(), "resizes": list(self.resizes)}

    def _provision(self, workers: int) -> None:
        """Ask the Ray autoscaler for room for the extra workers before the group stops, so the
        pause does not include starting nodes; withdraw the ask when none are needed.

        Through Ray's AutoscalingCoordinator, not `ray.autoscaler.sdk.request_resources`: Ray
        Train and Ray Data already send their requests through it, and it replaces the cluster's
        whole request with the merge of its requesters', so a direct call would be overwritten
        within seconds. Only the difference is asked for: the running group's own request
        (Train's) covers the rest. Internal API, pinned with Ray 2.60 and covered by
        tests/integration/test_autoscale.py."""
        more = self.resizer.bundles_to_ask(workers, time.time())
        if more <= 0 and self._requester is None:
            return  # nothing asked yet, so nothing to withdraw: a fixed-size run never imports Ray Data here
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            DefaultAutoscalingCoordinator,
            ResourceRequestPriority,
        )

        if self._requester is None:
            self._requester = DefaultAutoscalingCoordinator(requester_id=f"streamlearn-{self.cfg.run_name}")
        if more <= 0:
            self._requester.cancel_request()
            return
        bundle = {"CPU": self.cfg.cpus_per_worker, **({"GPU": 1} if self.cfg.use_gpu else {})}
        self._requester.request_resources([bundle] * more, expire_after_s=300, priority=ResourceRequestPriority.HIGH)

    @staticmethod
    def _room(cpus: float, gpus: int) -> bool:
        """Whether the cluster has this much free now (a group of workers' bundles)."""
        if cpus <= 0:
            return True
        free = ray.available_resources()
        return free.get("CPU", 0) + 1e-9 >= cpus and free.get("GPU", 0) >= gpus

    def _finish_resize(self, record: dict[str, Any]) -> None:
        if self.pool is not None:
            record["prestarted"] = sum(self.pool.sent.values())
            self.pool.reset()
        self.resizes.append(record)
        self._provision(self.group)  # the new group's own request covers it now
        self._append("resizes.jsonl", record)
        metrics.record_resize(self.pipeline, record["pause_s"])
        log("resized", pipeline=self.pipeline, **record)

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(row) + "\n")


def start_controller(cfg: TrainConfig, kafka: KafkaSettings, policy: ScalingPolicy, workers: int,
                     sample_s: float = 2.0):
    """Start this run's controller beside the driver (it holds no CPU), replacing a stale one.

    Pinned to the driver's node: Ray places an actor that asks for no resources on a random
    node, and any live actor keeps its node from ever counting as idle, so the autoscaler
    could never remove a worker node that happened to host the controller."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = actor_name(cfg.run_name)
    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))  # left by a driver that died
    except ValueError:
        pass
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ScaleController.options(name=name, namespace=NAMESPACE, scheduling_strategy=here).remote(
        cfg, kafka, policy, workers, sample_s)
