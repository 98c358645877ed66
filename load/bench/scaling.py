"""Scaling figures: learned events/s per worker count, and how the autoscaler reacts to a spike.

    python -m load.bench.scaling [--events 200000] [--peak 30000]

1. Throughput per worker count: `streamlearn.train.train` with 1, 2 and 3 workers on the same
   topic (a plain local Ray head; every worker shares this machine's cores), against the
   single-process baseline of load/bench/ingest.py in the same run.
2. Reaction: on the local autoscaling cluster (`streamlearn cluster up`), `streamlearn train
   --pipeline fraud_heavy --min-workers 1 --max-workers 3` under a spike (fraud itself learns a
   spike the generator can send on one worker here, and nothing would scale) (a trickle, `--peak` events/s for 10 s, a
   trickle): when the policy asked for more (reaction up), when the bigger group took its
   first step, each resize's pause (no optimizer step), when it asked for fewer after the
   backlog drained (reaction down), and when the idle node left.
3. A capacity model from these figures, assumptions stated, for 10k / 100k / 1M events/s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from load.bench.common import bench_broker, machine_line, median, start_bench_ray, write_json, write_section
from load.bench.ingest import PARTITIONS, TOPIC, baseline, median_run, pipeline_rate
from streamlearn.cluster import ClusterSpec, client_env, down, up
from streamlearn.config import REPO_ROOT, KafkaSettings
from streamlearn.kafka.admin import ensure_topics
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.profiles import parse_profile

NODES = ("import json, ray; ray.init(address='auto', log_to_driver=False, configure_logging=False); "
         "print(json.dumps(sum(1 for n in ray.nodes() if n['Alive'] and n['Resources'].get('CPU', 0) > 0)))")


def throughput(bootstrap: str, n: int, home: Path, rounds: int = 3) -> dict:
    """Each worker count `rounds` times, one of each per round (this machine's speed drifts by
    tens of percent within minutes: blocks would turn the drift into ratios); the run with the
    median steady rate stands for its count, every figure of it the median across its runs."""
    import ray

    base = [baseline(bootstrap, n) for _ in range(rounds)]
    start_bench_ray()
    done: dict[int, list[dict]] = {w: [] for w in (1, 2, 3)}
    try:
        for _ in range(rounds):
            for w in done:
                done[w].append(pipeline_rate(bootstrap, n, w, home))
    finally:
        ray.shutdown()
    return {"baseline_events_per_s": statistics.median(base), "baseline_runs": base,
            "runs": {w: {**median_run(rs), "steady_runs": [r["steady_events_per_s"] for r in rs]}
                     for w, rs in done.items()}}


HEAVY = "fraud_heavy"  # pipelines/fraud_heavy.py: ~11k events/s a worker here, so a spike outgrows one
HEAVY_FLOOR = 2_000  # the policy's first estimate of a worker's rate: below what fraud_heavy learns


def reaction(bootstrap: str, peak: float, home: Path, trickle_s: float = 240, train_args: tuple[str, ...] = ()) -> dict:
    topic = f"spike-{time.time_ns()}"
    ensure_topics(KafkaSettings(bootstrap=bootstrap), {topic: PARTITIONS, f"{topic}.dlq": 1})
    # A warm resize starts the new group beside the old one: 1 -> 3 needs room for 4 one-CPU
    # nodes. With 3 (the first setting) a resize to 3 waited for room that never came, until the
    # load fell and 2 fitted: 43.6 s of the 67.6 s from decision to first step (2026-11-26 16:27).
    cluster = up(ClusterSpec(max_nodes=4, idle_timeout_s=10))
    env = {**os.environ, **client_env(cluster.port)}
    ckpt = home / "spike-ckpt"
    train = subprocess.Popen(
        [sys.executable, "-m", "streamlearn.cli", "train", "--pipeline", HEAVY, "--run-name", "spike",
         "--bootstrap", bootstrap, "--topic", topic,
         "--workers", "1", "--min-workers", "1", "--max-workers", "3", "--cpus-per-worker", "1",
         "--checkpoint-dir", str(ckpt), "--checkpoint-every-s", "2", "--up-cooldown", "5", "--down-cooldown", "20",
         "--target-drain", "15", "--capacity-floor", str(HEAVY_FLOOR), "--until-idle", "10", *train_args],
        env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=open(home / "spike-train.log", "w"), text=True)
    run = ckpt / "spike"
    nodes: list[tuple[float, int]] = []
    try:
        # A trickle until the first node and group are up and learning (training stops after
        # --until-idle seconds without events, so the stream must flow from the start).
        while not (run / "history.jsonl").exists():
            assert train.poll() is None, (home / "spike-train.log").read_text()[-3000:]
            run_load(bootstrap, topic, partitions=PARTITIONS, profile=parse_profile("constant:300"), duration=2,
                     seed=4)
        started = time.time()
        spike_at, width = 20.0, 10.0
        profile = parse_profile(f"spike:300:{peak}:{spike_at}:{width}")
        # The trickle goes on long enough for the backlog to drain and the down cool-down to pass.
        run_load(bootstrap, topic, partitions=PARTITIONS, profile=profile, duration=trickle_s, seed=5)
        nodes.append((time.time(), _nodes(env)))
        out, _ = train.communicate(timeout=600)
    finally:
        if train.poll() is None:
            train.kill()
        down(cluster.port)
    spike_t = started + spike_at
    if not (run / "resizes.jsonl").exists():
        raise RuntimeError("the spike caused no resize; the run's log ends:\n"
                           + (home / "spike-train.log").read_text()[-3000:])
    resizes = [json.loads(line) for line in (run / "resizes.jsonl").read_text().splitlines()]
    scaling = [json.loads(line) for line in (run / "scaling.jsonl").read_text().splitlines()]
    ups = [r for r in resizes if r["to"] > r["from"]]
    downs = [r for r in resizes if r["to"] < r["from"]]
    drained = next((s["t"] for s in scaling if s["t"] > spike_t + width and s["lag"] <= max(s["input_rate"], 1) * 4),
                   None)
    (home / "spike-train.out").write_text(out)
    return {"peak_events_per_s": peak, "summary": _summary(out), "resizes": resizes,
            "decision_up_s": ups[0]["decided_at"] - spike_t if ups and ups[0].get("decided_at") else None,
            "reaction_up_s": ups[0]["requested_at"] - spike_t if ups else None,
            "bigger_group_learning_s": ups[0]["t"] - spike_t if ups else None,
            "max_workers_reached": max((r["to"] for r in resizes), default=1),
            "backlog_drained_s": drained - spike_t if drained else None,
            "reaction_down_s": downs[-1]["requested_at"] - drained if downs and drained else None,
            "pauses_s": [r["pause_s"] for r in resizes],
            # From the policy's decision (nodes still to come) to the new group's first step, and
            # where those seconds went (streamlearn/autoscale/handover.py).
            "decision_to_first_step_s": [r.get("decision_to_first_step_s") for r in resizes],
            "resize_seconds": [r.get("seconds") for r in resizes], "nodes_at_end": nodes}


def _summary(out: str) -> dict:
    """The run's summary: the last line of its stdout that is a JSON object (Ray may print its
    workers' lines to the driver's stdout after it)."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"no summary in the run's output, which ends:\n{out[-2000:]}")


