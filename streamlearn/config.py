"""Configuration: edge settings (Kafka, secrets) from env, run settings as dataclasses.

Everything validates when it is built, so a wrong value fails at start-up with a
message that says how to fix it, not minutes later inside a Ray worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamlearn.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """Jars, broker data and the virtual environment live here, outside any clone."""
    path = Path(os.environ.get("STREAMLEARN_CACHE", Path.home() / ".cache" / "streamlearn"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def repo_file(relative: str) -> Path:
    path = REPO_ROOT / relative
    if not path.exists():
        raise ConfigError(f"{relative} is missing from {REPO_ROOT}; run from a full checkout of streamlearn")
    return path


class KafkaSettings(BaseSettings):
    """How to reach Kafka. Env: STREAMLEARN_KAFKA_BOOTSTRAP, STREAMLEARN_KAFKA_SASL_PASSWORD, ..."""

    model_config = SettingsConfigDict(env_prefix="STREAMLEARN_KAFKA_", frozen=True, extra="forbid")

    bootstrap: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None

    def __init__(self, **values: Any):
        # pydantic's ValidationError repeats the inputs, the password among them: report only
        # which setting is wrong and why.
        try:
            super().__init__(**values)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'settings'}: "
                                 f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())
            raise ConfigError(f"Kafka settings (env STREAMLEARN_KAFKA_*): {problems}") from None

    @model_validator(mode="after")
    def _sasl_complete(self):
        if self.security_protocol.startswith("SASL") and not (self.sasl_mechanism and self.sasl_username
                                                               and self.sasl_password):
            raise ValueError("SASL needs sasl_mechanism, sasl_username and sasl_password "
                             "(env STREAMLEARN_KAFKA_SASL_MECHANISM/_USERNAME/_PASSWORD)")
        return self

    def confluent(self) -> dict[str, Any]:
        """Settings for confluent-kafka (librdkafka), the data plane."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf |= {"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                     "sasl.password": self.sasl_password.get_secret_value()}
        if self.ssl_cafile:
            conf["ssl.ca.location"] = self.ssl_cafile
        return conf

    def kafka_python(self) -> dict[str, Any]:
        """Settings for kafka-python, the control plane (admin, lag, commits)."""
        conf: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.sasl_username,
                     "sasl_plain_password": self.sasl_password.get_secret_value()}
        if self.ssl_cafile:
            conf["ssl_cafile"] = self.ssl_cafile
        return conf


INGEST_MODES = ("auto", "direct", "ray-data")


def choose_ingest(use_gpu: bool) -> tuple[str, str]:
    """`--ingest auto`: the mode and why, from what was measured (docs/BENCHMARKS.md, "GPU path").
    Ray Data moves the decode off the trainer onto lanes; that pays where the trainer's own CPU
    would otherwise decode between GPU steps, and not where CPU workers train: there the lanes'
    blocks cost more than the decode they take away, spare cores or not."""
    if use_gpu:
        return "ray-data", ("auto: GPU trainers; Ray Data's lanes decode on CPUs the trainer does not use "
                            "(1.40x direct under one NCCL worker, H200 2026-12-04)")
    return "direct", ("auto: CPU trainers; each rank decodes its own slice, cheaper than Ray Data's lanes "
                      "(0.92x direct at 4 workers with 12 cores spare, 0.79x at 2 on 2 cores)")


# How a group of workers stays one model (train/averaging.py, DECISIONS): "step" allreduces every
# step's gradients (DDP); "window" lets each rank step on its own slice and averages the weights
# and the optimizer's moments once per window, one allreduce instead of one a step.
SYNC_MODES = ("step", "window")


