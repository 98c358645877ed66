"""The one catalogue of streamlearn's metrics, and the small functions that record them.

Metrics are `ray.util.metrics` objects: each process pushes them to its node's metrics
agent, which serves them to Prometheus (and so to the Ray dashboard's metrics view and
Grafana). They are created lazily, once per process, and only in a process connected to
Ray: under plain uvicorn or in unit tests every function here is a no-op, so callers never
check. Recording never raises into the caller: a metric is not worth a training step or a
scoring request.

Counters are summed by Prometheus across the processes that record them (every training
rank counts its own events); gauges that describe the whole run (loss, online metric,
versions) are set by one process only (rank 0, the scale controller, each replica for the
version it serves). A daemon thread per process re-sends gauges (Ray forgets a gauge that is not
re-set) and records queued scoring requests, off the request path.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from streamlearn.logs import log


@dataclass(frozen=True)
class Spec:
    kind: str  # counter | gauge | histogram
    description: str
    tags: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


_P = ("pipeline",)
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PAUSE_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

CATALOGUE: dict[str, Spec] = {
    # training (every rank counts its own slice; rank 0 sets the gauges)
    "streamlearn_events_ingested": Spec("counter", "Valid events learned (predict-then-learn)", _P),
    "streamlearn_events_dead_lettered": Spec("counter", "Events sent to the dead-letter topic, by reason",
                                             ("pipeline", "reason")),
    "streamlearn_train_steps": Spec("counter", "Optimizer steps (lockstep: counted once, by rank 0)", _P),
    "streamlearn_train_loss": Spec("gauge", "Mean training loss since the previous checkpoint", _P),
    "streamlearn_online_metric": Spec("gauge", "Prequential online metric over the sliding window "
                                               "(auc, logloss, mae, rmse)", ("pipeline", "metric")),
    "streamlearn_checkpoints": Spec("counter", "Checkpoints written", _P),
    "streamlearn_checkpoint_version": Spec("gauge", "Version of the newest checkpoint written", _P),
    "streamlearn_checkpoint_timestamp_seconds": Spec("gauge", "Unix time the newest checkpoint was written", _P),
    "streamlearn_checkpoint_age_seconds": Spec("gauge", "Seconds since the newest checkpoint was written", _P),
    # delayed labels (pipelines with joined labels only; rank 0, at each checkpoint)
    "streamlearn_join_pending": Spec("gauge", "Events and labels waiting in the join state at the newest "
                                              "checkpoint", ("pipeline", "side")),
    "streamlearn_join_expired_events": Spec("gauge", "Events of the lineage that left the join without a "
                                                     "label within the TTL", _P),
    "streamlearn_join_unlabelled_learned_events": Spec("gauge", "Events of the lineage learned with the pipeline's "
                                                                "unlabelled_as target: no label within the TTL", _P),
    # drift (rank 0's detectors, streamlearn/train/drift.py)
    "streamlearn_drift_alarms": Spec("counter", "Drift alarms, by kind (error, input, positive) and signal",
                                     ("pipeline", "kind", "signal")),
    "streamlearn_drift_last_alarm_timestamp_seconds": Spec("gauge", "Unix time of the newest drift alarm, by kind",
                                                           ("pipeline", "kind")),
    # the scale controller
    "streamlearn_consumer_lag": Spec("gauge", "Events behind the consumer group's committed offset",
                                     ("pipeline", "partition")),
    "streamlearn_input_rate": Spec("gauge", "Events/s arriving on the topic", _P),
    "streamlearn_learned_rate": Spec("gauge", "Events/s learned, as the controller samples it", _P),
    "streamlearn_workers_active": Spec("gauge", "Training workers in the running group", _P),
    "streamlearn_workers_desired": Spec("gauge", "Training workers the scaling policy asks for", _P),
    "streamlearn_resizes": Spec("counter", "Completed resizes of the training group", _P),
    "streamlearn_resize_pause_seconds": Spec("histogram", "Seconds without an optimizer step across a resize",
                                             _P, PAUSE_BUCKETS_S),
    # serving (each replica)
    "streamlearn_model_version_served": Spec("gauge", "Model version a scoring replica serves", _P),
    "streamlearn_model_swaps": Spec("counter", "Models swapped in by scoring replicas", _P),
    "streamlearn_gate_rejections": Spec("counter", "Checkpoints refused by a replica's gates, by gate",
                                        ("pipeline", "kind")),
    "streamlearn_serving_versions_behind": Spec("gauge", "Versions between the one a replica serves and the newest "
                                                         "checkpoint", _P),
    "streamlearn_serving_behind_seconds": Spec("gauge", "How much older the served version is than the newest "
                                                        "checkpoint, by their write times", _P),
    "streamlearn_serving_behind_bound": Spec("gauge", "The scorer's configured staleness bound (max_behind_versions, "
                                                      "max_behind_s), by unit", ("pipeline", "unit")),
    "streamlearn_served_auc_floor": Spec("gauge", "The served-quality floor the scorer is configured with "
                                                  "(served_auc_floor)", _P),
    "streamlearn_scoring_requests": Spec("counter", "POST /score requests, by status class (2xx, 4xx, 5xx)",
                                         ("pipeline", "status")),
    "streamlearn_scoring_latency_seconds": Spec("histogram", "POST /score handler latency", _P,
                                                LATENCY_BUCKETS_S),
    "streamlearn_answers_dropped": Spec("counter", "Answers a replica could not publish to <topic>.scores, by "
                                                   "reason (queue_full, delivery_failed)", ("pipeline", "reason")),
    # served quality (the evaluator, streamlearn/observe/evaluator.py): answers joined with their labels
    "streamlearn_served_metric": Spec("gauge", "Metric of the answers callers got, joined with their labels, over "
                                               "the evaluator's window of all versions (auc, logloss)",
                                      ("pipeline", "metric")),
    "streamlearn_served_version_metric": Spec("gauge", "The same per model version that answered (the newest "
                                                       "few versions)", ("pipeline", "version", "metric")),
    "streamlearn_served_joined": Spec("counter", "Answers joined with their label", _P),
    "streamlearn_served_expired": Spec("gauge", "Answers and labels that left the evaluator's join without their "
                                                "other half, by side", ("pipeline", "side")),
}


def exported_names(name: str) -> tuple[str, ...]:
    """The series names Ray 2.60's Prometheus export gives a catalogue metric: Ray prefixes
    every application metric with `ray_`, and Prometheus conventions add `_total` to
    counters and `_bucket/_sum/_count` to histograms. Dashboards and tests query these."""
    kind = CATALOGUE[name].kind
    base = f"ray_{name}"
    if kind == "counter":
        return (f"{base}_total",)
    if kind == "histogram":
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    return (base,)


# ---- lazily created metric objects, per process ------------------------------------------

_objects: dict[str, Any] = {}
_failed: set[str] = set()
_gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # last value set, re-sent by the keeper
_requests: deque[tuple[str, int, float]] = deque(maxlen=200_000)  # scoring requests not yet recorded
_keeper: threading.Thread | None = None
_keeper_start = threading.Lock()


def _ray_connected() -> bool:
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency; keep metrics optional anyway
        return False
    return ray.is_initialized()


def _metric(name: str):
    found = _objects.get(name)
    if found is not None or not _ray_connected():
        return found
    from ray.util.metrics import Counter, Gauge, Histogram

    spec = CATALOGUE[name]
    if spec.kind == "counter":
        made = Counter(name, spec.description, tag_keys=spec.tags)
    elif spec.kind == "gauge":
        made = Gauge(name, spec.description, tag_keys=spec.tags)
    else:
        made = Histogram(name, spec.description, boundaries=list(spec.boundaries), tag_keys=spec.tags)
    _objects[name] = made
    return made


def _guard(fn):
    """A bug in recording logs once per function and is otherwise ignored."""
    def wrapper(*args, **kwargs):
        try:
            fn(*args, **kwargs)
        except Exception as e:
            if fn.__name__ not in _failed:
                _failed.add(fn.__name__)
                log("metrics_record_failed", level="warning", function=fn.__name__,
                    error=f"{type(e).__name__}: {e}")
    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _inc(name: str, value: float, tags: dict[str, str]) -> None:
    if value > 0:
        m = _metric(name)
        if m is not None:
            m.inc(float(value), tags=tags)


def _set(name: str, value: float | None, tags: dict[str, str]) -> None:
    if value is None:
        return
    value = float(value)
    if value != value:  # NaN (e.g. AUC of a one-class window) would show as a gap anyway: skip it
        return
    m = _metric(name)
    if m is not None:
        m.set(value, tags=tags)
        _gauges[(name, tuple(tags.items()))] = value
        _start_keeper()


def _start_keeper() -> None:
    global _keeper
    if _keeper is not None:
        return
    with _keeper_start:
        if _keeper is None:
            _keeper = threading.Thread(target=_keep, name="streamlearn-metrics", daemon=True)
            _keeper.start()


def report_interval_s() -> float:
    """How often Ray sends a process's recordings to its node's agent (10 s unless
    RAY_metrics_report_interval_ms says otherwise when the cluster starts). A process killed
    sooner than this after its last recording loses that recording."""
    try:
        import ray

        interval_ms = ray._config.metrics_report_interval_ms()
    except Exception:
        interval_ms = 10_000
    return min(max(interval_ms, 1000), 10_000) / 1000


def _keep_period_s() -> float:
    """Half Ray's report interval: Ray drops a gauge not re-set within two intervals (Ray 2.60
    evicts stale gauge observations), so a value set once must be sent again while it holds."""
    return report_interval_s() / 2


def _keep() -> None:
    period = _keep_period_s()
    while True:
        time.sleep(period)
        try:
            flush()
        except Exception as e:
            if "keeper" not in _failed:
                _failed.add("keeper")
                log("metrics_record_failed", level="warning", function="keeper", error=f"{type(e).__name__}: {e}")


def flush() -> None:
    """Record queued scoring requests and re-send every gauge's last value (the keeper thread
    calls this every half report interval; tests may call it to skip the wait)."""
    if not _ray_connected():
        return
    for pipeline in list(_written_at):
        _refresh_age(pipeline)
    for (name, tags), value in list(_gauges.items()):
        _metric(name).set(value, tags=dict(tags))
    counts: dict[tuple[str, str], int] = {}
    latency = _metric("streamlearn_scoring_latency_seconds")
    while _requests:
        pipeline, status, seconds = _requests.popleft()
        key = (pipeline, f"{status // 100}xx")
        counts[key] = counts.get(key, 0) + 1
        latency.observe(seconds, tags={"pipeline": pipeline})
    for (pipeline, status), n in counts.items():
        _inc("streamlearn_scoring_requests", n, {"pipeline": pipeline, "status": status})


def _observe(name: str, value: float, tags: dict[str, str]) -> None:
    m = _metric(name)
    if m is not None:
        m.observe(float(value), tags=tags)


# ---- training ------------------------------------------------------------------------------

_written_at: dict[str, float] = {}  # pipeline -> newest checkpoint's time, as this process knows it


@_guard
def record_window(pipeline: str, ingested: int, dead_by_reason: dict[str, int], steps: int) -> None:
    """One rank's learned window. Pass steps=0 on every rank but 0 (steps are lockstep)."""
    tags = {"pipeline": pipeline}
    _inc("streamlearn_events_ingested", ingested, tags)
    _inc("streamlearn_train_steps", steps, tags)
    for reason, count in dead_by_reason.items():
        _inc("streamlearn_events_dead_lettered", count, {"pipeline": pipeline, "reason": reason})
    _refresh_age(pipeline)


