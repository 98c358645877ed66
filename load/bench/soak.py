"""Soak: the whole pipeline at a steady rate for minutes; does anything grow or drift?

    python -m load.bench.soak [--minutes 10] [--rate 2000] [--sample-every 10]

Kafka, continuous training (2 Ray Train workers), the Ray Serve scorer (2 replicas) and one
client scoring single events back to back, all on this machine. Every sample (~10 s): the
resident memory (RSS) of every process that makes up the pipeline (training workers, Serve
replicas and Serve/Train controllers, the driver, the broker), the consumer lag (events in
Kafka not yet in a checkpoint), and the scoring p50/p99 of the requests since the last sample.

Memory growth is judged after a warm-up (the first fifth of the run, at least 60 s) as a
least-squares slope in MiB per minute per process; a leak shows as a steady positive slope,
where allocator noise wanders around zero. Not part of `make test`: it runs for minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from load.bench.common import bench_broker, machine_line, score_continuously, start_bench_ray, write_json, write_section
from load.generator import run_load
from load.profiles import parse_profile
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.kafka.admin import end_offsets
from streamlearn.kafka.broker import EmbeddedKafka, free_port
from streamlearn.train import checkpoint as ckpt

TOPIC, PARTITIONS = "soak", 4
MIB = 1024 * 1024
# Ray actor classes that make up the pipeline, by the role they play in it.
ROLES = {"RayTrainWorker": "train worker", "ServeReplica": "serve replica", "ProxyActor": "serve proxy",
         "ServeController": "serve controller", "TrainController": "train controller"}


def pipeline_processes(dashboard: str, driver: int, broker: int | None) -> dict[int, str]:
    """pid -> role of every live process of the pipeline (looked up each sample: restarts change pids)."""
    from ray.util.state import list_actors

    found = {driver: "driver"}
    if broker:
        found[broker] = "kafka broker"
    for actor in list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=1000):
        role = next((r for prefix, r in ROLES.items() if actor.class_name.startswith(prefix)), None)
        if role and actor.pid:
            found[actor.pid] = role
    return found


def rss(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def lag(settings: KafkaSettings, run_dir: Path) -> int | None:
    """Events in the topic that no checkpoint holds yet."""
    path = ckpt.newest(run_dir)
    try:
        ends = end_offsets(settings, TOPIC)
    except Exception:
        return None
    held = {int(p): o for p, o in ckpt.read_meta(path)["offsets"].items()} if path else {}
    return sum(end - held.get(p, 0) for p, end in ends.items())


def sample_forever(stop: threading.Event, every: float, dashboard: str, broker: EmbeddedKafka,
                   settings: KafkaSettings, run_dir: Path, requests: list, samples: list) -> None:
    started, seen = time.time(), 0
    while not stop.wait(every if samples else 1.0):
        now = time.time()
        try:
            procs = pipeline_processes(dashboard, os.getpid(), broker.pid())
        except Exception as e:  # the state API can time out on a loaded machine: skip one sample
            print(f"sample skipped: {type(e).__name__}: {e}")
            continue
        memory = {f"{role} {pid}": round(value / MIB, 1) for pid, role in procs.items()
                  if (value := rss(pid)) is not None}
        window, seen = requests[seen:], len(requests)
        latencies = [lat * 1000 for _, lat, status in window if status == 200]
        newest = ckpt.newest(run_dir)
        samples.append({"t": round(now - started, 1), "rss_mib": memory, "lag_events": lag(settings, run_dir),
                        "learned": ckpt.read_meta(newest)["counters"]["learned"] if newest else 0,
                        "requests": len(window), "failed": sum(status != 200 for _, _, status in window),
                        "p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
                        "p99_ms": float(np.percentile(latencies, 99)) if latencies else None})
        s = samples[-1]
        print(f"t={s['t']:.0f}s lag={s['lag_events']} learned={s['learned']} p99={s['p99_ms']} ms "
              f"rss={sum(memory.values()):.0f} MiB over {len(memory)} processes")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--sample-every", type=float, default=10.0)
    args = parser.parse_args()
    import ray

    from streamlearn.serve import ServeConfig, deploy
    from streamlearn.serve import shutdown as serve_shutdown
    from streamlearn.train.trainer import train

    samples: list[dict] = []
    requests: list = []
    with bench_broker({TOPIC: PARTITIONS}) as (home, broker, settings):
        ctx = start_bench_ray(include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=free_port())
        cfg = TrainConfig(topic=TOPIC, workers=2, checkpoint_dir=str(home / "ckpt"), checkpoint_every_s=5.0,
                          until_idle_s=10.0, window_events=4096)
        serve_cfg = ServeConfig(checkpoint_dir=cfg.checkpoint_dir, pipeline="fraud", port=free_port(),
                                min_replicas=2, max_replicas=2)
        url = deploy(serve_cfg)
        stop = threading.Event()
        trainer = threading.Thread(target=train, args=(cfg, settings))
        threads = [threading.Thread(target=score_continuously, args=(url, stop, requests)),
                   threading.Thread(target=sample_forever,
                                    args=(stop, args.sample_every, f"http://{ctx.dashboard_url}", broker,
                                          settings, Path(cfg.checkpoint_dir) / cfg.run_name, requests,
                                          samples))]
        for t in [trainer, *threads]:
            t.start()
        produced = run_load(broker.bootstrap, TOPIC, partitions=PARTITIONS, bad_fraction=0.01, seed=31,
                            profile=parse_profile(f"constant:{args.rate}"), duration=args.minutes * 60)
        stop.set()
        for t in threads:
            t.join()
        trainer.join()
        final_lag = lag(settings, Path(cfg.checkpoint_dir) / cfg.run_name)
        serve_shutdown()
        ray.shutdown()
    report(args, samples, requests, produced, final_lag)


def slope_mib_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return float("nan")
    t, v = np.array(points).T
    return float(np.polyfit(t / 60.0, v, 1)[0])


def memory_trends(samples: list[dict], warmup_s: float) -> list[dict]:
    """Per process: RSS at the end of warm-up and at the end, growth, and slope after warm-up."""
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for name, mib in s["rss_mib"].items():
            series.setdefault(name, []).append((s["t"], mib))
    rows = []
    for name, points in sorted(series.items()):
        steady = [p for p in points if p[0] >= warmup_s]
        if not steady:
            continue
        rows.append({"process": name, "samples": len(points), "from_s": steady[0][0], "to_s": steady[-1][0],
                     "rss_start_mib": steady[0][1], "rss_end_mib": steady[-1][1],
                     "rss_max_mib": max(v for _, v in points), "growth_mib": round(steady[-1][1] - steady[0][1], 1),
                     "slope_mib_per_min": round(slope_mib_per_min(steady), 2)})
    return rows


def num(value, spec: str = ".1f") -> str:
    """A figure for the table, or "n/a" where the run produced none (e.g. no model served yet)."""
    return "n/a" if value is None or (isinstance(value, float) and not np.isfinite(value)) else format(value, spec)


def report(args, samples: list[dict], requests: list, produced: dict, final_lag: int | None) -> None:
    duration = args.minutes * 60
    warmup = max(60.0, duration / 5)
    trends = memory_trends(samples, warmup)
    lags = [(s["t"], s["lag_events"]) for s in samples if s["lag_events"] is not None and s["t"] >= warmup]
    lag_slope = (float(np.polyfit(*np.array(lags).T, 1)[0]) if len(lags) >= 3 else float("nan"))  # events/s
    ok = [lat * 1000 for _, lat, status in requests if status == 200]
    p99s = [s["p99_ms"] for s in samples if s["p99_ms"] is not None and s["t"] >= warmup]
    halves = [p99s[: len(p99s) // 2], p99s[len(p99s) // 2:]]
    figures = {"minutes": args.minutes, "rate": args.rate, "sample_every_s": args.sample_every, "warmup_s": warmup,
               "produced": produced.get("events"), "final_lag_events": final_lag,
               "lag_slope_events_per_s": lag_slope, "lag_max_after_warmup": max((v for _, v in lags), default=None),
               "requests": len(requests), "failed_requests": sum(status != 200 for _, _, status in requests),
               "scoring_p50_ms": float(np.percentile(ok, 50)) if ok else None,
               "scoring_p99_ms": float(np.percentile(ok, 99)) if ok else None,
               "p99_first_half_median_ms": float(np.median(halves[0])) if halves[0] else None,
               "p99_second_half_median_ms": float(np.median(halves[1])) if halves[1] else None,
               "memory": trends, "samples": samples}
    write_json("soak", figures)
    f = figures
    rows = [f"| {m['process']} | {m['rss_start_mib']:.0f} | {m['rss_end_mib']:.0f} | {m['rss_max_mib']:.0f} | "
            f"{m['growth_mib']:+.1f} | {m['slope_mib_per_min']:+.2f} |" for m in trends]
    timeline = [f"| {s['t']:.0f} | {num(s['lag_events'], 'd')} | {s['learned']:,} | {s['requests']} | "
                f"{num(s['p99_ms'])} | {sum(s['rss_mib'].values()):.0f} |"
                for s in samples[:: max(1, len(samples) // 12)]]
    text = "\n".join([
        f"{args.minutes:g} minutes at a steady {args.rate:,.0f} events/s (1% malformed): training with 2 workers "
        f"(checkpoint every 5 s), the Ray Serve scorer with 2 replicas, one client scoring single events back to "
        f"back; a sample every {args.sample_every:g} s. Trends are judged after a {warmup:.0f} s warm-up. "
        f"{machine_line()}",
        "",
        f"Lag (events in Kafka not yet in a checkpoint): slope {num(f['lag_slope_events_per_s'], '+.2f')} events/s "
        f"after warm-up (at most {num(f['lag_max_after_warmup'], 'd')} events), {num(final_lag, 'd')} at the end. "
        f"Scoring: {f['requests']:,} requests, {f['failed_requests']} failed (503 before the first checkpoint "
        f"included), p50 {num(f['scoring_p50_ms'])} ms, p99 {num(f['scoring_p99_ms'])} ms overall; median "
        f"per-sample p99 {num(f['p99_first_half_median_ms'])} ms in the first half after warm-up and "
        f"{num(f['p99_second_half_median_ms'])} ms in the second.",
        "",
        "Resident memory per process after warm-up (MiB; slope by least squares):",
        "",
        "| process (role pid) | start | end | max | growth | slope MiB/min |", "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Over time (every few samples):",
        "",
        "| t (s) | lag (events) | learned | requests | p99 (ms) | RSS all (MiB) |", "|---:|---:|---:|---:|---:|---:|",
        *timeline,
    ])
    write_section("soak", "Soak: steady load for minutes (issue: faults and soak)", text)
    print(json.dumps({k: v for k, v in figures.items() if k not in ("samples",)}, default=str))


if __name__ == "__main__":
    main()
