"""Driver side of continuous training: build the TorchTrainer, run it, summarize the run."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from streamlearn import faults, metrics
from streamlearn.autoscale.policy import ScalingPolicy
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import ConfigError
from streamlearn.kafka.admin import ensure_topics, partitions_of
from streamlearn.kafka.broker import require_broker
from streamlearn.localray import join_ray
from streamlearn.logs import log
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint as ckpt

# Ray Train settings read by its controller, which Ray passes on from the driver's environment
# (ray.train.v2's ENV_VARS_TO_PROPAGATE); a value the user exported wins (ray_train_env).
RAY_TRAIN_ENV = {
    # Its preemption watcher is a 0-CPU actor per worker group that Ray places on a random node,
    # where it keeps that node busy for the group's life: after a resize down, the autoscaler
    # could not remove the node it landed on (the fresh-clone CI failure of test_autoscale).
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # The controller learns a group ended at its next poll of the workers, and a poll that takes
    # the last checkpoint's report from Ray's queue still counts as running, so a group ends about
    # two polls after its last checkpoint (0.33-0.53 s at 0.25 s, 1.7-1.9 s at 1 s). A poll is one
    # small actor call per worker: the controller's CPU rose 0.09 s per 20 s and learning did not
    # slow (figures in DECISIONS §1, "A group's end"). A hung poll is still judged by Ray's own
    # 10-minute timeout, not by this interval.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
}
CLEANER_CHECK_S = 10.0  # a dead controller's workers' CPUs are freed this late at most (Ray: 1 s)


def ray_train_env() -> dict[str, str]:
    """Ray Train's settings as streamlearn runs it, set in this driver's environment unless the
    user set them: what Train's controller will read."""
    for name, value in RAY_TRAIN_ENV.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in RAY_TRAIN_ENV}


def run_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.checkpoint_dir) / cfg.run_name


def build_trainer(cfg: TrainConfig, kafka: KafkaSettings, controller=None, *, gen: int = 0, warm: bool = False,
                  consumed_at_start: int = 0, started_at: float | None = None):
    """One group's Ray Train run. `gen` numbers the run's groups; a `warm` group's workers wait
    for the group they replace to stop before restoring (see streamlearn/autoscale/handover.py)."""
    import ray.train

    from streamlearn.train.failures import DeathRecord
    from streamlearn.train.inputs import WorkerInputs
    from streamlearn.train.loop import train_loop_per_worker
    from streamlearn.train.preload import WORKER_RUNTIME_ENV, EnvReport
    from streamlearn.train.process_group import TorchGroup

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})}
    return _trainer_class()(
        train_loop_per_worker,
        train_loop_config={"inputs": WorkerInputs(cfg, kafka, controller, gen, warm, consumed_at_start,
                                                  started_at or time.time(), faults.spec_from_env())},
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        # Not Ray's TorchConfig: its module imports torch into Train's controller (process_group.py).
        torch_config=TorchGroup(backend="nccl" if cfg.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            # Ray Train's own bookkeeping (run snapshots, metrics) apart from the lineage's
            # checkpoints, which are ours (checkpoint.publish) and restored by the loop itself.
            name=cfg.run_name,
            storage_path=str(Path(cfg.checkpoint_dir).resolve() / ".ray-train"),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            callbacks=[DeathRecord(run_dir(cfg).resolve(), gen),  # the controller has a cwd of its own
                       *([EnvReport(controller)] if cfg.warm_pool else [])],
            # Workers import torch and the loop as they start: in a process a resize's warm pool
            # started, that happens before the group asks for it (train/preload.py). Not with
            # Ray Data: what a worker starts inherits its runtime env, and every lane and Ray
            # Data actor rank 0 starts would import torch too (the ray-data tests took up to
            # 28 s longer in the fresh-clone CI of 2f56547). The pool still starts processes.
            worker_runtime_env=WORKER_RUNTIME_ENV if cfg.warm_pool and cfg.ingest == "direct" else None,
        ),
    )


