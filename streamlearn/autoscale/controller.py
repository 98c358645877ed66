"""The scale controller: feeds the policy, provisions nodes, and tells training when to regroup.

One Ray actor per training run (`scaler-<run_name>` in namespace `streamlearn`). Every
`sample_s` it reads Kafka (end offsets and the group's committed offsets, with kafka-python)
and rank 0's progress reports, asks the pure policy for a worker count, and exports what it
saw. A resize then goes:

1. the policy wants N workers → the Ray autoscaler is asked for the extra workers' bundles,
   so new nodes start while training goes on;
2. once the cluster has room, `resize_due` answers rank 0's poll with N; rank 0 plans a last
   window that checkpoints and stops, so every rank stops at the same offsets;
3. `fit()` returns in the driver, `take_resize` hands it N, and it starts a group of N that
   restores that checkpoint;
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
from streamlearn.autoscale.policy import Observation, ScalingPolicy, State, decide
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.logs import log
from streamlearn.pipeline import load_pipeline
from streamlearn.train import checkpoint as ckpt

NAMESPACE = "streamlearn"


def actor_name(run_name: str) -> str:
    return f"scaler-{run_name}"


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


@ray.remote(num_cpus=0, max_concurrency=4)
class ScaleController:
    def __init__(self, cfg: TrainConfig, kafka: KafkaSettings, policy: ScalingPolicy, workers: int,
                 sample_s: float = 2.0):
        self.cfg, self.policy, self.sample_s = cfg, policy, sample_s
        self.pipeline = load_pipeline(cfg.pipeline).name  # the tag every other metric of the run carries
        self.run_dir = Path(cfg.checkpoint_dir) / cfg.run_name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.kafka = _KafkaSampler(kafka, cfg.topic, cfg.group_id)
        self._lock = threading.Lock()
        self.group = workers  # size of the group running (or being started) now
        self.target = workers  # what the policy wants
        self.reason = "starting"
        self.state = State()
        self.stopping: dict[str, Any] | None = None  # a resize rank 0 has been told to make
        self.resuming: dict[str, Any] | None = None  # a resize waiting for the new group's first step
        self.learned_total, self.last_step_t = 0, None
        self._base = 0  # events learned by earlier groups (each group's rank 0 counts from zero)
        self._requester = None  # our requests to Ray's AutoscalingCoordinator
        self.learning = False  # whether the running group has taken its first step
        self.resizes: deque[dict[str, Any]] = deque(maxlen=20)
        self._snapshot: dict[str, Any] = {}
        self._prev: tuple[float, int, int] | None = None  # (t, produced, learned) of the last sample
        self._stop = threading.Event()
        threading.Thread(target=self._loop, name="scaler", daemon=True).start()

    # --- rank 0 -----------------------------------------------------------------------
    def progress(self, learned_total: int, workers: int, step_t: float) -> None:
        """Rank 0, after each window it learned: events learned by this group, and when."""
        with self._lock:
            if workers != self.group:
                return  # a late report from a group already replaced
            self.learned_total, self.last_step_t = self._base + learned_total, step_t
            self.learning = True
            if self.resuming:
                self._finish_resize(step_t)

    def resize_due(self) -> int | None:
        """Rank 0 polls this: a worker count to regroup at now, or None to carry on."""
        with self._lock:
            if self.stopping is None and self.resuming is None and self.target != self.group and self._room():
                self.stopping = {"from": self.group, "to": self.target, "reason": self.reason,
                                 "requested_at": time.time()}
                log("resize_requested", pipeline=self.pipeline, **self.stopping)
            return self.stopping["to"] if self.stopping else None

    # --- driver -----------------------------------------------------------------------
    def take_resize(self) -> int | None:
        """The driver, after fit() returned: the size to start the next group at, or None when
        training ended for another reason (its bound, or it was asked to stop)."""
        with self._lock:
            if self.stopping is None:
                return None
            self.resuming = {**self.stopping, "stopped_at": self.last_step_t or time.time()}
            self.stopping = None
            self.group = self.resuming["to"]
            self.learning = False
            self._base = self.learned_total  # the new group counts from zero again
            return self.group

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._snapshot)

    def stop(self) -> None:
        self._stop.set()
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
            if self.learning:
                self._decide(obs)
            else:
                # A group starting up learns nothing and its lag grows: no capacity sample and no
                # reason to resize again. Deciding here re-added the workers just removed.
                self.reason = f"group of {self.group} starting: no decision until its first step"
            self._snapshot = self._make_snapshot(now, obs, lag, learned)

        metrics.record_scaling(self._snapshot)
        self._append("scaling.jsonl", {k: self._snapshot[k] for k in (
            "t", "lag", "input_rate", "learned_rate", "workers_active", "workers_desired", "reason")})

    def _decide(self, obs: Observation) -> None:
        decision, self.state = decide(obs, self.state, self.policy)
        if decision.desired != self.target:
            log("scale_decision", pipeline=self.pipeline, desired=decision.desired, running=self.group,
                reason=decision.reason)
        self.target, self.reason = decision.desired, decision.reason
        if self.stopping is None and self.resuming is None:
            self._provision(self.target)  # again each sample: the ask expires, and must follow the target
        if self.target > self.group and self.stopping is None and not self._room():
            self.reason += f"; waiting for the autoscaler to add room for {self.target - self.group} more"

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
                    "online": meta.get("metrics", {}).get("online", {})},
                "resizes": list(self.resizes)}

    def _provision(self, workers: int) -> None:
        """Ask the Ray autoscaler for room for the extra workers before the group stops, so the
        pause does not include starting nodes; withdraw the ask when none are needed.

        Through Ray's AutoscalingCoordinator, not `ray.autoscaler.sdk.request_resources`: Ray
        Train and Ray Data already send their requests through it, and it replaces the cluster's
        whole request with the merge of its requesters', so a direct call would be overwritten
        within seconds. Only the difference is asked for: the running group's own request
        (Train's) covers the rest. Internal API, pinned with Ray 2.60 and covered by
        tests/integration/test_autoscale.py."""
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            DefaultAutoscalingCoordinator,
            ResourceRequestPriority,
        )

        if self._requester is None:
            self._requester = DefaultAutoscalingCoordinator(requester_id=f"streamlearn-{self.cfg.run_name}")
        more = workers - self.group
        if more <= 0:
            self._requester.cancel_request()
            return
        bundle = {"CPU": self.cfg.cpus_per_worker, **({"GPU": 1} if self.cfg.use_gpu else {})}
        self._requester.request_resources([bundle] * more, expire_after_s=300, priority=ResourceRequestPriority.HIGH)

    def _room(self) -> bool:
        """Whether the cluster can start the target group once the running one lets go."""
        more = self.target - self.group
        if more <= 0:
            return True
        free = ray.available_resources()
        return (free.get("CPU", 0) + 1e-9 >= more * self.cfg.cpus_per_worker
                and (not self.cfg.use_gpu or free.get("GPU", 0) >= more))

    def _finish_resize(self, step_t: float) -> None:
        r = self.resuming
        pause = max(0.0, step_t - r["stopped_at"])
        record = {"t": step_t, "from": r["from"], "to": r["to"], "reason": r["reason"], "pause_s": round(pause, 2),
                  "requested_at": r["requested_at"]}
        self.resizes.append(record)
        self.resuming = None
        self._provision(self.group)  # the new group's own request covers it now
        self._append("resizes.jsonl", record)
        metrics.record_resize(self.pipeline, pause)
        log("resized", pipeline=self.pipeline, **record)

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(row) + "\n")


def start_controller(cfg: TrainConfig, kafka: KafkaSettings, policy: ScalingPolicy, workers: int,
                     sample_s: float = 2.0):
    """Start this run's controller on the head (it holds no CPU), replacing a stale one."""
    name = actor_name(cfg.run_name)
    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))  # left by a driver that died
    except ValueError:
        pass
    return ScaleController.options(name=name, namespace=NAMESPACE).remote(cfg, kafka, policy, workers, sample_s)
