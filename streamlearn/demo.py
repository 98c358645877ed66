"""`make demo`: the whole system on one machine, live.

Starts (and on exit stops, by what it started) an embedded Kafka broker, a Prometheus for
Ray's metrics and a Ray head whose dashboard reads it, submits continuous training as a Ray
job, deploys the scorer on Ray Serve, runs the load generator, and shows one live status line
until Ctrl-C or --duration.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import psutil

from streamlearn.config import REPO_ROOT, KafkaSettings, cache_dir
from streamlearn.errors import StreamlearnError
from streamlearn.kafka.admin import consumer_lag, end_offsets, ensure_topics
from streamlearn.kafka.broker import EmbeddedKafka, free_port, port_in_use
from streamlearn.localray import ClientAuth, client_auth, forget_recorded, ray_cli, start_local_ray
from streamlearn.monitor import PROMETHEUS_HOST_VAR, Monitor, follow_session, up_before_head
from streamlearn.procs import adopt_orphans, ctrl_c_left_to_us
from streamlearn.rundir import checkpoint as ckpt


@dataclass(frozen=True)
class DemoConfig:
    duration_s: float | None = None
    pipeline: str = "fraud"
    topic: str = "transactions"
    partitions: int = 4
    workers: int = 2
    profile: str = "sine:1500:1000:60"
    drift_at: int = 150_000
    dashboard_port: int = 8265
    serve_port: int = 8000
    home: Path = cache_dir() / "demo"


def run_demo(cfg: DemoConfig) -> None:
    import ray
    from ray.job_submission import JobSubmissionClient

    from streamlearn.loadgen.callers import call_scorer
    from streamlearn.loadgen.generator import run_load
    from streamlearn.loadgen.profiles import parse_profile
    from streamlearn.observe.evaluator import Evaluator, EvaluatorConfig
    from streamlearn.pipeline import load_pipeline
    from streamlearn.serve import ServeConfig, deploy
    from streamlearn.serve import shutdown as serve_shutdown
    from streamlearn.serve.answers import SCORES_SUFFIX
    from streamlearn.serve.config import TOKEN_ENV

    checkpoints = cfg.home / "checkpoints"
    cfg.home.mkdir(parents=True, exist_ok=True)
    adopt_orphans()
    with ExitStack() as cleanup:
        started: list[psutil.Process] = []  # what the demo started, taken as it stops (below)
        cleanup.callback(_wait_gone, started)  # the last step of the stop
        say("starting Kafka (embedded, KRaft) ...")
        broker = EmbeddedKafka(port=9092 if not port_in_use(9092) else 0, data_dir=cfg.home / "kafka").start()
        cleanup.callback(broker.stop)
        kafka = KafkaSettings(bootstrap=broker.bootstrap)
        scores_topic = cfg.topic + SCORES_SUFFIX
        ensure_topics(kafka, {cfg.topic: cfg.partitions, f"{cfg.topic}.dlq": 1, scores_topic: 1})

        dashboard_port = cfg.dashboard_port if not port_in_use(cfg.dashboard_port) else free_port()
        ctx, prometheus = start_ray(dashboard_port, cfg.home / "prometheus")
        if prometheus is not None:
            cleanup.callback(prometheus.down)
        cleanup.callback(forget_recorded, ctx.address_info["gcs_address"])  # after the shutdown, as `ray stop`
        cleanup.callback(ray.shutdown)
        dashboard = f"http://{ctx.dashboard_url}"

        say("submitting continuous training as a Ray job ...")
        jobs = JobSubmissionClient(dashboard)
        entrypoint = (f"{sys.executable} -m streamlearn.cli train --pipeline {cfg.pipeline} "
                      f"--bootstrap {broker.bootstrap} --topic {cfg.topic} --workers {cfg.workers} "
                      f"--checkpoint-dir {checkpoints}")  # the default cadence: what a user gets
        job_id = _submit(jobs, entrypoint)
        cleanup.callback(lambda: jobs.stop_job(job_id))

        say("deploying the scorer on Ray Serve ...")
        serve_port = cfg.serve_port if not port_in_use(cfg.serve_port) else free_port()
        serve_cfg = ServeConfig(checkpoint_dir=str(checkpoints), pipeline=cfg.pipeline, port=serve_port,
                                scores_topic=scores_topic, scores_bootstrap=broker.bootstrap)
        # The evaluator in a thread of this driver (its metrics go through Ray like a job's): it
        # stops with the demo, and leaves no process of its own behind a Ctrl-C.
        pipeline = load_pipeline(cfg.pipeline)
        stop_evaluator = threading.Event()
        evaluator = Evaluator(pipeline, kafka, EvaluatorConfig(topic=cfg.topic, run_dir=serve_cfg.run_dir))
        judging = threading.Thread(target=evaluator.run, kwargs={"stop": stop_evaluator}, daemon=True,
                                   name="evaluator")
        judging.start()
        cleanup.callback(lambda: (stop_evaluator.set(), judging.join(timeout=10)))  # closes while Kafka is up
        url = deploy(serve_cfg)
        cleanup.callback(serve_shutdown)

        generator = threading.Thread(target=run_load, daemon=True, kwargs=dict(
            bootstrap=broker.bootstrap, topic=cfg.topic, partitions=cfg.partitions,
            profile=parse_profile(cfg.profile), duration=cfg.duration_s or 10 ** 9, bad_fraction=0.01,
            drift_at=cfg.drift_at, seed=int(time.time())))
        generator.start()  # a daemon bounded by --duration: it ends with the demo
        stop_caller = threading.Event()
        caller = threading.Thread(target=call_scorer, daemon=True, name="caller", args=(
            broker.bootstrap, cfg.topic, url, pipeline.schema, stop_caller),
            kwargs={"token": os.environ.get(TOKEN_ENV)})
        caller.start()  # a share of the live events scored, as the bank's payment system would
        cleanup.callback(stop_caller.set)

        # The first step of the stop: every process the demo started (Ray's, the job's, Serve's).
        cleanup.callback(lambda: started.extend(psutil.Process().children(recursive=True)))
        print(banner(dashboard, url, broker.bootstrap, job_id, serve_cfg.run_dir, client_auth(),
                     os.environ.get(PROMETHEUS_HOST_VAR)), flush=True)
        watch(cfg, kafka, url, serve_cfg.run_dir, until=time.monotonic() + (cfg.duration_s or float("inf")))
        say("stopping everything the demo started ...")


def _wait_gone(procs: list[psutil.Process], grace_s: float = 30.0) -> None:
    """After the orderly stop: wait for what the demo started to exit, and SIGKILL what has not
    within `grace_s`. Stopping the job and ray.shutdown() return before every worker process
    has exited; a demo that returned then left some running (a fresh-clone CI failure of
    test_demo: six processes of the demo's session alive after Ctrl-C). Its descendants are
    taken again here: what started while it stopped, or lost its parent, is the demo's too."""
    known = {p.pid for p in procs}
    procs = procs + [p for p in psutil.Process().children(recursive=True) if p.pid not in known]
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass  # gone meanwhile
    psutil.wait_procs(alive, timeout=5)


def _submit(jobs, entrypoint: str, patience_s: float = 60.0) -> str:
    """Submit once the head's job agent is up: it starts a little after the dashboard answers."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return jobs.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": str(REPO_ROOT)})
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def start_ray(dashboard_port: int, prometheus_dir: Path, object_store_mb: int = 300,
              scrape_interval_s: float | None = None):
    """The demo's Ray, also the integration tests' session cluster, so what the banner tells the
    user is tested on the demo's kind of head (token auth on: Ray 2.60's default for a new local
    head while RAY_AUTH_MODE is unset). Prometheus starts first: the dashboard reads its URL once,
    at start. Logical CPUs exceed the 2 real cores on purpose: every actor and worker asks for a
    fraction, and the sum must fit the logical count. The caller stops Ray and the Prometheus
    (None if none started); `scrape_interval_s` None: the config's 5 s."""
    prometheus = _start_prometheus(prometheus_dir, scrape_interval_s)
    if prometheus is not None:
        os.environ[PROMETHEUS_HOST_VAR] = prometheus.url  # inherited by the dashboard
    say("starting Ray (head + dashboard) ...")
    try:
        with ctrl_c_left_to_us():
            ctx = start_local_ray(num_cpus=4, object_store_memory=object_store_mb * 1024 * 1024,
                                  include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=dashboard_port,
                                  log_to_driver=False, configure_logging=False)
        if prometheus is not None:
            follow_session(prometheus)
    except BaseException:
        if prometheus is not None:
            prometheus.down()
        raise
    return ctx, prometheus


