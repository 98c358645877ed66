"""Sustained learned events/s: the whole pipeline (2 Ray Train workers) against a hand-rolled
single-process loop, in the same run on the same data; plus Ray Data's bounded read for scale.

    python -m load.bench_ingest [--events 300000]

Baseline: one process consumes with confluent-kafka, decodes with the same schema code,
featurizes and runs the same model step (global batch 256) in one loop, the bar set by
DESIGN.md. streamlearn: `streamlearn.train.train` with 2 workers (batch 128 each, so the
same global batch), its steady rate taken between its first and last checkpoints (start-up
is reported apart). Ray Data: `ray.data.read_kafka` over the same offsets in windows,
decoded in `map_batches`: the alternative ingest path, measured for the decision record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from confluent_kafka import Consumer, TopicPartition

from load.bench_common import bench_broker, machine_line, start_bench_ray, write_json, write_section
from load.generator import run_load
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import BadEvent
from streamlearn.pipeline import load_pipeline
from streamlearn.train.trainer import run_dir, train

TOPIC, PARTITIONS = "bench", 4


def baseline(bootstrap: str, n: int) -> float:
    """The hand-rolled loop: consume, decode, featurize, step; events/s on one core."""
    torch.set_num_threads(1)
    pipeline = load_pipeline("fraud")
    torch.manual_seed(0)
    model = pipeline.build_model()
    opt = pipeline.make_optimizer(model.parameters())
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"baseline-{time.time()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 20})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    seen, events, started = 0, [], time.perf_counter()
    while seen < n:
        for msg in consumer.consume(5000, timeout=1.0):
            seen += 1
            try:
                events.append(pipeline.schema.decode(msg.value()))
            except BadEvent:
                pass
        while len(events) >= 256 or (seen >= n and events):
            chunk, events = events[:256], events[256:]
            x, y = torch.from_numpy(pipeline.features(chunk)), torch.from_numpy(pipeline.targets(chunk))
            loss = pipeline.loss(model(x), y).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    consumer.close()
    return n / (time.perf_counter() - started)


def pipeline_rate(bootstrap: str, n: int, workers: int, home: Path) -> dict:
    cfg = TrainConfig(topic=TOPIC, workers=workers, cpus_per_worker=0.5, batch_size=256 // workers,
                      checkpoint_dir=str(home / f"ckpt-{workers}-{time.time_ns()}"), checkpoint_every_s=1.5,
                      checkpoint_every_steps=10 ** 6, window_events=16384, max_events=n, max_failures=0)
    started = time.perf_counter()
    summary = train(cfg, KafkaSettings(bootstrap=bootstrap))
    total_s = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    steady = (last["learned"] - first["learned"]) / (last["t"] - first["t"]) if len(rows) > 1 else float("nan")
    phases: dict[str, float] = {}
    for row in rows[1:]:
        for k, v in row.get("phases_s", {}).items():
            phases[k] = phases.get(k, 0.0) + v
    return {"workers": workers, "steady_events_per_s": steady, "end_to_end_s": total_s,
            "learned": summary["events_learned"], "checkpoints": len(rows), "rank0_phases_s": phases}


def ray_data_windows(bootstrap: str, n: int, window: int) -> dict:
    import ray


    pipeline = load_pipeline("fraud")

    def decode(batch):
        events = []
        for v in batch["value"]:
            try:
                events.append(pipeline.schema.decode(v))
            except BadEvent:
                pass
        return {"x": pipeline.features(events), "y": pipeline.targets(events)}

    per_partition = window // PARTITIONS
    times, learned, pos = [], 0, 0
    while pos < n // PARTITIONS:
        end = min(pos + per_partition, n // PARTITIONS)
        started = time.perf_counter()
        ds = ray.data.read_kafka(TOPIC, bootstrap_servers=bootstrap,
                                 start_offset={TOPIC: dict.fromkeys(range(PARTITIONS), pos)},
                                 end_offset={TOPIC: dict.fromkeys(range(PARTITIONS), end)}, num_cpus=0.25)
        for batch in ds.map_batches(decode, batch_format="numpy", num_cpus=0.5).iter_batches(batch_size=256):
            learned += len(batch["y"])
        times.append(time.perf_counter() - started)
        pos = end
        if len(times) >= 8:  # enough windows for a median; the full topic would take minutes
            break
    return {"window_events": window, "windows": len(times), "median_window_s": statistics.median(times),
            "events_per_s": window / statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=300_000)
    args = parser.parse_args()
    import ray

    with bench_broker({TOPIC: PARTITIONS}) as (home, broker, _settings):
        run_load(broker.bootstrap, TOPIC, partitions=PARTITIONS, count=args.events, seed=11)
        base = [baseline(broker.bootstrap, args.events) for _ in range(3)]
        start_bench_ray()
        runs = {w: pipeline_rate(broker.bootstrap, args.events, w, home) for w in (2, 1)}
        rd = ray_data_windows(broker.bootstrap, args.events, 16384)
        ray.shutdown()
    report(args.events, statistics.median(base), base, runs, rd)


def report(n: int, base: float, base_runs: list[float], runs: dict, rd: dict) -> None:
    two = runs[2]
    figures = {"events": n, "baseline_events_per_s": base, "baseline_runs": base_runs,
               "streamlearn_2_workers_events_per_s": two["steady_events_per_s"],
               "streamlearn_1_worker_events_per_s": runs[1]["steady_events_per_s"],
               "ratio_2_workers_vs_baseline": two["steady_events_per_s"] / base,
               "ray_data_window_events_per_s": rd["events_per_s"],
               "ray_data_median_window_s": rd["median_window_s"], "runs": runs, "ray_data": rd}
    write_json("ingest", figures)
    phases = two["rank0_phases_s"]
    busy = sum(phases.values()) or 1.0
    lines = [
        f"Whole pipeline, {n:,} fraud events on 4 partitions, same data for every contender. {machine_line()}",
        "",
        "| contender | learned events/s | ratio to baseline |",
        "|---|---:|---:|",
        f"| baseline: one process, confluent-kafka + same decode + same MLP step (median of 3) | {base:,.0f} | 1.00 |",
        f"| streamlearn, 2 Ray Train workers (DDP, gloo), steady state | {two['steady_events_per_s']:,.0f} | "
        f"{two['steady_events_per_s'] / base:.2f} |",
        f"| streamlearn, 1 Ray Train worker, steady state | {runs[1]['steady_events_per_s']:,.0f} | "
        f"{runs[1]['steady_events_per_s'] / base:.2f} |",
        f"| Ray Data `read_kafka` + `map_batches` decode, 16k-event windows, no training | {rd['events_per_s']:,.0f} | "
        f"{rd['events_per_s'] / base:.2f} |",
        "",
        f"Start-up (Ray Train worker group, torch import, first window) is outside the steady rate: the 2-worker "
        f"run took {two['end_to_end_s']:.0f} s end to end for {two['learned']:,} events. Ray Data pays "
        f"{rd['median_window_s']:.2f} s per window (median) before training sees an event.",
        "",
        "Where rank 0's time went in the 2-worker run (seconds, share of the measured phases; `fetch` runs in the "
        "reader thread, overlapped with `train`):",
        "",
        "| phase | s | share |", "|---|---:|---:|",
        *[f"| {k} | {v:.1f} | {v / busy:.0%} |" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])],
    ]
    write_section("ingest", "Continuous training throughput (issue: continuous training)", "\n".join(lines))
    print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, dict)}, default=str))


if __name__ == "__main__":
    main()