def dead_by_reason(bad: list[tuple[Any, str]]) -> dict[str, int]:
    """Batch.bad -> {reason code: count}; the code (`out_of_range`) keeps label values few."""
    counts: dict[str, int] = {}
    for _message, reason in bad:
        code = reason.split(":", 1)[0]
        counts[code] = counts.get(code, 0) + 1
    return counts


@_guard
def record_checkpoint(pipeline: str, version: int, loss: float | None, online: dict[str, Any] | None,
                      written_at: float) -> None:
    """Rank 0, after a checkpoint is durable."""
    tags = {"pipeline": pipeline}
    _inc("streamlearn_checkpoints", 1, tags)
    _set("streamlearn_checkpoint_version", version, tags)
    _set("streamlearn_checkpoint_timestamp_seconds", written_at, tags)
    _set("streamlearn_train_loss", loss, tags)
    for key, value in (online or {}).items():
        if key != "n" and isinstance(value, int | float):
            _set("streamlearn_online_metric", value, {"pipeline": pipeline, "metric": key})
    _written_at[pipeline] = written_at
    _refresh_age(pipeline)


@_guard
def record_join(pipeline: str, pending: dict[str, int], expired: int, unlabelled: int | None = None) -> None:
    """Rank 0, after a checkpoint of a pipeline with joined labels is durable (`unlabelled`: with
    the pipeline's `unlabelled_as` only)."""
    for side, n in pending.items():
        _set("streamlearn_join_pending", n, {"pipeline": pipeline, "side": side})
    _set("streamlearn_join_expired_events", expired, {"pipeline": pipeline})
    if unlabelled is not None:
        _set("streamlearn_join_unlabelled_learned_events", unlabelled, {"pipeline": pipeline})


