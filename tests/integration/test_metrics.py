"""Metrics end to end: training and scoring on the real Ray cluster, a real Prometheus scraping
Ray's export, and every catalogue metric checked through Prometheus's HTTP API.

Counters are compared as increases over this test (the session's cluster also runs other
tests' pipelines); series of processes that have ended are read with last_over_time, since
Prometheus marks them stale once the process stops exporting them.
"""

from __future__ import annotations

import importlib.util
import threading
import time

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from streamlearn import metrics
from streamlearn.config import TrainConfig
from streamlearn.kafka.admin import committed_offsets, end_offsets, ensure_topics
from streamlearn.kafka.broker import free_port
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.profiles import parse_profile
from streamlearn.monitor import Monitor, query, session_discovery_file
from streamlearn.observe.evaluator import Evaluator, EvaluatorConfig
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.runfiles import read_last_jsonl
from streamlearn.serve.answers import SCORES_SUFFIX
from streamlearn.serve.app import deploy, shutdown
from streamlearn.serve.config import ServeConfig
from streamlearn.train.trainer import run_dir, train

from .test_serve import EVENT, write_checkpoint

pytestmark = pytest.mark.integration

PIPELINE_SPEC = "tests.integration.models:MetricsFraud"  # the fraud pipeline under its own name
PIPELINE = "fraud-metrics"  # the pipeline tag on every series this test counts
JUDGED_REQUESTS = 3  # of 100 events each, scored for the served-quality figures
CONTROLLER = importlib.util.find_spec("streamlearn.autoscale.controller") is not None


def value(url: str, expr: str) -> float | None:
    result = query(url, expr)
    return float(result[0]["value"][1]) if result else None


def by_label(url: str, expr: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in query(url, expr)}


def total(url: str, name: str, **labels) -> float:
    """Sum over every process's series of a counter, including processes that have ended."""
    matcher = ",".join([f'pipeline="{PIPELINE}"', *(f'{k}="{v}"' for k, v in labels.items())])
    return value(url, f"sum(last_over_time({name}{{{matcher}}}[10m]))") or 0.0


def gauge(url: str, name: str, how: str = "max", over: str = "10m") -> float | None:
    series = metrics.exported_names(name)[0]
    return value(url, f'{how}(last_over_time({series}{{pipeline="{PIPELINE}"}}[{over}]))')


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.3)
    return predicate()


def statuses(url: str) -> dict[str, float]:
    return by_label(url, f'sum by (status) (last_over_time(ray_streamlearn_scoring_requests_total'
                         f'{{pipeline="{PIPELINE}"}}[10m]))', "status")


def settle(read, timeout: float = 30.0, stable_s: float = 3.0):
    """Wait until a reading stops changing (the last pushes and scrapes are in), return it."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= stable_s:
            break
    return last


class Requests(threading.Thread):
    """Sequential scoring requests, counting the answers by status."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.statuses, self.versions = url, threading.Event(), [], set()

    def run(self):
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.stop.is_set():
                r = client.post("/score", json=EVENT)
                self.statuses.append(r.status_code)
                if r.status_code == 200:
                    self.versions.add(r.json()["version"])
                time.sleep(0.1)


class LagSampler(threading.Thread):
    """Stands in for the scale controller while it is not there: samples the group's real lag
    from Kafka and records it through `metrics.record_scaling`, as the controller's contract says."""

    def __init__(self, settings, cfg: TrainConfig):
        super().__init__(daemon=True)
        self.settings, self.cfg, self.stop, self.seen = settings, cfg, threading.Event(), []

    def run(self):
        while not self.stop.is_set():
            ends = end_offsets(self.settings, self.cfg.topic)
            done = committed_offsets(self.settings, self.cfg.group_id, self.cfg.topic)
            lag = {str(p): end - done.get(p, 0) for p, end in ends.items()}
            self.seen.append(sum(lag.values()))
            metrics.record_scaling({"pipeline": PIPELINE, "lag_by_partition": lag, "workers_active": self.cfg.workers,
                                    "workers_desired": self.cfg.workers, "input_rate": 0.0, "learned_rate": 0.0})
            self.stop.wait(1.0)


