"""`streamlearn` command line: thin wrappers that build config, call one function, print."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import typer

from streamlearn.autoscale.policy import ScalingPolicy
from streamlearn.cluster import ClusterSpec
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import ConfigError, StreamlearnError
from streamlearn.kafka.broker import EmbeddedKafka, KafkaCluster
from streamlearn.monitor import Monitor
from streamlearn.observe.config import EvaluatorConfig
from streamlearn.serve.config import ServeConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Continuous training from Kafka on Ray.")
kafka_app = typer.Typer(no_args_is_help=True, help="The embedded Apache Kafka broker.")
topics_app = typer.Typer(no_args_is_help=True, help="Topic admin.")
app.add_typer(kafka_app, name="kafka")
app.add_typer(topics_app, name="topics")

BROKERS = typer.Option(1, help="Brokers: 3 runs a KRaft cluster replicating every topic 3 times "
                        "(min.insync.replicas 2), as a bank's Kafka does; broker i listens on port + 2i.")
BOOTSTRAP = typer.Option(None, "--bootstrap", help="Kafka bootstrap servers [env STREAMLEARN_KAFKA_BOOTSTRAP]")


def _kafka(bootstrap: str | None) -> KafkaSettings:
    return KafkaSettings(**({"bootstrap": bootstrap} if bootstrap else {}))


def _print_json(obj) -> None:
    print(json.dumps(obj, default=str), flush=True)


@kafka_app.command("up")
def kafka_up(port: int = typer.Option(EmbeddedKafka.port, help="Listener port; 0 picks a free one."),
             data_dir: Path | None = typer.Option(None, help="Where the broker keeps its data."),
             brokers: int = BROKERS):
    """Start the embedded broker, or a cluster of them (idempotent), and print its bootstrap address."""
    print(_embedded(port, data_dir, brokers).start().bootstrap)


@kafka_app.command("down")
def kafka_down(port: int = EmbeddedKafka.port, data_dir: Path | None = None, brokers: int = BROKERS):
    """Stop the embedded broker or cluster cleanly (its data stays)."""
    print("stopped" if _embedded(port, data_dir, brokers).stop() else "not running")


def _embedded(port: int, data_dir: Path | None, brokers: int) -> EmbeddedKafka | KafkaCluster:
    return EmbeddedKafka(port=port, data_dir=data_dir) if brokers == 1 else \
        KafkaCluster(size=brokers, port=port, data_dir=data_dir)


@kafka_app.command("status")
def kafka_status(bootstrap: str | None = BOOTSTRAP):
    """Print the bootstrap address; exit 1 when no broker answers there."""
    from streamlearn.kafka.broker import metadata_ok

    settings = _kafka(bootstrap)
    address = settings.bootstrap
    if not metadata_ok(address, timeout=3.0, conf=settings.confluent()):
        print(f"no broker answers at {address}", file=sys.stderr)
        raise typer.Exit(1)
    print(address)


@kafka_app.command("fetch-jars", hidden=True)
def kafka_fetch_jars():
    from streamlearn.kafka.broker import build_class_archive

    build_class_archive()  # fetches the jars first


@topics_app.command("create")
def topics_create(topic: str, partitions: int = typer.Option(4, min=1), bootstrap: str | None = BOOTSTRAP):
    """Create a topic and its dead-letter topic (idempotent)."""
    from streamlearn.kafka.admin import ensure_topics

    ensure_topics(_kafka(bootstrap), {topic: partitions, f"{topic}.dlq": 1})
    print(f"{topic} ({partitions} partitions), {topic}.dlq")


@app.command()
def load(bootstrap: str | None = BOOTSTRAP,
         topic: str = TrainConfig.topic,
         partitions: int = typer.Option(4, min=1),
         rate: float = typer.Option(0.0, help="Events/s; 0 = as fast as possible."),
         profile: str | None = typer.Option(None, help="constant:R | ramp:A:B:S | step:LO:HI:AT | "
                                                          "spike:BASE:PEAK:AT:WIDTH | sine:MEAN:AMP:PERIOD"),
         count: int | None = typer.Option(None, help="Stop after this many events."),
         duration: float | None = typer.Option(None, help="Stop after this many seconds."),
         bad_fraction: float = typer.Option(0.0, min=0.0, max=1.0, help="Fraction of malformed messages."),
         drift_at: int | None = typer.Option(None, help="Event number where the fraud pattern changes."),
         label_delay: str | None = typer.Option(None, help="Send events without is_fraud and each label later on "
                                                           "<topic>.labels after fixed:T | uniform:MIN:MAX | exp:MEAN "
                                                           "| lognormal:MEDIAN:SIGMA (T in s, or 15m, 2h, 5d). "
                                                           "Default: the label is in the event."),
         unlabelled_fraction: float = typer.Option(0.0, min=0.0, max=1.0,
                                                   help="With --label-delay: share of events never labelled."),
         fraud_labels_only: bool = typer.Option(False, help="With --label-delay: only frauds get a label, as a bank "
                                                             "hears only of chargebacks (pipeline fraud_chargebacks "
                                                             "learns every event at once as legitimate)."),
         simulated_clock: bool = typer.Option(False, help="With --label-delay: delays and Kafka timestamps on the "
                                                          "events' own compressed clock (a simulated day is 21,600 "
                                                          "events: --rate 360 runs a day a minute)."),
         seed: int = TrainConfig.seed,
         quiet: bool = typer.Option(False, help="No live progress line.")):
    """The load generator: simulated customers producing banking events; prints a JSON summary."""
    from streamlearn.kafka.admin import ensure_topics
    from streamlearn.loadgen.generator import run_load
    from streamlearn.loadgen.labels import LABELS_SUFFIX, SIMULATED_TOPIC_CONFIG, LabelPlan, parse_label_delay
    from streamlearn.loadgen.profiles import parse_profile

    if count is None and duration is None:  # before any topic is made: a refusal leaves nothing behind
        raise ConfigError("load needs --count N and/or --duration SECONDS, or it would never stop")
    settings = _kafka(bootstrap)
    chosen = parse_profile(profile) if profile else (parse_profile(f"constant:{rate}") if rate else None)
    if (unlabelled_fraction or fraud_labels_only or simulated_clock) and label_delay is None:
        raise ConfigError("--unlabelled-fraction, --fraud-labels-only and --simulated-clock need --label-delay: "
                          "inline labels are always there")
    labels = (LabelPlan(parse_label_delay(label_delay), unlabelled_fraction, fraud_labels_only, simulated_clock)
              if label_delay is not None else None)
    # Simulated times lie months in the past: a topic made here keeps them whatever their age (a
    # broker's time retention would delete every segment as soon as it rolled).
    ensure_topics(settings, {topic: partitions, f"{topic}.dlq": 1,
                             **({topic + LABELS_SUFFIX: partitions} if labels else {})},
                  configs=SIMULATED_TOPIC_CONFIG if simulated_clock else None)
    summary = run_load(settings.bootstrap, topic, partitions=partitions, profile=chosen, count=count,
                       duration=duration, bad_fraction=bad_fraction, seed=seed, drift_at=drift_at,
                       progress=not quiet, producer_config=settings.confluent(), labels=labels)
    _print_json(summary)


@app.command()
def train(pipeline: str = typer.Option(TrainConfig.pipeline,
                                       help="Pipeline name under pipelines/, or module:attribute."),
          bootstrap: str | None = BOOTSTRAP,
          topic: str = TrainConfig.topic,
          workers: int = typer.Option(TrainConfig.workers, min=1),
          ingest: str = typer.Option(TrainConfig.ingest, help="How events reach the workers: 'direct' (each rank "
                                                              "reads Kafka), 'ray-data' (a Ray Data pipeline "
                                                              "reads, decodes and splits them) or 'auto' (Ray "
                                                              "Data under GPU trainers, else direct; measured)."),
          read_lanes: int = typer.Option(TrainConfig.read_lanes, min=1,
                                         help="--ingest ray-data: Kafka readers in the Dataset (each decodes "
                                              "whole partitions); more where cores are spare."),
          use_gpu: bool = typer.Option(TrainConfig.use_gpu, help="NCCL on GPUs instead of gloo on CPUs."),
          sync: str = typer.Option(TrainConfig.sync, help="How workers stay one model: 'step' (DDP: every "
                                                          "step's gradients allreduced) or 'window' (each rank "
                                                          "steps alone; weights averaged once a window)."),
          cpus_per_worker: float = TrainConfig.cpus_per_worker,
          batch_size: int = TrainConfig.batch_size,
          checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir, help="Local directory for checkpoints."),
          checkpoint_every_s: float = TrainConfig.checkpoint_every_s,
          checkpoint_every_steps: int = TrainConfig.checkpoint_every_steps,
          keep_checkpoints: int = TrainConfig.keep_checkpoints,
          run_name: str = typer.Option(TrainConfig.run_name,
                                       help="Checkpoint lineage name (default: the pipeline name)."),
          max_events: int | None = typer.Option(None, help="Stop after learning/dead-lettering this many."),
          until_idle: float | None = typer.Option(None, help="Stop after the stream is idle this many seconds."),
          timeline: str = typer.Option("", help="Write a Chrome trace per rank to PATH.rankN.json."),
          seed: int = TrainConfig.seed,
          drift: bool = typer.Option(TrainConfig.drift,
                                     help="Rank 0's drift detectors (alarms in logs, metrics, history)."),
          warm_pool: bool = typer.Option(TrainConfig.warm_pool,
                                         help="Autoscale: start a resize's Ray processes ahead of it, "
                                                    "imports done, while the autoscaler adds room."),
          feedback_rows: bool = typer.Option(TrainConfig.feedback_rows,
                                             help="Delayed feedback: keep learned events' features in the run "
                                                  "directory (~256 B an event within the topic's retention) so "
                                                  "a late report's event is not re-read from Kafka."),
          min_workers: int | None = typer.Option(None, help="Autoscale: fewest workers (default: --workers)."),
          max_workers: int | None = typer.Option(None, help="Autoscale: most workers (default: --workers)."),
          up_cooldown: float = typer.Option(ScalingPolicy.up_cooldown_s,
                                            help="Autoscale: seconds the need must stay high to add."),
          down_cooldown: float = typer.Option(ScalingPolicy.down_cooldown_s,
                                              help="Autoscale: seconds the need must stay low to remove."),
          target_drain: float = typer.Option(ScalingPolicy.target_drain_s,
                                             help="Autoscale: a backlog should drain within this."),
          capacity_floor: float = typer.Option(ScalingPolicy.capacity_floor,
                                               help="Autoscale: events/s one worker learns, at least."),
          min_gain: float = typer.Option(ScalingPolicy.min_gain,
                                         help="Autoscale: a bigger group must learn this fraction more than a "
                                              "smaller one measured, or it is left (0.1: 10 %)."),
          warm_wait: float = typer.Option(ScalingPolicy.warm_wait_s,
                                          help="Autoscale: seconds a resize waits for room to start the new "
                                                     "group beside the old (pause of seconds) before it stops "
                                                     "the old one first; 0: always stop first.")):
    """Train continuously from the topic (bounded with --max-events / --until-idle); prints a JSON summary.
    With --min-workers < --max-workers the worker count follows the load (docs/OPERATIONS.md, Scaling)."""
    import psutil

    from streamlearn.train.trainer import train as run_training
    from streamlearn.train.trainer import wait_for_metrics

    cfg = TrainConfig(pipeline=pipeline, topic=topic, workers=workers, ingest=ingest, read_lanes=read_lanes,
                      use_gpu=use_gpu, sync=sync, cpus_per_worker=cpus_per_worker, batch_size=batch_size,
                      checkpoint_dir=checkpoint_dir,
                      checkpoint_every_s=checkpoint_every_s, checkpoint_every_steps=checkpoint_every_steps,
                      keep_checkpoints=keep_checkpoints, run_name=run_name, max_events=max_events,
                      until_idle_s=until_idle, seed=seed, drift=drift, warm_pool=warm_pool,
                      feedback_rows=feedback_rows, timeline=str(Path(timeline).resolve()) if timeline else "")
    scaling = ScalingPolicy(min_workers=min_workers or workers, max_workers=max_workers or workers,
                            up_cooldown_s=up_cooldown, down_cooldown_s=down_cooldown, target_drain_s=target_drain,
                            capacity_floor=capacity_floor, normal_lag_s=checkpoint_every_s, warm_wait_s=warm_wait,
                            min_gain=min_gain)
    # The startup breakdown (first checkpoint's startup_s) counts from this process's start.
    _print_json(run_training(cfg, _kafka(bootstrap), scaling, started_at=psutil.Process().create_time()))
    wait_for_metrics()  # the run's last lag sample leaves before this process and its actors do


@app.command()
def demo(duration: float | None = typer.Option(None, help="Stop after this many seconds (default: Ctrl-C)."),
         pipeline: str = TrainConfig.pipeline,
         home: str = typer.Option("", help="Where the broker's data and the checkpoints go "
                                           "(default: ~/.cache/streamlearn/demo, kept between demos)."),
         profile: str = typer.Option("", help="The generator's load profile (constant:RATE, "
                                              "sine:MEAN:AMP:PERIOD, ...; default sine:1500:1000:60)."),
         drift_at: int | None = typer.Option(None, help="Event number where the fraud pattern changes "
                                                         "(default 150,000); the demo says when training noticed.")):
    """Run the whole system locally: Kafka, Ray (dashboard), training job, scorer, load generator."""
    from streamlearn.demo import DemoConfig, run_demo

    # Ctrl-C is the demo's own: it stops what it started in order (streamlearn/demo.py), which takes
    # longer than STOP_WITHIN_S, and must not be cut short by it; SIGTERM stays Python's default.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    given = {"profile": profile or None, "drift_at": drift_at, "home": Path(home) if home else None}
    run_demo(DemoConfig(duration_s=duration, pipeline=pipeline,
                        **{k: v for k, v in given.items() if v is not None}))


serve_app = typer.Typer(no_args_is_help=True, help="The scoring service on Ray Serve.")
app.add_typer(serve_app, name="serve")


@serve_app.command("up")
def serve_up(pipeline: str = ServeConfig.pipeline,
             checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir, help="The trainer's checkpoint directory."),
             run_name: str = ServeConfig.run_name, host: str = ServeConfig.host, port: int = ServeConfig.port,
             min_replicas: int = ServeConfig.min_replicas, max_replicas: int = ServeConfig.max_replicas,
             swap_delay_s: float = typer.Option(ServeConfig.swap_delay_s, help="Seconds from a version's approval "
                                                "to the moment every replica switches to it (0: at once)."),
             address: str = typer.Option("auto", help="Ray cluster to deploy on ('auto': the running one)."),
             timeline: str = typer.Option("", help="Each replica traces its model swaps to PATH.scorer-<pid>.json "
                                                   "(merge with the training's: `streamlearn timeline merge`)."),
             scores_topic: str = typer.Option("", help="Publish every answer to this topic (usually "
                                                       "<topic>.scores) for `streamlearn evaluate`; created if "
                                                       "missing. Default: answers are not published."),
             bootstrap: str | None = BOOTSTRAP):
    """Deploy the scorer on a running Ray cluster; it follows the newest checkpoint."""
    from streamlearn.localray import join_ray

    scores_bootstrap = ""
    if scores_topic:
        from streamlearn.kafka.admin import ensure_topics

        kafka = _kafka(bootstrap)
        ensure_topics(kafka, {scores_topic: 1})
        scores_bootstrap = kafka.bootstrap
    join_ray(address, local_if_none=False, configure_logging=False)
    # The scorer (torch, Ray Serve: ~3 CPU-s of imports) only once a cluster answered: a dead
    # address is named in about a second, not after them.
    from streamlearn.serve import deploy

    print(deploy(ServeConfig(checkpoint_dir=checkpoint_dir, pipeline=pipeline, run_name=run_name, host=host,
                             port=port, min_replicas=min_replicas, max_replicas=max_replicas,
                             swap_delay_s=swap_delay_s, timeline=str(Path(timeline).resolve()) if timeline else "",
                             scores_topic=scores_topic, scores_bootstrap=scores_bootstrap)))


@serve_app.command("rollback")
def serve_rollback(to: int | None = typer.Option(None, "--to", help="Version to pin (default: the one before "
                                                                      "the newest)."),
                   pipeline: str = TrainConfig.pipeline, run_name: str = TrainConfig.run_name,
                   checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir)):
    """Pin an older checkpoint version: every replica serves it until `serve unpin`."""
    from streamlearn.rundir.checkpoint import list_checkpoints
    from streamlearn.serve import ServeConfig, pin_version

    cfg = ServeConfig(checkpoint_dir=checkpoint_dir, pipeline=pipeline, run_name=run_name)
    if to is None:
        versions = [v for v, _ in list_checkpoints(cfg.run_dir)]
        if len(versions) < 2:
            raise typer.BadParameter(f"no older version to roll back to in {cfg.run_dir}; pass --to VERSION")
        to = versions[-2]
    pin_version(checkpoint_dir, cfg.run_name, to)
    print(f"pinned version {to}; `streamlearn serve unpin` follows the newest again")


@serve_app.command("unpin")
def serve_unpin(pipeline: str = TrainConfig.pipeline, run_name: str = TrainConfig.run_name,
                checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir)):
    """Follow the newest checkpoint again."""
    from streamlearn.serve import ServeConfig, unpin

    cfg = ServeConfig(checkpoint_dir=checkpoint_dir, pipeline=pipeline, run_name=run_name)
    print("unpinned" if unpin(checkpoint_dir, cfg.run_name) else "nothing was pinned")


def _run_dir(run_dir: Path | None, checkpoint_dir: str, pipeline: str, run_name: str) -> Path:
    if run_dir is not None:
        return run_dir
    return Path(checkpoint_dir) / TrainConfig(pipeline=pipeline, run_name=run_name).run_name


@app.command()
def report(run_dir: Path | None = typer.Argument(None, help="Run directory (default: CHECKPOINT_DIR/RUN_NAME)."),
           checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir, help="The trainer's checkpoint directory."),
           pipeline: str = TrainConfig.pipeline, run_name: str = TrainConfig.run_name,
           out: Path | None = typer.Option(None, help="Where the PNGs go (default: RUN_DIR/report).")):
    """PNG charts of a run over time (rate, lag, workers, online metric, loss, versions); during or after it."""
    from streamlearn.observe.report import render_report

    directory = _run_dir(run_dir, checkpoint_dir, pipeline, run_name)
    for path in render_report(directory, out or directory / "report"):
        print(path)


@app.command()
def evaluate(pipeline: str = TrainConfig.pipeline, bootstrap: str | None = BOOTSTRAP,
             topic: str = EvaluatorConfig.topic,
             checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir, help="Where served.jsonl goes: "
                                                                                 "CHECKPOINT_DIR/RUN_NAME."),
             run_name: str = "",
             window: int = typer.Option(EvaluatorConfig.window, help="Labelled answers per sliding window."),
             every: float = typer.Option(EvaluatorConfig.every_s,
                                         help="Seconds between rows of served.jsonl (and metric updates)."),
             lookback: float | None = typer.Option(None, help="Seconds of both topics re-read at start "
                                                               "(default: the label TTL, at most an hour)."),
             duration: float | None = typer.Option(None, help="Stop after this many seconds (default: never)."),
             sample: float = typer.Option(EvaluatorConfig.sample,
                                          help="Share of event ids judged (delayed feedback: each answer waits its "
                                               "attribution window, weeks; answers/s x window x share must fit the "
                                               "join's cap).")):
    """Quality of what was served: the answers on <topic>.scores joined with their labels, per version.
    Run it as a Ray job (`ray job submit -- streamlearn evaluate ...`) for its Prometheus metrics."""
    import os

    from streamlearn.observe.evaluator import Evaluator
    from streamlearn.pipeline import load_pipeline

    if os.environ.get("RAY_ADDRESS"):  # under `ray job submit`: the metrics go through Ray's agent
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"], configure_logging=False, log_to_driver=False)
    name = TrainConfig(pipeline=pipeline, run_name=run_name).run_name
    cfg = EvaluatorConfig(topic=topic, run_dir=Path(checkpoint_dir).expanduser() / name, window=window,
                          every_s=every, lookback_s=lookback, sample=sample)
    Evaluator(load_pipeline(pipeline), _kafka(bootstrap), cfg).run(duration)


@app.command()
def status(address: str = typer.Option("auto", help="Ray cluster: 'auto', HOST:6379 or ray://HOST:10001."),
           pipeline: str = TrainConfig.pipeline,
           run_name: str = typer.Option(TrainConfig.run_name, help="Run name (default: the pipeline name)."),
           serve_url: str = typer.Option(f"http://{ServeConfig.host}:{ServeConfig.port}",
                                         help="The scorer (GET /model)."),
           checkpoint_dir: str = typer.Option(TrainConfig.checkpoint_dir, help="Where the evaluator's served.jsonl "
                                                                                "is (CHECKPOINT_DIR/RUN_NAME)."),
           once: bool = typer.Option(False, help="Print one frame and exit."),
           interval: float = typer.Option(2.0, min=0.2, help="Seconds between refreshes.")):
    """One refreshing screen: input rate, lag, workers, model version and age, online metric, scoring p99."""
    from streamlearn.observe.status import Sources, run_status

    name = TrainConfig(pipeline=pipeline, run_name=run_name).run_name
    run_status(Sources(address=address, run_name=name, serve_url=serve_url,
                       run_dir=Path(checkpoint_dir).expanduser() / name), once=once, interval_s=interval)


@app.command()
def drain(address: str = typer.Option("auto", help="Ray cluster: 'auto', HOST:6379 or ray://HOST:10001."),
          pipeline: str = TrainConfig.pipeline,
          run_name: str = typer.Option(TrainConfig.run_name, help="Run name (default: the pipeline name).")):
    """Ask a running `streamlearn train` to learn what its topic holds now, then end, with its last
    checkpoint and commit, as --until-idle would (e.g. once its producers have finished)."""
    from streamlearn.autoscale.naming import NAMESPACE, request_drain
    from streamlearn.localray import join_ray

    name = TrainConfig(pipeline=pipeline, run_name=run_name).run_name
    join_ray(address, local_if_none=False, namespace=NAMESPACE, configure_logging=False, log_to_driver=False)
    ends = request_drain(name)
    print(f"run {name!r} drains: it ends once it has learned its topic up to {sum(ends.values())} offsets "
          f"({json.dumps(ends)} by partition)")


timeline_app = typer.Typer(no_args_is_help=True, help="The per-rank Chrome traces written by `train --timeline`.")
app.add_typer(timeline_app, name="timeline")


@timeline_app.command("merge")
def timeline_merge(paths: list[Path] = typer.Argument(..., help="Trace files, e.g. /tmp/tl.rank*.json."),
                   out: Path = typer.Option(Path("timeline.json"), "--out", "-o", help="The merged trace.")):
    """One trace with every rank, for chrome://tracing or ui.perfetto.dev (they open one file at a time)."""
    from streamlearn.observe.timeline import merge

    print(f"{out}: {merge(list(paths), out)} events from {len(paths)} files")