def _start_prometheus(data_dir: Path, scrape_interval_s: float | None = None) -> Monitor | None:
    """Ray's metrics for the dashboard. Without a Prometheus the demo runs on, with no metrics."""
    if os.environ.get(PROMETHEUS_HOST_VAR):
        say(f"using the Prometheus at ${PROMETHEUS_HOST_VAR} ({os.environ[PROMETHEUS_HOST_VAR]}): it must "
            "scrape this Ray itself (deploy/prometheus/prometheus.yml)")
        return None
    say("starting Prometheus (for the dashboard) ...")
    try:
        return up_before_head(data_dir, scrape_interval_s)
    except StreamlearnError as e:
        say(f"WARNING: going on without Prometheus, so the dashboard has no metrics: {e}")
        return None


def banner(dashboard: str, url: str, bootstrap: str, job_id: str, run_dir: Path, auth: ClientAuth,
           prometheus: str | None) -> str:
    sample = json.dumps({"event_id": "demo-1", "event_time": int(time.time() * 1000), "customer_id": "c42",
                         "amount": 912.5, "currency": "EUR", "merchant_category": "electronics",
                         "merchant_country": "NG", "channel": "ecom", "card_present": False, "customer_age": 23,
                         "account_tenure_days": 40, "is_fraud": False})
    return f"""
  Ray dashboard   {dashboard}   (job {job_id}: continuous training)
{_ray_access(dashboard, auth)}
  Prometheus      {_prometheus(prometheus)}
  Kafka           {bootstrap}   topic transactions, dead letters in transactions.dlq,
                  answers in transactions.scores (judged by the demo's evaluator: served.jsonl)
  Scoring API     {url}/score   GET {url}/model   GET {url}/healthz   docs {url}/docs
  Checkpoints     {run_dir}

  Try:  curl -s -X POST {url}/score -H 'content-type: application/json' -d '{sample}'

  Ctrl-C stops everything the demo started.
"""