def test_metrics_reach_prometheus_and_move(kafka, kafka_settings, ray_cluster, topic, tmp_path):
    discovery = session_discovery_file()
    assert wait_for(discovery.exists, 30), f"Ray wrote no {discovery}"
    monitor = Monitor(data_dir=tmp_path / "prometheus", port=0, discovery_file=discovery,
                      # 2 s, not 1: the scrape timeout is 0.8 of it, and a gauge of a process that has ended
                      # is evicted by Ray's agent 2 report intervals (2 s here) after its last report, so a
                      # run whose scrapes time out under the suite's load leaves no gauge at all (CI, twice)
                      scrape_interval_s=2)
    monitor.up()
    url = monitor.url
    cfg = TrainConfig(pipeline=PIPELINE_SPEC, topic=topic, workers=2, cpus_per_worker=0.5,
                      checkpoint_dir=str(tmp_path / "ckpt"),
                      run_name=f"metrics-{topic}", checkpoint_every_s=2.0, checkpoint_every_steps=15,
                      window_events=1000, until_idle_s=14.0, batch_size=128)  # above the trickle's gaps
    # and long: the last checkpoint's gauges live while rank 0 does (it idles this long after the
    # stream's last checkpoint) plus Ray's 2-interval TTL; with an 8-s idle a rehearsal's scrapes
    # (7 failed, over their 1.6-s timeout) never saw the last two versions.
    ensure_topics(kafka_settings, {topic + SCORES_SUFFIX: 1})
    serve_cfg = ServeConfig(checkpoint_dir=cfg.checkpoint_dir, run_name=cfg.run_name, pipeline=PIPELINE_SPEC,
                            port=free_port(), poll_interval_s=0.25, quality_tolerance=1.0,  # every real one swaps
                            min_replicas=1, max_replicas=1, scores_topic=topic + SCORES_SUFFIX,
                            scores_bootstrap=kafka_settings.bootstrap)
    names = {n: metrics.exported_names(n)[0] for n in metrics.CATALOGUE}
    try:
        assert _wait_for_targets(url), "Prometheus found no Ray metrics endpoint in the discovery file"
        latency = metrics.exported_names("streamlearn_scoring_latency_seconds")
        counted = ("streamlearn_events_ingested", "streamlearn_train_steps", "streamlearn_events_dead_lettered",
                   "streamlearn_checkpoints", "streamlearn_model_swaps")
        # Earlier tests in this session trained the same pipeline on this Ray cluster, and Ray keeps
        # exporting their ended processes' counters: take the baseline only once every series is
        # scraped and holds still, or the whole session's events count as this run's.
        before, before_status, before_latency = settle(
            lambda: ({n: total(url, names[n]) for n in counted}, statuses(url), total(url, latency[2])))
        deployed = time.monotonic()
        deploy(serve_cfg)
        requests = Requests(serve_cfg.url)
        requests.start()
        lag = None if CONTROLLER else LagSampler(kafka_settings, cfg)
        run_load(kafka.bootstrap, topic, partitions=4, count=4000, bad_fraction=0.05, seed=11)
        if lag:
            lag.start()

        trickled = []

        def second_burst():  # once the first checkpoint is out: the served version moves again after it
            wait_for(lambda: ckpt.newest(run_dir(cfg)) is not None, 90)
            # A trickle, not a burst: events keep arriving ahead of the commits, so the lag the
            # controller samples every 2 s is above zero for seconds. 15 s of it in one go (no gap
            # the run could take for idleness), then more, a second at a time, until Prometheus holds
            # a lag above zero (45 s at most): a 6-s trickle was scraped as zero lag on every
            # partition in two loaded CI runs (2026-11-29 and -30), where scrapes of Ray's metrics
            # time out while training holds both cores.
            run_load(kafka.bootstrap, topic, partitions=4, count=3000, bad_fraction=0.05, seed=12,
                     profile=parse_profile("constant:200"))
            trickled.append(3000)
            for chunk in range(45):
                if sum(lag_peaks(url, names).values()) > 0:
                    break
                run_load(kafka.bootstrap, topic, partitions=4, count=200, bad_fraction=0.05, seed=13 + chunk,
                         profile=parse_profile("constant:200"))
                trickled.append(200)

        producer = threading.Thread(target=second_burst, daemon=True)
        producer.start()
        summary = train(cfg, kafka_settings)
        producer.join()
        newest = ckpt.read_meta(ckpt.newest(run_dir(cfg)))
        with httpx.Client(base_url=serve_cfg.url, timeout=10) as client:  # the scorer catches up
            deadline = time.monotonic() + 15
            while client.get("/model").json()["version"] != newest["version"] and time.monotonic() < deadline:
                time.sleep(0.2)
            info = client.get("/model").json()
            assert client.post("/score", content=b"{not json").status_code == 400
        requests.stop.set()
        requests.join(10)
        judged = _judge_served_answers(kafka_settings, topic, serve_cfg.url, tmp_path / "served")
        if lag:
            time.sleep(2.5)  # a few samples after the last commit: lag back at zero
            lag.stop.set()
            lag.join(10)
        write_checkpoint(run_dir(cfg), newest["version"] + 100, corrupt=True)  # the integrity gate refuses it

        # every process's last pushes scraped: all counters and the served version hold still
        # The checkpoint gauges too: a fresh-clone CI run (2026-11-27) read no checkpoint_version at
        # all right after the counters of the same call had settled.
        final = settle(lambda: ({n: total(url, names[n]) for n in before}, statuses(url), total(url, latency[2]),
                                gauge(url, "streamlearn_model_version_served", "max", "5s"),
                                gauge(url, "streamlearn_checkpoint_version")))
        counters, after_status, latency_count, served, checkpoint_version = final

        # -- training: counters moved by exactly what the run learned --
        learned = counters["streamlearn_events_ingested"] - before["streamlearn_events_ingested"]
        assert learned == summary["events_learned"] == 4000 + sum(trickled) - summary["dead_lettered"]
        dead = counters["streamlearn_events_dead_lettered"]
        assert dead - before["streamlearn_events_dead_lettered"] == summary["dead_lettered"] > 0
        reasons = by_label(url, f'sum by (reason) (last_over_time({names["streamlearn_events_dead_lettered"]}'
                                f'{{pipeline="{PIPELINE}"}}[10m]))', "reason")
        assert len(reasons) >= 3 and all(":" not in r for r in reasons), reasons  # reason codes, not messages
        steps = counters["streamlearn_train_steps"] - before["streamlearn_train_steps"]
        assert steps == newest["counters"]["steps"] > 0
        written = counters["streamlearn_checkpoints"] - before["streamlearn_checkpoints"]
        assert written == summary["checkpoints"] >= 2
        assert checkpoint_version == newest["version"], scrape_health(url)
        for name in ("streamlearn_train_loss", "streamlearn_checkpoint_age_seconds",
                     "streamlearn_checkpoint_timestamp_seconds"):
            assert gauge(url, name) is not None, name
        online = by_label(url, f'last_over_time({names["streamlearn_online_metric"]}{{pipeline="{PIPELINE}"}}[10m])',
                          "metric")
        assert {"logloss"} <= set(online) and "n" not in online, online
        stamp = gauge(url, "streamlearn_checkpoint_timestamp_seconds")
        assert stamp == pytest.approx(newest["written_at"], abs=1e-3)

        # -- serving: requests by status, latency histogram, version served, swaps, rejections --
        ok, client_errors = requests.statuses.count(200), 1 + sum(400 <= s < 500 for s in requests.statuses)
        unavailable = sum(s >= 500 for s in requests.statuses)  # 503s before the first checkpoint
        assert ok > 20 and len(requests.versions) >= 2, requests.versions
        moved = {k: after_status.get(k, 0) - before_status.get(k, 0) for k in after_status}
        ok += JUDGED_REQUESTS  # the served-quality section's batches
        assert (moved.get("2xx", 0), moved.get("4xx", 0), moved.get("5xx", 0)) == (ok, client_errors, unavailable)
        count = latency_count - before_latency
        assert count == len(requests.statuses) + 1 + JUDGED_REQUESTS  # one histogram observation per request
        p99 = value(url, f'histogram_quantile(0.99, sum by (le) (rate({latency[0]}{{pipeline="{PIPELINE}"}}[5m])))')
        assert p99 is not None and 0 < p99 < 2.5
        assert served == newest["version"] == info["version"]
        since = f"{int(time.monotonic() - deployed) + 1}s"  # this replica's life, not earlier tests' replicas
        history = query(url, f'{names["streamlearn_model_version_served"]}{{pipeline="{PIPELINE}"}}[{since}]')
        # It moved: the replica first served an older version (the requests saw it) and the gauge now
        # shows the newest. (Not "two values in its history": the first may live less than a scrape.)
        shown = [float(v) for series in history for _, v in series["values"]]
        assert shown and shown[-1] == newest["version"] > min(requests.versions), (shown, requests.versions)
        swaps = counters["streamlearn_model_swaps"] - before["streamlearn_model_swaps"]
        assert swaps >= len(requests.versions) >= 2
        rejected = wait_for(lambda: by_label(url, f'sum by (kind) ({names["streamlearn_gate_rejections"]}'
                                                  f'{{pipeline="{PIPELINE}"}})', "kind").get("integrity"), 20)
        assert rejected and rejected >= 1
        scoring = info["scoring"]  # GET /model: this replica's recent figures
        assert scoring["requests"] >= 20 and scoring["p50_ms"] > 0 and scoring["p99_ms"] >= scoring["p50_ms"]

        # -- scaling: lag per partition rises while events wait and falls to zero once learned --
        lag_name = names["streamlearn_consumer_lag"]
        peak = lag_peaks(url, names)
        last = by_label(url, f'max by (partition) (last_over_time({lag_name}{{pipeline="{PIPELINE}"}}[10m]))',
                        "partition")
        assert set(peak) == {"0", "1", "2", "3"} and sum(peak.values()) > 0, (peak, scrape_health(url))
        assert all(v == 0 for v in last.values()), last
        for name in ("streamlearn_workers_active", "streamlearn_workers_desired", "streamlearn_input_rate",
                     "streamlearn_learned_rate"):
            assert gauge(url, name) is not None, name

        # -- served quality: the evaluator's figures on the answers the scorer published --
        assert judged["joined"] >= 200, judged
        joined = wait_for(lambda: total(url, names["streamlearn_served_joined"]), 30)
        assert joined >= judged["joined"], (joined, judged)
        assert gauge(url, "streamlearn_served_metric") is not None

        # every catalogue metric is in Prometheus, but the two a resize records (none with fixed workers)
        # the join's (a pipeline with inline labels has none), drift's (no drift in this load) and the
        # dropped answers' (a replica drops none while the broker answers)
        resize_only = {"streamlearn_resizes", "streamlearn_resize_pause_seconds", "streamlearn_join_pending",
                       "streamlearn_join_expired_events", "streamlearn_join_unlabelled_learned_events",
                       "streamlearn_drift_alarms",
                       "streamlearn_drift_last_alarm_timestamp_seconds", "streamlearn_answers_dropped"}
        absent = [n for n in metrics.CATALOGUE if n not in resize_only
                  and not query(url, f'last_over_time({names[n]}{{pipeline="{PIPELINE}"}}[10m])')]
        assert not absent, absent

        # -- Ray's GCS: the controller's calls per window and per poll keep no task events (the GCS
        # holds each call's, ~3 KB, up to 100,000: 5 MiB/min through the hour's soak); its other
        # calls keep theirs, so the dashboard still shows the controller at work --
        if CONTROLLER:
            assert wait_for(lambda: tasks_named(ray_cluster, "ScaleController.learn_env"), 30)
            assert tasks_named(ray_cluster, "ScaleController.progress") == []
            assert tasks_named(ray_cluster, "ScaleController.stop_due") == []
    finally:
        shutdown()
        monitor.down()