monitor_app = typer.Typer(no_args_is_help=True, help="A real Prometheus scraping the running Ray cluster.")
app.add_typer(monitor_app, name="monitor")
MONITOR_DIR = typer.Option(None, "--data-dir", help="Prometheus data, config and log (default: cache/prometheus).")


def _monitor(data_dir: Path | None, port: int, **kw):
    return Monitor(port=port, **kw) if data_dir is None else Monitor(data_dir=data_dir, port=port, **kw)


@monitor_app.command("up")
def monitor_up(port: int = typer.Option(Monitor.port, help="Listen port; 0 picks a free one."),
               data_dir: Path | None = MONITOR_DIR,
               host: str = typer.Option(Monitor.host, help="Listen address (0.0.0.0 for a remote Grafana)."),
               address: str = typer.Option("auto", help="Ray cluster whose nodes to scrape (run on its head)."),
               discovery_file: Path | None = typer.Option(None, help="Ray's prom_metrics_service_discovery.json "
                                                                      "(default: the cluster's, via --address).")):
    """Start Prometheus against the running Ray cluster's metrics; prints its URL once ready."""
    from streamlearn.monitor import cluster_discovery_file

    monitor = _monitor(data_dir, port, host=host, discovery_file=discovery_file)
    if discovery_file is None and monitor.pid() is None:
        monitor.discovery_file = cluster_discovery_file(address)
    print(monitor.up().url)


