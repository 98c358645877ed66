"""What the drift detectors cost the learned rate, with inline and with delayed labels (issue 16).

    python -m load.bench.drift_cost [--events 200000] [--runs 3]

The same events as load/bench/ingest.py (inline labels on one topic; the same events without
`is_fraud` on another, each label 0-1 s later on `<topic>.labels`), learned by 1 worker, the
case where rank 0's detectors and the join share one training thread, with the detectors on
(the default) and off (`--no-drift`). Runs alternate on and off so a machine that slows down
during the benchmark slows both alike. Writes docs/bench/drift_cost.json and its section of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics

from load.bench.common import bench_broker, machine_line, start_bench_ray, write_json, write_section
from load.bench.ingest import DELAYED, PARTITIONS, TOPIC, pipeline_rate
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.labels import LabelPlan, parse_label_delay

CASES = (("inline", TOPIC, "fraud"), ("delayed", DELAYED, "fraud_delayed"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    import ray

    topics = {TOPIC: PARTITIONS, DELAYED: PARTITIONS, f"{DELAYED}.labels": PARTITIONS}
    runs: dict[str, list[dict]] = {f"{case}-{'on' if drift else 'off'}": [] for case, _, _ in CASES
                                   for drift in (True, False)}
    with bench_broker(topics) as (home, broker, _settings):
        run_load(broker.bootstrap, TOPIC, partitions=PARTITIONS, count=args.events, seed=11)
        run_load(broker.bootstrap, DELAYED, partitions=PARTITIONS, count=args.events, seed=11,
                 labels=LabelPlan(parse_label_delay("uniform:0:1")))
        start_bench_ray()
        for _ in range(args.runs):
            for case, topic, pipeline in CASES:
                for drift in (True, False):
                    runs[f"{case}-{'on' if drift else 'off'}"].append(pipeline_rate(
                        broker.bootstrap, args.events, args.workers, home, topic=topic, pipeline=pipeline,
                        drift=drift))
        ray.shutdown()
    report(args, runs)


def report(args, runs: dict[str, list[dict]]) -> None:
    rate = {name: statistics.median(r["steady_events_per_s"] for r in rs) for name, rs in runs.items()}
    figures = {"events": args.events, "workers": args.workers,
               **{f"{name}_events_per_s": v for name, v in rate.items()},
               "ratio_drift_on_vs_off_inline": rate["inline-on"] / rate["inline-off"],
               "ratio_drift_on_vs_off_delayed": rate["delayed-on"] / rate["delayed-off"],
               "ratio_delayed_vs_inline_drift_on": rate["delayed-on"] / rate["inline-on"],
               "ratio_delayed_vs_inline_drift_off": rate["delayed-off"] / rate["inline-off"],
               "runs": {name: [r["steady_events_per_s"] for r in rs] for name, rs in runs.items()}}
    write_json("drift_cost", figures)
    w = f"{args.workers} worker{'s' if args.workers > 1 else ''}"
    lines = [
        f"{args.events:,} fraud events, {w}, default settings but for the drift detectors; runs alternate "
        f"on and off; medians of {args.runs}. {machine_line()}",
        "",
        "| labels | detectors on (default), events/s | off, events/s | on / off |", "|---|---:|---:|---:|",
        *[f"| {case} | {rate[f'{case}-on']:,.0f} | {rate[f'{case}-off']:,.0f} | "
          f"{rate[f'{case}-on'] / rate[f'{case}-off']:.2f} |" for case, _, _ in CASES],
        "",
        f"Delayed against inline labels, same run: {figures['ratio_delayed_vs_inline_drift_on']:.2f}x with the "
        f"detectors, {figures['ratio_delayed_vs_inline_drift_off']:.2f}x without.",
    ]
    write_section("drift_cost", f"What the drift detectors cost ({w})", "\n".join(lines))
    print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, dict)}))


if __name__ == "__main__":
    main()