@_guard
def record_drift(pipeline: str, signal: str, at: float) -> None:
    """Rank 0, as a drift detector fires: `signal` is error.*, input.<feature> or positive.<feature>."""
    kind = signal.split(".", 1)[0]
    _inc("streamlearn_drift_alarms", 1, {"pipeline": pipeline, "kind": kind, "signal": signal})
    _set("streamlearn_drift_last_alarm_timestamp_seconds", at, {"pipeline": pipeline, "kind": kind})


def _refresh_age(pipeline: str) -> None:
    written = _written_at.get(pipeline)
    if written is not None:
        _set("streamlearn_checkpoint_age_seconds", max(0.0, time.time() - written), {"pipeline": pipeline})


# ---- the scale controller (contract in notes: called once per sample and per resize) -------------

@_guard
def record_scaling(snapshot: dict[str, Any]) -> None:
    pipeline = str(snapshot.get("pipeline") or "unknown")
    tags = {"pipeline": pipeline}
    for partition, lag in (snapshot.get("lag_by_partition") or {}).items():
        _set("streamlearn_consumer_lag", lag, {"pipeline": pipeline, "partition": str(partition)})
    _set("streamlearn_input_rate", snapshot.get("input_rate"), tags)
    _set("streamlearn_learned_rate", snapshot.get("learned_rate"), tags)
    _set("streamlearn_workers_active", snapshot.get("workers_active"), tags)
    _set("streamlearn_workers_desired", snapshot.get("workers_desired"), tags)
    written = (snapshot.get("checkpoint") or {}).get("written_at")
    if isinstance(written, int | float):
        _written_at[pipeline] = max(float(written), _written_at.get(pipeline, 0.0))
    _refresh_age(pipeline)


