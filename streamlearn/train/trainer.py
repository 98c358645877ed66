"""Driver side of continuous training: build the TorchTrainer, run it, summarize the run."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from streamlearn.autoscale.policy import ScalingPolicy
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import ConfigError
from streamlearn.kafka.admin import ensure_topics, partitions_of
from streamlearn.kafka.broker import require_broker
from streamlearn.pipeline import load_pipeline
from streamlearn.train import checkpoint as ckpt


def run_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.checkpoint_dir) / cfg.run_name


def build_trainer(cfg: TrainConfig, kafka: KafkaSettings, controller=None):
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from streamlearn.train.loop import train_loop_per_worker

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})}
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg, "kafka": kafka, "controller": controller},
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo", timeout_s=1800),
        run_config=ray.train.RunConfig(
            # One name per lineage: Ray Train restores the newest checkpoint of a run with the
            # same storage path and name, which is exactly "every restart resumes".
            name=cfg.run_name,
            storage_path=str(Path(cfg.checkpoint_dir).resolve()),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
        ),
    )


def train(cfg: TrainConfig, kafka: KafkaSettings, scaling: ScalingPolicy | None = None) -> dict[str, Any]:
    """Run continuous training until the config's bound (or forever); return the run summary.

    With a scaling policy whose min and max differ, the worker count follows the load: each
    resize ends the running group at a checkpoint and starts one of the new size from it (Ray
    Train v2 fixes a group's size for its life, and its elastic range always asks for the max).
    Without one, the group keeps cfg.workers, and the controller still samples lag for metrics.
    """
    import ray

    from streamlearn.autoscale.controller import start_controller

    load_pipeline(cfg.pipeline)  # fail here, not inside a worker, if the pipeline is broken
    require_broker(kafka)
    if not partitions_of(kafka, cfg.topic):
        raise ConfigError(f"topic {cfg.topic!r} does not exist at {kafka.bootstrap}; "
                          f"create it with `streamlearn topics create {cfg.topic}` or produce with `streamlearn load`")
    ensure_topics(kafka, {cfg.dlq_topic: 1})
    policy = scaling or ScalingPolicy(min_workers=cfg.workers, max_workers=cfg.workers)
    workers = min(max(cfg.workers, policy.min_workers), policy.max_workers)
    before = _meta_or_none(ckpt.newest(run_dir(cfg)))
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
    started = time.time()
    controller = start_controller(cfg, kafka, policy, workers)
    try:
        while workers:
            group_cfg = _group_config(cfg, workers, before)
            if group_cfg is None:
                break  # the event budget was spent by earlier groups
            build_trainer(group_cfg, kafka, controller).fit()
            workers = ray.get(controller.take_resize.remote())
    finally:
        ray.get(controller.stop.remote())
        ray.kill(controller)
    after = _meta_or_none(ckpt.newest(run_dir(cfg)))
    return summarize_run(before, after, time.time() - started)


def _group_config(cfg: TrainConfig, workers: int, before: dict | None) -> TrainConfig | None:
    """The next group's config: its size, and what is left of this run's event budget."""
    if cfg.max_events is None:
        return replace(cfg, workers=workers)
    done = _consumed(_meta_or_none(ckpt.newest(run_dir(cfg)))) - _consumed(before)
    left = cfg.max_events - done
    return replace(cfg, workers=workers, max_events=left) if left > 0 else None


def _consumed(meta: dict | None) -> int:
    counters = (meta or {}).get("counters", {})
    return counters.get("learned", 0) + counters.get("dead_lettered", 0)


def _meta_or_none(path: Path | None) -> dict[str, Any] | None:
    return ckpt.read_meta(path) if path else None


def summarize_run(before: dict | None, after: dict | None, seconds: float) -> dict[str, Any]:
    """Events this run learned and dead-lettered: the newest checkpoint minus where it started."""
    if after is None:
        return {"events_learned": 0, "dead_lettered": 0, "checkpoints": 0, "offsets": {}, "seconds": round(seconds, 2)}
    c0 = (before or {}).get("counters", {})
    c1 = after["counters"]
    learned = c1["learned"] - c0.get("learned", 0)
    return {
        "events_learned": learned,
        "dead_lettered": c1["dead_lettered"] - c0.get("dead_lettered", 0),
        "checkpoints": after["version"] - (before or {}).get("version", 0),
        "version": after["version"],
        "offsets": after["offsets"],
        "online": after["metrics"].get("online", {}),
        "lineage_learned": c1["learned"],
        "seconds": round(seconds, 2),
        "events_per_s": round(learned / seconds, 1) if seconds else None,
    }