@monitor_app.command("down")
def monitor_down(data_dir: Path | None = MONITOR_DIR):
    """Stop the Prometheus `monitor up` started (by its pid file)."""
    print("stopped" if _monitor(data_dir, 0).down() else "not running")


@monitor_app.command("status")
def monitor_status(data_dir: Path | None = MONITOR_DIR):
    """Whether it runs, its URL and whether it is ready."""
    _print_json(_monitor(data_dir, 0).status())


cluster_app = typer.Typer(no_args_is_help=True, help="A local autoscaling Ray cluster (Ray's fake multi-node "
                                                         "provider: the real autoscaler, nodes on this machine).")
app.add_typer(cluster_app, name="cluster")


@cluster_app.command("up")
def cluster_up(port: int = typer.Option(ClusterSpec.port, help="GCS port; 0 picks a free one."),
               max_nodes: int = typer.Option(ClusterSpec.max_nodes, min=1, help="Autoscaled worker nodes at most."),
               node_cpus: int = typer.Option(ClusterSpec.node_cpus, min=1,
                                             help="CPUs per node (one training worker at 1 CPU)."),
               idle_timeout: float = typer.Option(ClusterSpec.idle_timeout_s,
                                                  help="Seconds before an idle node is removed.")):
    """Start the head; the autoscaler adds nodes on demand. Prints the environment a driver needs."""
    from streamlearn.cluster import client_env, up

    cluster = up(ClusterSpec(port=port, max_nodes=max_nodes, node_cpus=node_cpus, idle_timeout_s=idle_timeout))
    for key, value in client_env(cluster.port).items():
        print(f"export {key}={value}")
    print(f"# dashboard: {cluster.dashboard_url}   stop: streamlearn cluster down --port {cluster.port}")


