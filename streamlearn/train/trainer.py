"""Driver side of continuous training: build the TorchTrainer, run it, summarize the run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import ConfigError
from streamlearn.kafka.admin import ensure_topics, partitions_of
from streamlearn.kafka.broker import require_broker
from streamlearn.pipeline import load_pipeline
from streamlearn.train import checkpoint as ckpt


def run_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.checkpoint_dir) / cfg.run_name


def build_trainer(cfg: TrainConfig, kafka: KafkaSettings):
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from streamlearn.train.loop import train_loop_per_worker

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})}
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg, "kafka": kafka},
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


def train(cfg: TrainConfig, kafka: KafkaSettings) -> dict[str, Any]:
    """Run continuous training until the config's bound (or forever); return the run summary."""
    import ray

    load_pipeline(cfg.pipeline)  # fail here, not inside a worker, if the pipeline is broken
    require_broker(kafka.bootstrap)
    if not partitions_of(kafka, cfg.topic):
        raise ConfigError(f"topic {cfg.topic!r} does not exist at {kafka.bootstrap}; "
                          f"create it with `streamlearn topics create {cfg.topic}` or produce with `streamlearn load`")
    ensure_topics(kafka, {cfg.dlq_topic: 1})
    before = _meta_or_none(ckpt.newest(run_dir(cfg)))
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=True)
    started = time.time()
    build_trainer(cfg, kafka).fit()
    after = _meta_or_none(ckpt.newest(run_dir(cfg)))
    return summarize_run(before, after, time.time() - started)


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