def _prometheus(url: str | None) -> str:
    if url is None:
        return "none, so the dashboard has no metrics (see the warning above)"
    return f"{url}   Ray's metrics; the dashboard's charts also need a Grafana (README)"


def _ray_access(dashboard: str, auth: ClientAuth) -> str:
    """What a new shell and a browser need to get into this Ray: Ray's CLI sends the token only
    where RAY_AUTH_MODE=token is exported, and the dashboard asks for the token itself."""
    ray = ray_cli()
    jobs = f"{ray} job list --address {dashboard}   (job submit, job logs <id> alike)"
    if not auth.enabled:
        return f"  Ray job CLI     {jobs}"
    return (f"  Ray token auth  {auth.export}   # token in {auth.token_where}\n"
            f"                  {jobs}\n"
            f"                  the dashboard asks for the token: paste what `{ray} get-auth-token` prints")


def watch(cfg: DemoConfig, kafka: KafkaSettings, url: str, run_dir: Path, until: float) -> None:
    """One refreshing status line: events/s in, lag, workers, model version served, online metric."""
    last_total, last_t = None, time.monotonic()
    history, drifted_at = DriftNews(run_dir / "history.jsonl"), None
    try:
        while time.monotonic() < until:
            time.sleep(2.0)
            total = sum(end_offsets(kafka, cfg.topic).values())
            now = time.monotonic()
            if drifted_at is None and total >= cfg.drift_at:  # ~1 % of messages are the bad events: near enough
                drifted_at = now
            for line in history.alarms(None if drifted_at is None else now - drifted_at):
                sys.stdout.write(f"\r{line}\n")
            rate = 0.0 if last_total is None else (total - last_total) / (now - last_t)
            last_total, last_t = total, now
            lag = sum(consumer_lag(kafka, f"streamlearn-{cfg.pipeline}", cfg.topic).values())
            newest = ckpt.newest(run_dir)
            meta = ckpt.read_meta(newest) if newest else {}
            online = meta.get("metrics", {}).get("online", {})
            served = _served_version(url)
            metric = " ".join(f"{k}={v:.3f}" for k, v in online.items() if k in ("auc", "logloss", "mae")
                              and isinstance(v, float))
            sys.stdout.write(f"\r  in {rate:7.0f} ev/s | lag {lag:7d} | workers {meta.get('workers', '-')} | "
                             f"learned {meta.get('counters', {}).get('learned', 0):8d} | "
                             f"checkpoint v{meta.get('version', '-')} | serving v{served} | {metric} | "
                             f"served {_served_quality(run_dir)}   ")
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    print()


class DriftNews:
    """The trainer's drift alarms, read from the run's history as checkpoints record them."""

    def __init__(self, path: Path):
        self.path, self.read = path, 0

    def alarms(self, since_drift_s: float | None) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.read)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits for the next look
        self.read += len(complete)
        rows = [json.loads(line) for line in complete.splitlines() if line.strip()]
        when = "" if since_drift_s is None else f", ~{since_drift_s:.0f} s after the generator's drift"
        return [f"  drift alarm, checkpoint v{row['version']}: "
                f"{', '.join(a['signal'] for a in row['drift'])}{when}" for row in rows if row.get("drift")]


def _served_quality(run_dir: Path) -> str:
    """The evaluator's newest figure on the answers callers got (served.jsonl)."""
    from streamlearn.runfiles import read_last_jsonl

    overall = (read_last_jsonl(run_dir / "served.jsonl") or {}).get("overall") or {}
    value = overall.get("auc", overall.get("mae"))
    return f"{'auc' if 'auc' in overall else 'mae'}={value:.3f}" if isinstance(value, float) else "-"


def _served_version(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/model", timeout=2) as r:
            return str(json.loads(r.read()).get("version") or "-")
    except Exception:
        return "-"


def say(message: str) -> None:
    print(f"streamlearn demo: {message}", flush=True)
