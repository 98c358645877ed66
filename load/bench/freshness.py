"""Freshness and swap latency: how soon a served model has learned an event, and what a swap
costs a caller. One run: Kafka, training (2 workers), the Ray Serve scorer, a steady
generator and a scoring client, all on this machine.

    python -m load.bench.freshness [--rate 2000] [--seconds 60] [--replicas 2] [--runs 3]
                                   [--checkpoint-every-s S]   (default: the trainer's default cadence)

Freshness of an event = the moment the scorer first answers with a version whose
trained-through offsets include it, minus the event's Kafka timestamp (producer clock =
this machine's clock). Swap latency = scoring latency of requests that started within one
second after a version change, against all other requests of the same run.

Start-up (Ray Train's group, the first checkpoint, Serve's replicas) takes a minute or more
on two cores, and the trainer then works off the events that piled up meanwhile. So the
steady state begins when a served model has learned everything that was in the topic when
the first model was served; the load runs until `--seconds` after that, and only events
produced after it (and requests sent after it) are judged. Freshness counted from the first
served model is reported beside it, and freshness per 10 s of the run shows where slow events
were. A run that judged no event fails instead of writing a figure.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import threading
import time

import httpx
import numpy as np
from confluent_kafka import Consumer, TopicPartition

from load.bench.common import bench_broker, machine_line, score_continuously, start_bench_ray, write_json, write_section
from streamlearn.config import TrainConfig
from streamlearn.kafka.broker import free_port
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.profiles import parse_profile

TOPIC, PARTITIONS = "fresh", 4


def watch_versions(url: str, stop: threading.Event, seen: list) -> None:
    """(time first served, version, trained_through) for every version the scorer serves."""
    last = None
    with httpx.Client(timeout=2) as client:
        while not stop.is_set():
            try:
                body = client.get(f"{url}/model").json()
                if body.get("version") not in (None, last):
                    last = body["version"]
                    seen.append((time.time(), last, {int(p): o for p, o in body["trained_through"].items()}))
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)


def produced_timestamps(bootstrap: str) -> list[tuple[int, int, float]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fresh-bench", "enable.auto.commit": False})
    rows = []
    for p in range(PARTITIONS):
        low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
        consumer.assign([TopicPartition(TOPIC, p, low)])
        while high > low:
            msg = consumer.poll(5)
            if msg is None:
                break
            rows.append((p, msg.offset(), msg.timestamp()[1] / 1000.0))
            if msg.offset() + 1 >= high:
                break
    consumer.close()
    return rows


def freshness(events: list[tuple[int, int, float]], served: list) -> list[float]:
    """Seconds from produce to first served model that learned it (events never served are skipped)."""
    out = []
    times = [t for t, _, _ in served]
    for p, offset, produced in events:
        start = bisect.bisect_left(times, produced)
        for t, _, through in served[start:]:
            if through.get(p, 0) > offset:
                out.append(t - produced)
                break
    return out


def caught_up_at(events: list[tuple[int, int, float]], served: list, warm: float) -> float:
    """When a served model had learned everything produced before the first model was served.
    Until then the trainer works off the start-up backlog (a minute of events on two cores),
    and freshness measures catching up rather than the steady state."""
    backlog: dict[int, int] = {}  # partition -> end offset (exclusive) of what was produced by then
    for p, offset, produced in events:
        if produced <= warm:
            backlog[p] = max(backlog.get(p, 0), offset + 1)
    return served_through(served, backlog) or float("inf")


def served_through(served: list, ends: dict[int, int]) -> float | None:
    """When the scorer first served a version that had learned every partition up to `ends`."""
    return next((t for t, _, through in list(served)
                 if all(through.get(p, 0) >= end for p, end in ends.items())), None)


def by_interval(events: list[tuple[int, int, float]], served: list, warm: float, width: float = 10.0) -> list[dict]:
    """Freshness of the events produced in each `width` seconds after the first served model:
    where in the run the slow ones were."""
    rows = []
    last = max((e[2] for e in events), default=warm)
    for k in range(int((last - warm) // width) + 1):
        fresh = freshness([e for e in events if warm + k * width < e[2] <= warm + (k + 1) * width], served)
        if fresh:
            rows.append({"from_s": k * width, "events": len(fresh), "p50_s": round(pct(fresh, 50), 3),
                         "p99_s": round(pct(fresh, 99), 3), "max_s": round(max(fresh), 3)})
    return rows


def pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=60,
                        help="measured, after the served model caught up with start-up's backlog")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--checkpoint-every-s", type=float, default=TrainConfig.checkpoint_every_s,
                        help="the trainer's cadence (default: the trainer's own default); freshness cannot beat it")
    parser.add_argument("--runs", type=int, default=3, help="figures are the medians of the runs")
    parser.add_argument("--patience", type=float, default=600, help="give up if no model is served by then")
    args = parser.parse_args()
    runs = [figures_of(args, *measure(args)) for _ in range(args.runs)]
    report(args, runs)


def measure(args) -> tuple[list, list, list]:
    """One run on a fresh broker and Ray: (events produced, versions served, scoring requests)."""
    import ray

    from streamlearn.serve import ServeConfig, deploy
    from streamlearn.serve import shutdown as serve_shutdown
    from streamlearn.train.trainer import train

    with bench_broker({TOPIC: PARTITIONS}) as (home, broker, settings):
        start_bench_ray()
        cfg = TrainConfig(topic=TOPIC, workers=2, checkpoint_dir=str(home / "ckpt"),
                          checkpoint_every_s=args.checkpoint_every_s, until_idle_s=5.0)
        serve_cfg = ServeConfig(checkpoint_dir=cfg.checkpoint_dir, pipeline="fraud", port=free_port(),
                                min_replicas=args.replicas, max_replicas=args.replicas)
        url = deploy(serve_cfg)
        stop, served, requests = threading.Event(), [], []
        threads = [threading.Thread(target=watch_versions, args=(url, stop, served)),
                   threading.Thread(target=score_continuously, args=(url, stop, requests))]
        trainer = threading.Thread(target=train, args=(cfg, settings))
        for t in [*threads, trainer]:
            t.start()
        produce_until_measured(broker.bootstrap, args, served)
        trainer.join()
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join()
        serve_shutdown()
        ray.shutdown()
        events = produced_timestamps(broker.bootstrap)
    return events, served, requests


def produce_until_measured(bootstrap: str, args, served: list) -> None:
    """A steady rate, in short runs, until `args.seconds` have passed since the served model
    caught up with the backlog that start-up left (what was in the topic at the first served model)."""
    deadline, chunk, backlog = time.time() + args.patience, 0, None
    while True:
        if not served and time.time() > deadline:
            raise SystemExit(f"no model was served within {args.patience:.0f} s; nothing to measure")
        if served and backlog is None:
            backlog = high_watermarks(bootstrap)
        caught = backlog and served_through(served, backlog)
        if caught and time.time() >= caught + args.seconds:
            return
        run_load(bootstrap, TOPIC, partitions=PARTITIONS, profile=parse_profile(f"constant:{args.rate}"),
                 duration=5.0, seed=21 + chunk)
        chunk += 1


def high_watermarks(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fresh-bench"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def figures_of(args, events, served, requests) -> dict:
    first = served[0][0] if served else float("inf")
    warm = caught_up_at(events, served, first)  # the steady state begins when start-up's backlog is served
    after_first = freshness([e for e in events if e[2] > first], served)
    steady_events = [e for e in events if e[2] > warm]
    fresh = freshness(steady_events, served)
    swaps = [t for t, _, _ in served[1:]]
    during, steady, failed = [], [], 0
    for started, latency, status in requests:
        if started < first:
            continue
        failed += status != 200  # any failure once a model is served counts, catch-up or not
        if started < warm:
            continue
        k = bisect.bisect_right(swaps, started)
        (during if k and started - swaps[k - 1] < 1.0 else steady).append(latency * 1000)
    versions = [v for _, v, _ in served]
    if not fresh:
        raise SystemExit(f"no event was judged ({len(steady_events)} produced after the catch-up, "
                         f"{len(served)} versions served): a failed run, not a figure")
    figures = {"catch_up_s": warm - first, "events_produced_after_catch_up": len(steady_events),
               "freshness_p99_after_first_model_s": pct(after_first, 99), "events_measured": len(fresh),
               "events_never_served": len(steady_events) - len(fresh), "freshness_p50_s": pct(fresh, 50),
               "freshness_p99_s": pct(fresh, 99), "versions_served": len(served),
               "versions_monotonic": versions == sorted(versions), "requests": len(requests),
               "failed_requests": failed, "steady_p50_ms": pct(steady, 50), "steady_p99_ms": pct(steady, 99),
               "swap_p50_ms": pct(during, 50), "swap_p99_ms": pct(during, 99),
               "swap_p99_vs_steady": pct(during, 99) / pct(steady, 99) if steady and during else float("nan"),
               "median_swap_interval_s": statistics.median(np.diff(swaps)) if len(swaps) > 2 else float("nan")}
    print(json.dumps(figures), flush=True)
    figures["by_10s_after_first_model"] = by_interval(events, served, first)
    print(json.dumps(figures["by_10s_after_first_model"]), flush=True)
    return figures


def report(args, runs: list[dict]) -> None:
    numeric = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    f = {k: statistics.median(r[k] for r in runs) for k in numeric}
    f |= {"versions_monotonic": all(r["versions_monotonic"] for r in runs),
          "failed_requests": sum(r["failed_requests"] for r in runs)}
    settings = {"rate": args.rate, "seconds_measured": args.seconds, "replicas": args.replicas,
                "checkpoint_every_s": args.checkpoint_every_s,
                "checkpoint_every_s_is_default": args.checkpoint_every_s == TrainConfig.checkpoint_every_s}
    name = "freshness" if settings["checkpoint_every_s_is_default"] else f"freshness_ckpt{args.checkpoint_every_s:g}s"
    write_json(name, settings | {"median": f, "runs": runs})
    cadence = (f"checkpointing every {args.checkpoint_every_s:g} s (the trainer's default)"
               if settings["checkpoint_every_s_is_default"] else
               f"checkpointing every {args.checkpoint_every_s:g} s (NOT the default "
               f"{TrainConfig.checkpoint_every_s:g} s: what a user who wants freshness sets)")
    per_run = "; ".join(f"{r['freshness_p99_s']:.2f} s / {r['swap_p99_vs_steady']:.2f}×" for r in runs)
    text = "\n".join([
        f"Steady {args.rate:,.0f} events/s until {args.seconds:.0f} s after the served model caught up with "
        f"start-up's backlog (only that window is judged); training with 2 workers {cadence}; the scorer's "
        f"defaults with {args.replicas} replicas; one scoring client sending single events back to back. Medians of "
        f"{len(runs)} runs, each on a fresh broker and Ray. {machine_line()}",
        "",
        "| measure (median of runs) | p50 | p99 | target |", "|---|---:|---:|---|",
        f"| freshness: produced → served model has learned it | {f['freshness_p50_s']:.2f} s | "
        f"{f['freshness_p99_s']:.2f} s | p99 ≤ 5 s |",
        f"| scoring latency, steady | {f['steady_p50_ms']:.1f} ms | {f['steady_p99_ms']:.1f} ms | |",
        f"| scoring latency, ≤ 1 s after a swap | {f['swap_p50_ms']:.1f} ms | {f['swap_p99_ms']:.1f} ms | "
        f"p99 ≤ 2× steady (here {f['swap_p99_vs_steady']:.2f}×) |",
        "",
        f"Per run, freshness p99 / swap p99 vs steady: {per_run}. A median run served "
        f"{f['versions_served']:.0f} versions (a swap every {f['median_swap_interval_s']:.1f} s); versions only "
        f"moved forward in every run: {f['versions_monotonic']}; {f['failed_requests']} of "
        f"{sum(r['requests'] for r in runs):,} requests failed in all runs. A median run judged "
        f"{f['events_measured']:,.0f} events produced after its served model caught up with start-up's backlog "
        f"({f['catch_up_s']:.1f} s after the first model, median); counting from the first served model "
        f"instead, freshness p99 is {f['freshness_p99_after_first_model_s']:.2f} s (median of runs).",
        "",
        f"Reproduce: `python -m load.bench.freshness --checkpoint-every-s {args.checkpoint_every_s:g}`.",
    ])
    write_section(name, f"Freshness and swap latency, {cadence.split(' (')[0]} (issue 14)", text)
    print(json.dumps(settings | {"median": f}))


if __name__ == "__main__":
    main()