def _nodes(env: dict) -> int:
    done = subprocess.run([sys.executable, "-c", NODES], env=env, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else -1


def capacity_model(per_worker: float) -> list[dict]:
    """Workers, partitions and nodes for a target rate, from one worker's measured rate."""
    rows = []
    for target in (10_000, 100_000, 1_000_000):
        # DDP with one allreduce per batch: assume 80% scaling efficiency past one node (gloo
        # on 10 GbE, a small MLP); 70% headroom so a backlog drains while the stream goes on.
        workers = math.ceil(target / (per_worker * 0.8) / 0.7)
        partitions = max(workers, math.ceil(target / 50_000))  # ~50k events/s (13 MB/s) per partition
        nodes = math.ceil(workers / 8)  # 8 workers (1 core each) per 16-core node, half left for decode threads
        rows.append({"events_per_s": target, "workers": workers, "partitions": partitions, "nodes_16_core": nodes})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--peak", type=float, default=30_000)
    parser.add_argument("--skip-throughput", action="store_true", help="reuse docs/bench/scaling.json's figures")
    parser.add_argument("--only-throughput", action="store_true", help="measure workers 1-3 and stop")
    parser.add_argument("--trickle-s", type=float, default=240,
                        help="seconds of load from the trickle's start (shorter: the scale-down may go unmeasured)")
    args = parser.parse_args()
    with bench_broker({TOPIC: PARTITIONS}) as (home, broker, _settings):
        if args.skip_throughput:
            kept = json.loads((REPO_ROOT / "docs/bench/scaling.json").read_text())
            # The rows keep the machine line of the run that measured them, not this one's.
            rates = {**kept["throughput"], "machine": kept["throughput"].get("machine", kept["machine"])}
        else:
            run_load(broker.bootstrap, TOPIC, partitions=PARTITIONS, count=args.events, seed=11)
            rates = throughput(broker.bootstrap, args.events, home)
            write_json("scaling", {"events": args.events, "throughput": rates})  # kept if the rest fails
            if args.only_throughput:
                report_throughput(args.events, rates)
                return
        one = rates["runs"]["1"]["steady_events_per_s"] if "1" in rates["runs"] else \
            rates["runs"][1]["steady_events_per_s"]
        spike = reaction(broker.bootstrap, args.peak, home, args.trickle_s)
    report(args.events, rates, spike, capacity_model(one))


def _throughput_lines(n: int, rates: dict) -> list[str]:
    base = rates["baseline_events_per_s"]
    runs = {int(k): v for k, v in rates["runs"].items()}
    return [
        f"{machine_line(rates.get('machine'))} Every worker here shares the same 2 cores: more workers cannot "
        "add compute on this machine, so these rows show the cost of coordination, not a cluster's scaling.",
        "",
        f"Learned events/s per worker count ({n:,} fraud events, 4 partitions, same topic, same run):",
        "",
        "| workers | learned events/s (steady) | ratio to the 1-process baseline |", "|---:|---:|---:|",
        f"| baseline (one process, no Ray) | {base:,.0f} | 1.00 |",
        *[f"| {w} | {r['steady_events_per_s']:,.0f} ({_runs(r)}) | {r['steady_events_per_s'] / base:.2f} |"
          for w, r in sorted(runs.items())],
    ]


def _runs(r: dict) -> str:
    return "runs " + ", ".join(f"{v / 1000:.1f}k" for v in r.get("steady_runs", [r["steady_events_per_s"]]))


def _model_lines(model: list[dict]) -> list[str]:
    return ["| events/s | workers | partitions | 16-core nodes |", "|---:|---:|---:|---:|",
            *[f"| {r['events_per_s']:,} | {r['workers']} | {r['partitions']} | {r['nodes_16_core']} |"
              for r in model]]


def report_throughput(n: int, rates: dict) -> None:
    """`--only-throughput`: the table and the model, printed (BENCHMARKS.md's section comes from a
    whole run, whose spike part can reuse these rows with `--skip-throughput`)."""
    one = {int(k): v for k, v in rates["runs"].items()}[1]["steady_events_per_s"]
    print("\n".join([*_throughput_lines(n, rates), "", *_model_lines(capacity_model(one))]))


def _parts(resize: dict) -> str:
    """A resize's seconds from the decision on, in order (its record's `seconds`)."""
    parts = resize.get("seconds") or {}
    named = [f"{name.replace('_', ' ')} {v:.1f}" for name, v in parts.items() if v is not None]
    return ", ".join(named) or "no breakdown"


def report(n: int, rates: dict, spike: dict, model: list[dict]) -> None:
    write_json("scaling", {"events": n, "throughput": rates, "spike": spike, "capacity_model": model})
    runs = {int(k): v for k, v in rates["runs"].items()}
    pauses = spike["pauses_s"]

    def fmt(v, unit=" s"):
        return "n/a" if v is None else f"{v:.1f}{unit}"

    lines = [
        *_throughput_lines(n, rates),
        "",
        *([f"The spike below ran apart from the rows above (`--skip-throughput`): {machine_line()}", ""]
          if "machine" in rates else []),
        f"Reaction to a spike on the local autoscaling cluster (`--pipeline {HEAVY}`, trickle 300/s, "
        f"{spike['peak_events_per_s']:,.0f}/s "
        "for 10 s, trickle; min 1, max 3 workers, up cool-down 5 s, down cool-down 20 s, target drain 15 s, "
        "up to 4 nodes of 1 CPU started by Ray's autoscaler (room for a warm 1 → 3), idle timeout 10 s):",
        "",
        "| | seconds |", "|---|---:|",
        f"| spike start → the policy decides on more workers | {fmt(spike.get('decision_up_s'), '')} |",
        f"| spike start → the autoscaler has room for the bigger group (reaction up) | "
        f"{fmt(spike['reaction_up_s'], '')} |",
        f"| spike start → the bigger group takes its first step | {fmt(spike['bigger_group_learning_s'], '')} |",
        *[f"| resize {i + 1}: decision → the new group's first step ({_parts(r)}) | "
          f"{fmt(r.get('decision_to_first_step_s'), '')} |" for i, r in enumerate(spike["resizes"])],
        f"| resize pause, no optimizer step (median of {len(pauses)}: {', '.join(f'{p:.1f}' for p in pauses)}) | "
        f"{fmt(median(pauses) if pauses else None, '')} |",
        f"| spike start → backlog drained | {fmt(spike['backlog_drained_s'], '')} |",
        f"| backlog drained → policy asks for fewer (reaction down) | {fmt(spike['reaction_down_s'], '')} |",
        "",
        f"Workers reached: {spike['max_workers_reached']}; the run learned "
        f"{spike['summary']['events_learned']:,} events and dead-lettered {spike['summary']['dead_lettered']:,} "
        "across every resize. The pause target is ≤ 10 s; on this machine the new group's start (worker processes "
        "importing torch, the gloo group, the Kafka clients) shares the 2 cores with the old group's shutdown, the "
        "broker and the generator.",
        "",
        "Capacity model (assumptions: one worker per core learns what one worker learned here, "
        f"{runs[1]['steady_events_per_s']:,.0f} events/s; 80% DDP efficiency across nodes; 30% headroom to drain "
        "backlogs; ≤ 50k events/s (≈ 13 MB/s of 262-byte events) per Kafka partition; 8 one-core workers per "
        "16-core node, the other cores for decode threads and Ray):",
        "",
        *_model_lines(model),
        "",
        "Past ~100k events/s a single DDP group's allreduce per batch becomes the limit for a model this small; "
        "larger batches per step (fewer allreduces) or several independent groups on partition subsets are the "
        "next steps, and the input network saturates before compute, as the seed reports warn.",
    ]
    write_section("scaling", "Scaling: workers per load, reaction and resize pause (issue: autoscaling)",
                  "\n".join(lines))
    print(json.dumps({"throughput": {w: r["steady_events_per_s"] for w, r in runs.items()},
                      **{k: v for k, v in spike.items() if k != "summary"}}, default=str))


if __name__ == "__main__":
    main()