def _judge_served_answers(kafka_settings, topic: str, url: str, run_dir) -> dict:
    """Score 300 of the topic's events through the scorer (which publishes its answers), then run
    the evaluator in this process (connected to Ray, so its metrics are exported) until they are
    judged; returns its last row."""
    pipeline = load_pipeline(PIPELINE_SPEC)
    consumer = Consumer({**kafka_settings.confluent(), "group.id": f"judge-{topic}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    events: list[dict] = []
    while len(events) < 300:
        batch = consumer.consume(1000, timeout=5)
        assert batch, "the topic ran dry"
        events += pipeline.schema.decode_many([m.value() for m in batch if m.error() is None])[0]
    consumer.close()
    with httpx.Client(base_url=url, timeout=10) as client:
        for start in range(0, 100 * JUDGED_REQUESTS, 100):
            assert client.post("/score", json=events[start:start + 100]).status_code == 200
    evaluator = Evaluator(pipeline, kafka_settings, EvaluatorConfig(topic=topic, run_dir=run_dir, every_s=1.0,
                                                                    lookback_s=3600))
    evaluator.run(duration_s=8)
    return read_last_jsonl(run_dir / "served.jsonl")


def tasks_named(ray_cluster, name: str) -> list:
    from ray.util.state import list_tasks

    return list_tasks(address=f"http://{ray_cluster.dashboard_url}", filters=[("func_or_class_name", "=", name)],
                      limit=10_000, raise_on_missing_output=False)


def scrape_health(url: str) -> dict[str, float | None]:
    """What Prometheus's own series say of its scrapes of Ray over the test: a gauge goes missing
    where scrapes failed while the process that set it lived."""
    failed = 'sum(count_over_time(up{job="ray"}[10m]) - sum_over_time(up{job="ray"}[10m]))'
    return {"failed_scrapes": value(url, failed),
            "slowest_scrape_s": value(url, 'max(max_over_time(scrape_duration_seconds{job="ray"}[10m]))')}


def lag_peaks(url: str, names: dict[str, str]) -> dict[str, float]:
    """The highest consumer lag Prometheus scraped per partition over the test."""
    lag = names["streamlearn_consumer_lag"]
    return by_label(url, f'max by (partition) (max_over_time({lag}{{pipeline="{PIPELINE}"}}[10m]))', "partition")


def _wait_for_targets(url: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value(url, 'count(up{job="ray"} == 1)'):
            return True
        time.sleep(0.5)
    return False