def _trainer_class():
    """Ray Train's TorchTrainer without its Dataset callback and with a quieter placement-group
    cleaner. We hand Ray Train no Dataset (the Ray Data path builds and splits its own on rank 0),
    yet Ray Train 2.60 starts a DatasetManager actor for every group all the same. Its process
    (Ray and Ray Data imported to unpickle a DataContext) cost ~3 CPU s of the two cores every
    group start competes for: 2-worker first step 18.7 s against 19.7 s, stock and without it
    alternating. The cleaner (`Cleaner`): a 1-worker run of 60k events ended 1.2 s sooner and
    used ~1.1 CPU s less (DECISIONS §1, "A group's start")."""
    import ray
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks import DatasetsCallback  # internal; Ray is pinned to 2.60
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from streamlearn.train.failures import BoundedStarts

    class Cleaner(PlacementGroupCleanerCallback):
        """Ray Train's placement-group cleaner, asking less often and stopped without a wait.
        Its detached actor asks the dashboard's State API whether the controller lives, every
        1 s by stock; asked to stop, it joins a thread that sleeps out that interval first, so
        every group's end waited up to 1 s on it. Killed instead, it is gone at once: stopping
        it never removed the group (its only job is a controller that died without stopping)."""

        def __init__(self):
            super().__init__(check_interval_s=CLEANER_CHECK_S)

        def _stop_cleaner(self):
            cleaner, self._cleaner = self._cleaner, None
            if cleaner is not None:
                ray.kill(cleaner)

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self):
            return [Cleaner() if isinstance(cb, PlacementGroupCleanerCallback) else cb
                    for cb in super()._create_default_callbacks() if not isinstance(cb, DatasetsCallback)]

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            # Ray Train's policy with a bound on groups that die as they start (train/failures.py).
            policy = BoundedStarts(self.run_config.failure_config)
            return super()._initialize_and_run_controller(**{**controller_init_kwargs, "failure_policy": policy})

    return Trainer


def train(cfg: TrainConfig, kafka: KafkaSettings, scaling: ScalingPolicy | None = None,
          started_at: float | None = None) -> dict[str, Any]:
    """Run continuous training until the config's bound (or forever); return the run summary.

    With a scaling policy whose min and max differ, the worker count follows the load. Ray
    Train v2 fixes a group's size for its life (its elastic range always asks for the max), so
    each resize is a new group, one Ray Train run, restoring the old group's last checkpoint:
    started beside the old one and handed over at that checkpoint when the cluster has room
    (warm), or after the old one stopped (cold). Without a policy the group keeps cfg.workers,
    and the controller still samples lag for metrics. `started_at` (wall clock) is where the
    first group's startup breakdown counts from: the CLI passes its process's start.
    """
    started_at = started_at or time.time()
    import ray

    from streamlearn.autoscale.controller import start_controller

    pipeline = load_pipeline(cfg.pipeline)  # fail here, not inside a worker, if the pipeline is broken
    ray_train_env()
    require_broker(kafka)
    if not partitions_of(kafka, cfg.topic):
        raise ConfigError(f"topic {cfg.topic!r} does not exist at {kafka.bootstrap}; "
                          f"create it with `streamlearn topics create {cfg.topic}` or produce with `streamlearn load`")
    ensure_topics(kafka, {cfg.dlq_topic: 1})
    if pipeline.labels is not None:
        _check_joined_labels(cfg, kafka, pipeline.labels.suffix)
    policy = scaling or ScalingPolicy(min_workers=cfg.workers, max_workers=cfg.workers)
    workers = min(max(cfg.workers, policy.min_workers), policy.max_workers)
    log("ingest_chosen", mode=cfg.ingest, why=cfg.ingest_why)  # `--ingest auto`'s choice in the job's log
    before = _meta_or_none(ckpt.newest(run_dir(cfg)))
    if not ray.is_initialized():
        join_ray(local_if_none=True, log_to_driver=True)
    started = time.time()
    controller = start_controller(cfg, kafka, policy, workers)
    try:
        _run_groups(cfg, kafka, controller, workers, _consumed(before), started_at)
    except BaseException:  # Ctrl-C, SIGTERM (Ray's driver handler exits), a failure: stop now, a user waits
        ray.kill(controller)
        raise
    ray.get(controller.stop.remote())  # takes the run's last lag sample
    _retire(controller, metrics.report_interval_s())  # ...which reaches the metrics agent only if it lives this long
    after = _meta_or_none(ckpt.newest(run_dir(cfg)))
    return summarize_run(before, after, time.time() - started)


_retiring: list[threading.Thread] = []


def _retire(controller, after_s: float) -> None:
    """Kill a finished run's controller once Ray has sent its last recordings (one report
    interval: 10 s by default), without holding up the caller: a test or a notebook goes on at
    once. A process about to exit calls `wait_for_metrics`, since its actors die with it."""
    import ray

    def kill():
        time.sleep(after_s)
        try:
            ray.kill(controller)
        except Exception:  # Ray shut down meanwhile, or the next run of this name replaced it
            pass

    thread = threading.Thread(target=kill, name="retire-controller", daemon=True)
    thread.start()
    _retiring.append(thread)


