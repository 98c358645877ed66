"""Recovery: what a SIGKILLed Train worker, or Kafka broker, costs until learning resumes.

    python -m load.bench.faults [--kills 3] [--broker-kills 3] [--rate 2000]

Kafka and training with 2 workers (default settings) under a steady generator load on this
machine. Each time the current worker group has checkpointed and learned `--in-service` seconds
more (a failure in service, when the group's standby processes are up), one of its workers is SIGKILLed;
Ray Train notices, ends the group and starts a new one, which restores the last checkpoint. The
figure (issue 15's "≤ 30 s until learning resumes") is the time from the kill to the new group's
first optimizer step, read from the startup marks the group records with its first checkpoint;
the time to that first checkpoint is shown too. After the last kill the load stops, training
drains the topic, and the run is audited for exactly-once against a re-read of Kafka.

Then the same on a 3-broker cluster (`streamlearn kafka up --brokers 3`: 3 replicas,
min.insync.replicas 2): `--broker-kills` times, the broker leading most of the topic's partitions is
SIGKILLed; timed are the kill to new leaders on all of them, and the new leaders to the first
checkpoint that learned events written there after the kill; the broker is then restarted and
the next kill waits until every replica is back in sync. Audited for exactly-once the same way.
Meanwhile the default scorer, answering into a topic of the cluster (`--scores-topic`), is called
back to back by 2 clients: counted are the requests that failed once the first model was served,
and the longest span over which requests kept failing (issue 47: none longer than the election).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from load.bench.common import (
    audit_exactly_once,
    bench_broker,
    machine_line,
    score_continuously,
    start_bench_ray,
    write_json,
    write_section,
)
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import StreamlearnError
from streamlearn.kafka.admin import end_offsets, ensure_topics, replica_states
from streamlearn.kafka.broker import KafkaCluster, free_port
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.profiles import parse_profile
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.serve.answers import SCORES_SUFFIX
from streamlearn.serve.app import deploy
from streamlearn.serve.app import shutdown as serve_shutdown
from streamlearn.serve.config import ServeConfig
from streamlearn.train.trainer import run_dir, train

TOPIC, PARTITIONS = "faults", 4
TARGET_S = 30.0  # issue 15
BAR_S = 10.0  # issue 47
SCORING_CLIENTS = 2
# Startup marks in the order a replacement group reaches them (streamlearn/train/loop.py, Startup).
STARTED = time.time()  # the runs' start: the startup marks in history rows are seconds since it
MARKS = ("worker_process", "loop_entered", "model_ready", "restored", "first_batch_read", "first_step_done")


class Producing(threading.Thread):
    """Steady load in one-second chunks until stopped; returns how many events went out."""

    def __init__(self, bootstrap: str, rate: float):
        super().__init__(daemon=True)
        self.bootstrap, self.rate, self.stop, self.events = bootstrap, rate, threading.Event(), 0

    def run(self):
        seed = 1
        while not self.stop.is_set():
            try:
                self.events += run_load(self.bootstrap, TOPIC, partitions=PARTITIONS, bad_fraction=0.02, seed=seed,
                                        profile=parse_profile(f"constant:{self.rate}"), duration=1.0)["events"]
            except StreamlearnError as e:  # the broker is ours and stays up; say so if it did not
                print(f"a chunk of load failed: {e}")
            seed += 1


def history(cfg: TrainConfig) -> list[dict]:
    path = run_dir(cfg) / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(what: str, found, timeout: float, training: threading.Thread):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := found()) is not None:
            return value
        if not training.is_alive():
            raise SystemExit(f"faults: training ended while waiting for {what}")
        time.sleep(0.2)
    raise SystemExit(f"faults: no {what} within {timeout:.0f} s")


def train_workers(dashboard: str) -> list[int]:
    from ray.util.state import list_actors

    alive = list_actors(address=dashboard, filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return [a.pid for a in alive if a.pid]


def kill_and_time(cfg: TrainConfig, dashboard: str, training: threading.Thread) -> dict:
    """Kill one worker of the running group once it has learned for a while; time its replacement."""
    pids = wait_for("2 live Train workers", lambda: (p := train_workers(dashboard)) and len(p) == cfg.workers and p,
                    120, training)
    killed_at = time.time()
    os.kill(pids[0], signal.SIGKILL)

    def resumed():  # the first history row of a group that started after the kill (its loop: the
        # process may be older, a standby started before the kill, autoscale/warmpool.py)
        return next((row for row in history(cfg) if "startup_s" in row
                     and STARTED + row["startup_s"]["loop_entered"] > killed_at), None)

    row = wait_for("replacement group's first checkpoint", resumed, 600, training)
    marks = {k: round(STARTED + row["startup_s"][k] - killed_at, 2) for k in MARKS if k in row["startup_s"]}
    return {"victim_pid": pids[0], "resumed_s": marks["first_step_done"],
            "first_checkpoint_s": round(row["t"] - killed_at, 2), "marks_since_kill_s": marks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--broker-kills", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--in-service", type=float, default=40.0,
                        help="seconds each group learns before its kill, past its checkpoints (a failure in "
                             "service, not in a group's first seconds)")
    args = parser.parse_args()
    import ray

    loadavg_before = round(os.getloadavg()[0], 2)
    ctx = start_bench_ray(include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=free_port())
    dashboard = f"http://{ctx.dashboard_url}"
    with bench_broker({TOPIC: PARTITIONS}) as (home, broker, settings):
        kills, audited = under_load(args, home, settings, broker.bootstrap,
                                    lambda cfg, training: kill_and_time(cfg, dashboard, training), args.kills)
    failovers = broker_failovers(args) if args.broker_kills else None
    ray.shutdown()
    report(args, kills, audited, loadavg_before, failovers)


def under_load(args, home: Path, settings: KafkaSettings, bootstrap: str, fault, times: int) -> tuple[list, dict]:
    """Training with 2 workers under the steady load; `fault(cfg, training)` `times` times, each
    once the current group has learned a while; then the topic drained and audited."""
    cfg = TrainConfig(topic=TOPIC, workers=2, checkpoint_dir=str(home / "ckpt"), until_idle_s=10.0,
                      max_failures=times + 1)
    load = Producing(bootstrap, args.rate)
    errors = []
    training = threading.Thread(target=lambda: _catching(errors, train, cfg, settings, None, STARTED))
    load.start()
    training.start()
    results = []
    for i in range(times):
        # The group learns and checkpoints before each fault, as a group in service would: two
        # checkpoints of the first group, one more of each replacement after its first.
        wanted = len(history(cfg)) + (2 if i == 0 else 1)
        wait_for("a checkpoint of the current group", lambda n=wanted: len(history(cfg)) >= n or None, 600, training)
        time.sleep(args.in_service)  # a group in service has learned a while: its standby is up
        results.append(fault(cfg, training))
        print(f"fault {i + 1}: {results[-1]}", flush=True)
    load.stop.set()
    load.join()
    training.join()
    if errors:
        raise SystemExit(f"faults: training failed: {errors[0]!r}")
    return results, audit_exactly_once(settings, cfg, load.events)


def broker_failovers(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = KafkaCluster(size=3, port=0, data_dir=Path(tmp) / "kafka").start()
        stop, requests = threading.Event(), []
        try:
            settings = KafkaSettings(bootstrap=cluster.bootstrap)
            ensure_topics(settings, {TOPIC: PARTITIONS, f"{TOPIC}.dlq": 1, TOPIC + SCORES_SUFFIX: 1})
            # 503 until under_load's trainer writes its first checkpoint there; those are not counted
            url = deploy(ServeConfig(checkpoint_dir=str(Path(tmp) / "ckpt"), port=free_port(),
                                     scores_topic=TOPIC + SCORES_SUFFIX, scores_bootstrap=cluster.bootstrap))
            for _ in range(SCORING_CLIENTS):
                threading.Thread(target=score_continuously, args=(url, stop, requests), daemon=True).start()
            runs, audited = under_load(args, Path(tmp), settings, cluster.bootstrap,
                                       lambda cfg, training: broker_kill_and_time(cluster, settings, cfg, training),
                                       args.broker_kills)
        except BaseException:  # the brokers' own account of it outlives the temporary directory
            kept = Path(tempfile.mkdtemp(prefix="faults-kafka-logs-"))
            for i, node in enumerate(cluster.nodes, 1):
                shutil.copytree(node.log_file.parent, kept / f"node-{i}", dirs_exist_ok=True)
            print(f"faults: the brokers' logs are kept in {kept}", flush=True)
            raise
        finally:
            stop.set()
            serve_shutdown()
            cluster.stop()
    return {"runs": runs, "exactly_once": audited, "scoring": scoring_figures(requests),
            "kill_to_new_leaders_s_median": statistics.median(r["new_leaders_s"] for r in runs),
            "new_leaders_to_learning_s_median": statistics.median(r["learning_s"] for r in runs)}


def scoring_figures(requests: list[tuple[float, float, int]]) -> dict:
    """(start, seconds, status) per request -> what failed once the first model was served, and
    the longest span from a failing request's start to the next answered one's."""
    requests = sorted(requests)
    first = next((i for i, r in enumerate(requests) if r[2] == 200), len(requests))
    served = requests[first:]
    longest, failing_since = 0.0, None
    for started, _seconds, status in served:
        if status != 200 and failing_since is None:
            failing_since = started
        elif status == 200 and failing_since is not None:
            longest, failing_since = max(longest, started - failing_since), None
    if failing_since is not None:
        longest = max(longest, served[-1][0] + served[-1][1] - failing_since)
    seconds = sorted(r[1] for r in served if r[2] == 200)
    return {"clients": SCORING_CLIENTS, "requests_once_served": len(served),
            "failed_once_served": sum(r[2] != 200 for r in served), "longest_failing_span_s": round(longest, 3),
            "p99_ms": round(1000 * seconds[int(0.99 * (len(seconds) - 1))], 1) if seconds else None,
            "slowest_answered_s": round(seconds[-1], 3) if seconds else None}


def broker_kill_and_time(cluster: KafkaCluster, settings: KafkaSettings, cfg: TrainConfig, training) -> dict:
    """SIGKILL the broker leading most of the topic's partitions; time new leaders and learning from
    them (a checkpoint past each moved partition's end at the kill); restart it, wait for sync."""
    states = replica_states(settings, [TOPIC])
    victim = Counter(s.leader for s in states.values()).most_common(1)[0][0]
    moved = sorted(p for (_, p), s in states.items() if s.leader == victim)
    ends = end_offsets(settings, TOPIC)
    killed_at = time.time()
    cluster.nodes[victim - 1].kill()
    elected_at = wait_for("new leaders", lambda: time.time() if victim not in
                          {s.leader for s in replica_states(settings, [TOPIC]).values()} else None, 120, training)

    def learned_past_the_kill():
        meta = ckpt.read_meta(ckpt.newest(run_dir(cfg)))
        return meta["written_at"] if all(meta["offsets"][str(p)] > ends[p] for p in moved) else None

    learned_at = wait_for("a checkpoint past the kill on the moved partitions", learned_past_the_kill, 120, training)
    cluster.nodes[victim - 1].start()
    wait_for("every replica in sync", lambda: all(s.in_sync == s.replicas for s in
                                                  replica_states(settings, [TOPIC, cfg.dlq_topic]).values()) or None,
             300, training)
    return {"victim": victim, "partitions_moved": moved, "new_leaders_s": round(elected_at - killed_at, 2),
            "learning_s": round(max(learned_at - elected_at, 0.0), 2),
            "back_in_sync_s": round(time.time() - killed_at, 2)}


def _catching(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # reported by main once the kills are done
        errors.append(e)


def report(args, kills: list[dict], audited: dict, loadavg_before: float, failovers: dict | None) -> None:
    resumed = statistics.median(k["resumed_s"] for k in kills)
    marks = {m: statistics.median(k["marks_since_kill_s"][m] for k in kills) for m in MARKS
             if all(m in k["marks_since_kill_s"] for k in kills)}
    figures = {"kills": args.kills, "rate": args.rate, "workers": 2, "loadavg_1m_before": loadavg_before,
               "in_service_s": args.in_service, "bar_s_issue_47": BAR_S,
               "worker_kill_to_learning_s_median": resumed, "target_s": TARGET_S, "met": resumed <= TARGET_S,
               "worker_kill_to_first_checkpoint_s_median": statistics.median(k["first_checkpoint_s"] for k in kills),
               "marks_since_kill_s_median": marks, "exactly_once": audited, "runs": kills,
               "broker_failover": failovers}
    write_json("faults", figures)
    steps, before = [], 0.0
    for mark, at in marks.items():
        steps.append(f"| {mark} | {at:.1f} | {at - before:+.1f} |")
        before = at
    text = "\n".join([
        f"`python -m load.bench.faults`: training with 2 workers (default settings) under a steady "
        f"{args.rate:,.0f} events/s; {args.kills} times, once the current group has checkpointed and then "
        f"learned {args.in_service:g} s more (in service: its standby processes are up, "
        f"streamlearn/autoscale/warmpool.py), one worker is SIGKILLed. 1-min load average before the run: "
        f"{loadavg_before}. {machine_line()}",
        "",
        f"**Kill → learning resumes (the new group's first optimizer step): median {resumed:.1f} s** "
        f"(runs: {', '.join(format(k['resumed_s'], '.1f') for k in kills)}; target ≤ {TARGET_S:.0f} s: "
        f"{'met' if resumed <= TARGET_S else 'not met'}; issue 47's ≤ {BAR_S:.0f} s: "
        f"{'met' if resumed <= BAR_S else 'not met'}). Kill → the new group's first checkpoint: median "
        f"{figures['worker_kill_to_first_checkpoint_s_median']:.1f} s "
        f"(checkpoints every {TrainConfig().checkpoint_every_s:g} s by default). "
        f"Exactly-once after the kills, against a re-read of Kafka: "
        f"{'held' if audited['passed'] else 'BROKEN ' + str(audited['checks'])} ({audited['learned']:,} learned, "
        f"{audited['dead_lettered']:,} dead-lettered of {audited['produced']:,} produced).",
        "",
        "Where the seconds go (median seconds since the kill at which the replacement group reached each mark):",
        "",
        "| mark | s since the kill | step |", "|---|---:|---:|", *steps,
        "",
        "`worker_process`: when the new group's rank 0 process started (negative: a standby, started before "
        "the kill); `loop_entered`: Ray Train noticed the dead worker, ended the group and started the new "
        "one, its imports (none left in a standby) and the gloo group; `model_ready`: pipeline, model and "
        "optimizer; `restored`: the checkpoint loaded; then the first window read and learned.",
        *([] if failovers is None else ["", failover_text(failovers)]),
    ])
    write_section("faults-bench", "Recovery: a killed Train worker (issue 15), a killed Kafka broker (issue 47)",
                  text)
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=1, default=str))