@dataclass(frozen=True)
class TrainConfig:
    """One continuous-training run. Defaults suit a 2-core laptop."""

    pipeline: str = "fraud"
    topic: str = "transactions"
    dlq_topic: str = ""  # default: "<topic>.dlq"
    group_id: str = ""  # default: "streamlearn-<pipeline>"
    workers: int = 2
    # "direct": each rank reads Kafka itself; "ray-data": a Ray Data pipeline feeds the ranks; "auto"
    # (the default): the measured rule in choose_ingest. Resolved at construction, with its reason.
    ingest: str = "auto"
    ingest_why: str = ""  # why ingest is what it is: set with it, shown in the job's log and `streamlearn status`
    # --ingest ray-data: the Dataset's read tasks, each a Kafka consumer that decodes whole partitions.
    # 2 fed 4 workers at 0.92x the direct path on a 16-core machine, 4 at 0.42x (docs/BENCHMARKS.md "GPU path").
    read_lanes: int = 2
    use_gpu: bool = False
    sync: str = "window"  # issue 48: 2 workers 1.43x one with it, 0.84x with "step" (docs/BENCHMARKS.md)
    cpus_per_worker: float = 0.5
    batch_size: int = 256
    # Most events the window planner hands a group at once, up to 2 workers; beyond, half of it a worker
    # (window_for): under --sync window each rank then keeps its 16 steps between two averages.
    window_events: int = 8192
    poll_interval_s: float = 0.2  # how often an idle stream is asked for new events
    checkpoint_every_steps: int = 200
    # Serving sees only checkpoints: produced -> served takes up to this plus ~2 s of learning,
    # writing, polling and the swap moment (issue 14's freshness, p99 <= 5 s; DECISIONS §19).
    checkpoint_every_s: float = 2.0
    keep_checkpoints: int = 30  # rollback reach; the served and pinned versions are kept anyway
    checkpoint_dir: str = str(Path.home() / "streamlearn-checkpoints")
    run_name: str = ""  # default: the pipeline name; one name = one checkpoint lineage
    max_events: int | None = None  # stop once this many events are learned or dead-lettered
    until_idle_s: float | None = None  # stop after the stream has been empty this long
    max_failures: int = 5  # worker crashes Ray Train recovers from before giving up
    metric_window: int = 5000  # prequential metrics over the last N events per rank
    # Rank 0's newest events per checkpoint, with their predict-then-learn scores, that the scorer's
    # gate judges the checkpoint on against the served model (train/evidence.py); 0: none kept.
    gate_evidence: int = 4096
    drift: bool = True  # rank 0's drift detectors (train/drift.py); off saves ~0.5 us an event on rank 0 (§21)
    warm_pool: bool = True  # start a resize's processes ahead of it, imports done (autoscale/warmpool.py)
    # Delayed feedback: keep each learned event's features on disk (run dir, bounded by the events
    # topic's retention), so a late report's event is a local read, not a Kafka re-read (ingest/rowstore.py).
    feedback_rows: bool = True
    seed: int = 0
    timeline: str = ""  # opt-in Chrome-trace file of where each rank spends its time

    def __post_init__(self):
        def need(ok: bool, message: str):
            if not ok:
                raise ConfigError(message)

        need(self.ingest in INGEST_MODES, f"ingest must be one of {', '.join(INGEST_MODES)}, got {self.ingest!r}")
        if self.ingest == "auto":
            mode, why = choose_ingest(self.use_gpu)
            object.__setattr__(self, "ingest", mode)
            object.__setattr__(self, "ingest_why", why)
        elif not self.ingest_why:
            object.__setattr__(self, "ingest_why", f"asked for (--ingest {self.ingest})")
        need(self.workers >= 1, f"workers must be >= 1, got {self.workers}")
        need(self.read_lanes >= 1, f"read_lanes must be >= 1 (Ray Data's Kafka readers), got {self.read_lanes}")
        need(self.sync in SYNC_MODES, f"sync must be one of {', '.join(SYNC_MODES)} ('step': DDP's allreduce of "
                                      f"every step's gradients; 'window': weights averaged once a window), "
                                      f"got {self.sync!r}")
        need(self.cpus_per_worker > 0, "cpus_per_worker must be > 0 (fractions like 0.5 let workers share a core)")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.window_events >= self.workers, "window_events must be at least the number of workers")
        need(self.checkpoint_every_steps >= 1 and self.checkpoint_every_s > 0,
             "checkpoint_every_steps must be >= 1 and checkpoint_every_s > 0")
        need(self.keep_checkpoints >= 2, "keep_checkpoints must be >= 2 (the serving model and a newer one)")
        need(self.max_events is None or self.max_events > 0, "max_events must be positive, or unset to run forever")
        need(self.until_idle_s is None or self.until_idle_s > 0, "until_idle_s must be positive, or unset")
        need(self.poll_interval_s > 0, "poll_interval_s must be > 0")
        need(self.gate_evidence >= 0, f"gate_evidence must be >= 0 (events kept per checkpoint for the scorer's "
                                      f"quality gate; 0 keeps none and the gate judges integrity and weights only), "
                                      f"got {self.gate_evidence}")
        need(bool(self.topic), "topic must be set (--topic)")
        if not self.dlq_topic:
            object.__setattr__(self, "dlq_topic", f"{self.topic}.dlq")
        if not self.group_id:
            object.__setattr__(self, "group_id", f"streamlearn-{self.pipeline.replace(':', '-')}")
        if not self.run_name:
            object.__setattr__(self, "run_name", self.pipeline.replace(":", "-").replace(".", "-"))

    def window_for(self, world: int) -> int:
        """The most events a window holds for a group of `world` ranks: `window_events` up to 2 ranks,
        then half of it a rank. Under --sync window a window ends in an average of every rank's
        weights, so splitting the same window 4 ways would average twice as often per event as 2 do
        (its collectives, and every rank waiting for the slowest). More events a rank between averages
        let the ranks' models drift further apart. The figures for both: DECISIONS §2."""
        return self.window_events * max(2, world) // 2