def wait_for_metrics() -> None:
    """Return once every run this process finished has sent its last lag sample (`_retire`)."""
    while _retiring:
        _retiring.pop().join()


class _Group(threading.Thread):
    """One group's fit() in its own thread, so that the next group can start beside it."""

    def __init__(self, trainer, gen: int, workers: int):
        super().__init__(name=f"train-group-{gen}", daemon=True)
        self.trainer, self.gen, self.workers, self.error = trainer, gen, workers, None

    def run(self):
        try:
            self.trainer.fit()
        except BaseException as e:  # handed to the driver's loop, which decides what it means
            self.error = e


def _run_groups(cfg: TrainConfig, kafka: KafkaSettings, controller, workers: int, consumed_at_start: int,
                started_at: float, poll_s: float = 1.0) -> None:
    """Run groups until training ends: one learns at a time; during a warm resize the next one
    starts beside it and takes over at the checkpoint the old one stops at."""
    from streamlearn.autoscale.controller import call
    from streamlearn.train.failures import never_started

    def start(n: int, gen: int, warm: bool = False) -> _Group:
        group = _Group(build_trainer(replace(cfg, workers=n), kafka, controller, gen=gen, warm=warm,
                                     consumed_at_start=consumed_at_start, started_at=None if gen else started_at),
                       gen, n)
        group.start()
        return group

    running, warm, retiring, gen = start(workers, 0), None, [], 0
    while True:
        running.join(poll_s)
        retiring = _reap(retiring)
        if running.is_alive():
            if warm is None:
                n = call(controller.warm_plan, gen + 1)
                if n:
                    gen += 1
                    warm = start(n, gen, warm=True)
            elif call(controller.handover, warm.gen) == "go":
                # The old group stopped at its checkpoint and the new one learns from it; the
                # old run's teardown goes on in its thread while the next resize may begin.
                retiring.append(running)
                running, warm = warm, None
            elif not warm.is_alive():  # its run ended before it took over: the resize goes on without it
                call(controller.warm_failed, warm.gen, repr(warm.error))
                warm = None
            continue
        mode, n = call(controller.take_resize)  # also calls off a warm group still waiting
        # Handed over since the last poll (asked again: the new group may have taken its first
        # step already, which ends the resize, and the answer to take_resize with it).
        if warm is not None and (mode == "warm" or call(controller.handover, warm.gen) == "go"):
            retiring.append(running)
            running, warm = warm, None
            continue
        if warm is not None:
            warm.join()  # its workers go home without restoring
            warm = None
        if running.error is not None:
            if (why := never_started(running.error)) is not None:
                raise why from running.error
            raise running.error
        if mode != "cold" or _budget_spent(cfg, consumed_at_start):
            for group in retiring:
                group.join(60)
            return
        gen += 1
        running = start(n, gen)


def _reap(groups: list[_Group]) -> list[_Group]:
    """The old groups still shutting down; one that ended with an error did so after its last
    checkpoint (a new group had taken over from it), so nothing of it is lost: say so only."""
    for group in groups:
        if not group.is_alive() and group.error is not None:
            log("group_ended_with_error", level="warning", gen=group.gen, error=repr(group.error)[:300])
    return [group for group in groups if group.is_alive()]


def _check_joined_labels(cfg: TrainConfig, kafka: KafkaSettings, suffix: str) -> None:
    """A pipeline with joined labels reads `<topic><suffix>` beside the topic, partition by partition."""
    topic = cfg.topic + suffix
    events, labels = len(partitions_of(kafka, cfg.topic)), len(partitions_of(kafka, topic))
    if labels != events:
        raise ConfigError(f"pipeline {cfg.pipeline!r} joins labels from {topic!r}, which needs the {events} "
                          f"partitions of {cfg.topic!r} (a label goes to its event's partition); it has {labels}. "
                          f"Create it with `streamlearn load --label-delay ...` or "
                          f"`streamlearn topics create {topic} --partitions {events}`")


def _budget_spent(cfg: TrainConfig, consumed_at_start: int) -> bool:
    if cfg.max_events is None:
        return False
    return _consumed(_meta_or_none(ckpt.newest(run_dir(cfg)))) - consumed_at_start >= cfg.max_events


def _consumed(meta: dict | None) -> int:
    """Events the lineage has read (learned, dead-lettered, or with joined labels also expired
    or waiting): what --max-events counts."""
    if not meta:
        return 0
    starts = meta.get("start_offsets", {})
    return sum(int(end) - int(starts.get(p, 0)) for p, end in meta.get("offsets", {}).items())


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