@cluster_app.command("down")
def cluster_down(port: int = typer.Option(..., help="The port `cluster up` printed (in RAY_ADDRESS).")):
    """Stop the head and every node it launched (by their processes, not by name)."""
    from streamlearn.cluster import down

    print(f"stopped {down(port)} processes")


@cluster_app.command("status")
def cluster_status(port: int = typer.Option(..., help="The port `cluster up` printed.")):
    """Where the cluster is; exit 2 when it is not running."""
    from streamlearn.cluster import status

    _print_json(status(port))


STOP_WITHIN_S = 3.0  # Ctrl-C or SIGTERM to the forced exit (issue 47: stopped within 5 s at any moment; the
# clock's thread itself may wait ~1 s for the GIL while Ray's start-up holds it, measured). Forcing is
# safe: checkpoints are published whole, and offsets committed after them are committed again on restore.


def main() -> None:
    from streamlearn.procs import exit_within, stop_on_signals

    stop_on_signals(STOP_WITHIN_S)
    try:
        app()
    except StreamlearnError as e:
        print(f"streamlearn: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what was started is stopped on the way out; one line
        exit_within(STOP_WITHIN_S, 130)
        print("streamlearn: interrupted", file=sys.stderr)
        sys.exit(130)



if __name__ == "__main__":
    main()