def failover_text(failovers: dict) -> str:
    runs, audited = failovers["runs"], failovers["exactly_once"]
    return (f"**A Kafka broker SIGKILLed** (3-broker cluster, `kafka up --brokers 3`; the broker leading most of "
            f"the topic's partitions, {len(runs)} times, restarted after each): new leaders after a median "
            f"**{failovers['kill_to_new_leaders_s_median']:.1f} s** (runs: "
            f"{', '.join(format(r['new_leaders_s'], '.1f') for r in runs)}; Kafka's `broker.session.timeout.ms` is "
            f"9 s), and learning from them (the first checkpoint holding events written there after the kill) a "
            f"median **{failovers['new_leaders_to_learning_s_median']:.1f} s** after that (runs: "
            f"{', '.join(format(r['learning_s'], '.1f') for r in runs)}; issue 47's bar: ≤ {BAR_S:.0f} s: "
            f"{'met' if failovers['new_leaders_to_learning_s_median'] <= BAR_S else 'not met'}). Exactly-once "
            f"against a re-read: {'held' if audited['passed'] else 'BROKEN ' + str(audited['checks'])} "
            f"({audited['learned']:,} learned, {audited['dead_lettered']:,} dead-lettered of "
            f"{audited['produced']:,} produced). {scoring_text(failovers['scoring'])}")


def scoring_text(scoring: dict) -> str:
    return (f"Scoring through the kills (the default scorer answering into a topic of the cluster, "
            f"{scoring['clients']} clients back to back): **{scoring['failed_once_served']:,} of "
            f"{scoring['requests_once_served']:,} requests failed** once the first model was served; longest "
            f"span of failing requests {scoring['longest_failing_span_s']:.1f} s; p99 {scoring['p99_ms']} ms, "
            f"slowest answer {scoring['slowest_answered_s']} s.")


if __name__ == "__main__":
    main()