@_guard
def record_resize(pipeline: str, pause_s: float) -> None:
    tags = {"pipeline": pipeline}
    _inc("streamlearn_resizes", 1, tags)
    _observe("streamlearn_resize_pause_seconds", max(0.0, pause_s), tags)


# ---- serving -------------------------------------------------------------------------------

def record_request(pipeline: str, status: int, seconds: float) -> None:
    """On the scoring path: a deque append (no lock; ~35 us of Ray metric calls measured per
    request otherwise). The keeper thread records the queue within half a report interval."""
    if _keeper is None:
        if not _ray_connected():
            return
        _start_keeper()
    _requests.append((pipeline, status, seconds))


@_guard
def record_swap(pipeline: str, version: int) -> None:
    _inc("streamlearn_model_swaps", 1, {"pipeline": pipeline})
    _set("streamlearn_model_version_served", version, {"pipeline": pipeline})


@_guard
def record_rejection(pipeline: str, kind: str) -> None:
    _inc("streamlearn_gate_rejections", 1, {"pipeline": pipeline, "kind": kind})


@_guard
def record_behind(pipeline: str, versions: int, seconds: float, bound_versions: int, bound_s: float,
                  auc_floor: float) -> None:
    """Each replica, every poll: how stale what it serves is, beside the bounds that alert on it."""
    tags = {"pipeline": pipeline}
    _set("streamlearn_serving_versions_behind", versions, tags)
    _set("streamlearn_serving_behind_seconds", seconds, tags)
    _set("streamlearn_serving_behind_bound", bound_versions, {"pipeline": pipeline, "unit": "versions"})
    _set("streamlearn_serving_behind_bound", bound_s, {"pipeline": pipeline, "unit": "seconds"})
    _set("streamlearn_served_auc_floor", auc_floor, tags)


@_guard
def record_answers_dropped(pipeline: str, reason: str) -> None:
    _inc("streamlearn_answers_dropped", 1, {"pipeline": pipeline, "reason": reason})


# ---- served quality (the evaluator) ---------------------------------------------------------

@_guard
def record_served(pipeline: str, overall: dict[str, Any], versions: dict[int, dict[str, Any]], joined: int,
                  expired: dict[str, int]) -> None:
    """The evaluator, once per row: `overall` and each of `versions` are `summarize` dicts. A version
    no longer among `versions` stops being re-sent, so Ray drops its series (no growth per version)."""
    shown = {str(v) for v in versions}
    for key in [k for k in _gauges if k[0] == "streamlearn_served_version_metric"
                and dict(k[1]).get("pipeline") == pipeline and dict(k[1])["version"] not in shown]:
        del _gauges[key]
    for metric in ("auc", "logloss", "mae", "rmse"):
        _set("streamlearn_served_metric", overall.get(metric), {"pipeline": pipeline, "metric": metric})
        for version, summary in versions.items():
            _set("streamlearn_served_version_metric", summary.get(metric),
                 {"pipeline": pipeline, "version": str(version), "metric": metric})
    if joined:
        _inc("streamlearn_served_joined", joined, {"pipeline": pipeline})
    for side, n in expired.items():
        _set("streamlearn_served_expired", n, {"pipeline": pipeline, "side": side})
