"""Sustained learned events/s: the whole pipeline against a hand-rolled single-process loop, in
the same run on the same data, for both ingest modes.

    python -m load.bench.ingest [--events 1200000] [--runs 3] [--only direct-2,delayed-2]

Baseline: one process consumes with confluent-kafka, decodes with the same schema code,
featurizes and runs the same model step (batch 256) in one loop, the bar set by DESIGN.md;
Python's collector as a user's loop has it (each run is followed by one with the trainer's
collector setting, reported for reference).
streamlearn: `streamlearn.train.train` with 1 and 2 workers and the default settings (and 2
workers with `--sync step`, DDP, against the default `--sync window`, with each contender's
prequential AUC and log loss beside its rate), its
steady rate taken from the end of its first window to its last checkpoint; start-up, the
checkpoint share and the per-window overhead are reported apart. `--ingest ray-data` (Ray Data
reads, decodes and splits the stream) runs with 2 workers beside the direct path's 2 workers.
Delayed labels: the same events again on a second topic without `is_fraud`, each label on
`<topic>.labels` 0-1 s after its event (streamlearn/loadgen/labels.py), learned by `fraud_delayed` (the same
model, its target joined in the trainer) with 1 and 2 workers, against the inline runs, and
with `--ingest ray-data` (joined in the read lanes) against Ray Data's inline runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from confluent_kafka import Consumer, TopicPartition

from load.bench.common import bench_broker, machine_line, start_bench_ray, write_json, write_section
from streamlearn import heap
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.errors import BadEvent
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.labels import LabelPlan, parse_label_delay
from streamlearn.pipeline import load_pipeline
from streamlearn.train.trainer import run_dir, train

TOPIC, PARTITIONS = "bench", 4
DELAYED = "bench-delayed"  # the same events, their labels on DELAYED.labels


def baseline(bootstrap: str, n: int, device: str = "cpu", partitions: int = PARTITIONS) -> float:
    """The hand-rolled loop: consume, decode, featurize, step; events/s on one core (and its GPU,
    where `device` names one: load/bench/gpu.py)."""
    torch.set_num_threads(1)
    pipeline = load_pipeline("fraud")
    torch.manual_seed(0)
    model = pipeline.build_model().to(device)
    opt = pipeline.make_optimizer(model.parameters())
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"baseline-{time.time()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 20})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
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
            x = torch.from_numpy(pipeline.features(chunk)).to(device)
            y = torch.from_numpy(pipeline.targets(chunk)).to(device)
            loss = pipeline.loss(model(x), y).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    if device != "cpu":
        torch.cuda.synchronize()  # the last steps may still be queued on the GPU
    consumer.close()
    return n / (time.perf_counter() - started)


def pipeline_rate(bootstrap: str, n: int, workers: int, home: Path, ingest: str = "direct", topic: str = TOPIC,
                  pipeline: str = "fraud", drift: bool = True, **overrides) -> dict:
    """One `streamlearn.train.train` run with the defaults a user gets (only the topic, the worker
    count and the bound are set; `overrides`: other TrainConfig fields, as load/bench/gpu.py's
    `use_gpu`). Steady rate: events learned after the first window, over the time from the end of
    that window to the last checkpoint; start-up is reported apart, as where its seconds went (the
    first checkpoint's startup_s, counted from the call to train())."""
    name = f"bench-{ingest}-{workers}-{pipeline}-{time.time_ns()}"
    cfg = TrainConfig(topic=topic, pipeline=pipeline, workers=workers, ingest=ingest, checkpoint_dir=str(home / name),
                      run_name=name, group_id=name, max_events=n, drift=drift, **{"max_failures": 0, **overrides})
    started = time.time()
    # One line a run on stderr: a run that outlasts a lent machine's call is then named.
    print(f"bench: {name} ({workers} workers) started", file=sys.stderr, flush=True)
    summary = train(cfg, KafkaSettings(bootstrap=bootstrap), started_at=started)
    total_s = time.time() - started
    print(f"bench: {name} learned {summary['events_learned']:,} in {total_s:.1f} s", file=sys.stderr, flush=True)
    rows = [json.loads(line) for line in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    startup = rows[0]["startup_s"]
    steady_from = started + startup["first_step_done"]
    # Events of the stream, not rows learned: with delayed feedback a report's event is learned a
    # second time, extra work and not an extra event (its count: the last row's join.reports).
    learned = rows[-1]["learned"] - (rows[-1].get("join") or {}).get("reports", 0) - startup["first_window_events"]
    steady_s = rows[-1]["t"] - steady_from
    phases: dict[str, float] = {}
    for row in rows:
        for k, v in row.get("phases_s", {}).items():
            phases[k] = phases.get(k, 0.0) + v
    scored = [r for r in rows if r.get("auc") is not None]
    return {"workers": workers, "ingest": ingest, "pipeline": pipeline, "drift": drift,
            # Learning beside speed: each checkpoint's prequential AUC / log loss (each rank's last
            # metric_window events, scored before learned), their mean over the run and the last.
            "auc_mean": statistics.fmean(r["auc"] for r in scored) if scored else None,
            "logloss_mean": statistics.fmean(r["logloss"] for r in scored) if scored else None,
            "auc_last": scored[-1]["auc"] if scored else None,
            "logloss_last": scored[-1]["logloss"] if scored else None,
            **overrides,
            "steady_events_per_s": learned / steady_s if steady_s > 0 else float("nan"),
            "steady_s": steady_s, "end_to_end_s": total_s, "end_to_end_events_per_s": n / total_s,
            "first_step_s": startup["first_step_done"], "startup_s": startup,
            "checkpoint_share": phases.get("checkpoint", 0.0) / steady_s if steady_s > 0 else float("nan"),
            "window_overhead_ms_median": statistics.median(r["window_overhead_ms"] for r in rows),
            "learned": summary["events_learned"], "checkpoints": len(rows), "rank0_phases_s": phases,
            "checkpoint_dir": cfg.checkpoint_dir, "run_name": name}


def produce_topics(bootstrap: str, events: int, delayed: bool, partitions: int = PARTITIONS) -> None:
    """The fraud events on TOPIC and, with `delayed`, the same events again on DELAYED with each
    label on DELAYED.labels 0-1 s after its event."""
    run_load(bootstrap, TOPIC, partitions=partitions, count=events, seed=11)
    if delayed:
        run_load(bootstrap, DELAYED, partitions=partitions, count=events, seed=11,
                 labels=LabelPlan(parse_label_delay("uniform:0:1")))


def bench_topics(delayed: bool, partitions: int = PARTITIONS) -> dict[str, int]:
    return {TOPIC: partitions, **({DELAYED: partitions, f"{DELAYED}.labels": partitions} if delayed else {})}


def alternating_rounds(events: int, rounds: int, contenders: list, run_one, first=None, each_round=None,
                       delayed: bool = False, partitions: int = PARTITIONS, each_run=None) -> dict:
    """The fraud topic produced once (and the delayed-label topics with `delayed`), then
    `run_one(bootstrap, events, home, contender)` for every contender once per round, round after
    round (this machine's speed drifts within minutes: a contender's runs in a block would turn
    that drift into ratios). `first(bootstrap, home)` runs before the rounds on the same broker and
    Ray, `each_round(runs so far)` after each (a report that a time limit cannot take away), and
    `each_run(runs so far)` after every run (where a call may be cut mid-round). Runs by contender."""
    import ray

    with bench_broker(bench_topics(delayed, partitions)) as (home, broker, _settings):
        produce_topics(broker.bootstrap, events, delayed, partitions)
        start_bench_ray()
        if first:
            first(broker.bootstrap, home)
        runs: dict = {contender: [] for contender in contenders}
        for _ in range(rounds):
            for contender in contenders:
                runs[contender].append(run_one(broker.bootstrap, events, home, contender))
                if each_run:
                    each_run(runs)
            if each_round:
                each_round(runs)
        ray.shutdown()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    # The steady rate needs seconds of learning to mean anything: 200k events gave 0.9-2.9 s of it
    # (a worker learns ~130k events/s here), and rounds of the same contender scattered 0.99-1.99x.
    parser.add_argument("--events", type=int, default=1_200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated contenders (direct-1, delayed-2, ...): "
                        "their medians and ratios printed, docs/bench and BENCHMARKS.md left as they are "
                        "(a lent machine's lease holds ~18 runs)")
    parser.add_argument("--save", default="", help="with --only: also write docs/bench/NAME.json and its section "
                        "(ingest_rounds: issue 47's Ray Data runs alternating with direct ones in one Ray session)")
    args = parser.parse_args()
    import ray

    contenders = {"direct-1": {"workers": 1}, "direct-2": {"workers": 2},
                  # issue 48: DDP's allreduce a step against the default's average a window, same rounds
                  "direct-2-step": {"workers": 2, "sync": "step"},
                  "ray-data-2": {"workers": 2, "ingest": "ray-data"},
                  # issue 48's `--ingest auto`: one worker leaves a core to the lanes (direct reads inline)
                  "ray-data-1": {"workers": 1, "ingest": "ray-data"},
                  "delayed-1": {"workers": 1, "topic": DELAYED, "pipeline": "fraud_delayed"},
                  "delayed-2": {"workers": 2, "topic": DELAYED, "pipeline": "fraud_delayed"},
                  "delayed-ray-data-2": {"workers": 2, "topic": DELAYED, "pipeline": "fraud_delayed",
                                         "ingest": "ray-data"}}
    only = [name for name in args.only.split(",") if name]
    if unknown := set(only) - set(contenders):
        raise SystemExit(f"--only: unknown contenders {sorted(unknown)}; known: {', '.join(contenders)}")
    contenders = {name: kwargs for name, kwargs in contenders.items() if not only or name in only}
    with bench_broker(bench_topics(delayed=True)) as (home, broker, _settings):
        produce_topics(broker.bootstrap, args.events, delayed=True)
        base, base_quiet = [], []
        for _ in range(args.runs):  # for reference: the same loop with the trainer's collector setting
            base.append(baseline(broker.bootstrap, args.events))
            with heap.quiet_while_streaming():
                base_quiet.append(baseline(broker.bootstrap, args.events))
        start_bench_ray()
        # Round after round, every contender once per round, not each contender's runs in a block:
        # this machine's speed drifts by tens of percent within minutes, and blocks turned that
        # drift into ratios (Ray Data against direct, same code and hour: 0.95x alternating,
        # 0.72x in blocks, 2026-11-26).
        done: dict[str, list[dict]] = {name: [] for name in contenders}
        for _ in range(args.runs):
            for name, kwargs in contenders.items():
                done[name].append(pipeline_rate(broker.bootstrap, args.events, home=home, **kwargs))
        ray.shutdown()
    if only:
        median_base = statistics.median(base)
        partial = {name: _partial(runs, median_base) for name, runs in done.items()}
        print(json.dumps({"baseline_events_per_s": median_base, "machine": machine_line(), **partial}))
        if args.save:  # every run finished: a lost window fails its run (max_failures 0) and the bench with it
            write_json(args.save, {"events": args.events, "rounds": args.runs, "contenders": partial,
                                   "runs_completed": {name: len(runs) for name, runs in done.items()},
                                   "baseline_events_per_s": median_base})
            write_section(args.save, "Ray Data runs alternating with direct ones in one Ray session (issue 47)",
                          f"`python -m load.bench.ingest --only {args.only} --runs {args.runs} --events {args.events} "
                          f"--save {args.save}`: the contenders round after round in one Ray session, each run "
                          "with `max_failures` 0, so a window Ray Data lost would have failed its run and ended "
                          "the benchmark. Before the fix (lanes start at window 0, not the oldest window held) "
                          "two benchmarks ended so, each in its second round's Ray Data run (issue 47).\n")
        return
    report(args.events, base, base_quiet, done)


def _partial(runs: list[dict], base: float) -> dict:
    m = median_run(runs)
    return {"steady_events_per_s": m["steady_events_per_s"], "ratio_to_baseline": m["steady_events_per_s"] / base,
            "first_step_s": m["first_step_s"], "steady_runs": [r["steady_events_per_s"] for r in runs],
            "checkpoint_share": m["checkpoint_share"], "rank0_phases_s": m["rank0_phases_s"],
            **{k: statistics.median(r[k] for r in runs) for k in ("auc_mean", "logloss_mean", "auc_last",
                                                                  "logloss_last") if None not in (r[k] for r in runs)},
            "auc_mean_runs": [r["auc_mean"] for r in runs]}


def median_run(runs: list[dict]) -> dict:
    """The run whose steady rate is the median; every figure of the summary is the median across runs."""
    keys = ("steady_events_per_s", "end_to_end_s", "end_to_end_events_per_s", "first_step_s", "checkpoint_share",
            "window_overhead_ms_median")
    ordered = sorted(runs, key=lambda r: r["steady_events_per_s"])
    return {**ordered[len(ordered) // 2], **{k: statistics.median(r[k] for r in runs) for k in keys}}


def report(n: int, base_runs: list[float], quiet_runs: list[float], done: dict[str, list[dict]]) -> None:
    """docs/bench/ingest.json and its section of docs/BENCHMARKS.md from every contender's runs."""
    runs, rd_runs = {1: done["direct-1"], 2: done["direct-2"]}, done["ray-data-2"]
    delayed_runs, rd_delayed_runs = {1: done["delayed-1"], 2: done["delayed-2"]}, done["delayed-ray-data-2"]
    base = statistics.median(base_runs)
    one, two, rd = median_run(runs[1]), median_run(runs[2]), median_run(rd_runs)
    step = median_run(done["direct-2-step"])
    rd_delayed = median_run(rd_delayed_runs)
    delayed = {w: median_run(rs) for w, rs in delayed_runs.items()}
    figures = {"events": n, "baseline_events_per_s": base, "baseline_runs": base_runs,
               "baseline_quiet_gc_events_per_s": statistics.median(quiet_runs), "baseline_quiet_gc_runs": quiet_runs,
               "streamlearn_1_worker_events_per_s": one["steady_events_per_s"],
               "streamlearn_2_workers_events_per_s": two["steady_events_per_s"],
               "ratio_1_worker_vs_baseline": one["steady_events_per_s"] / base,
               "ratio_2_workers_vs_baseline": two["steady_events_per_s"] / base,
               "ratio_2_workers_vs_1_worker": two["steady_events_per_s"] / one["steady_events_per_s"],
               "sync_step_2_workers_events_per_s": step["steady_events_per_s"],
               "ratio_sync_step_2_workers_vs_1_worker": step["steady_events_per_s"] / one["steady_events_per_s"],
               "quality": {name: {k: median_run(rs).get(k) for k in ("auc_mean", "logloss_mean", "auc_last",
                                                                     "logloss_last")}
                           for name, rs in (("direct-1", runs[1]), ("direct-2", runs[2]),
                                            ("direct-2-step", done["direct-2-step"]))},
               "first_step_s_1_worker": one["first_step_s"], "first_step_s_2_workers": two["first_step_s"],
               "checkpoint_share_1_worker": one["checkpoint_share"],
               "checkpoint_share_2_workers": two["checkpoint_share"],
               "window_overhead_ms_median_1_worker": one["window_overhead_ms_median"],
               "window_overhead_ms_median_2_workers": two["window_overhead_ms_median"],
               "end_to_end_s_1_worker": one["end_to_end_s"], "end_to_end_s_2_workers": two["end_to_end_s"],
               "ray_data_2_workers_events_per_s": rd["steady_events_per_s"],
               "ratio_ray_data_vs_direct_2_workers": rd["steady_events_per_s"] / two["steady_events_per_s"],
               "ratio_ray_data_2_workers_vs_baseline": rd["steady_events_per_s"] / base,
               "first_step_s_ray_data_2_workers": rd["first_step_s"],
               "first_step_gap_s_ray_data_vs_direct": rd["first_step_s"] - two["first_step_s"],
               "end_to_end_s_ray_data_2_workers": rd["end_to_end_s"],
               **{f"delayed_labels_{w}_worker{'s' if w > 1 else ''}_events_per_s": d["steady_events_per_s"]
                  for w, d in delayed.items()},
               **{f"ratio_delayed_labels_vs_inline_{w}_worker{'s' if w > 1 else ''}":
                  d["steady_events_per_s"] / (one if w == 1 else two)["steady_events_per_s"]
                  for w, d in delayed.items()},
               "ray_data_delayed_labels_2_workers_events_per_s": rd_delayed["steady_events_per_s"],
               "ratio_ray_data_delayed_labels_vs_ray_data_inline_2_workers":
                   rd_delayed["steady_events_per_s"] / rd["steady_events_per_s"],
               "runs": {**{str(w): rs for w, rs in runs.items()}, "ray-data-2": rd_runs,
                        "2-step": done["direct-2-step"],
                        **{f"delayed-labels-{w}": rs for w, rs in delayed_runs.items()},
                        "delayed-labels-ray-data-2": rd_delayed_runs}}
    write_json("ingest", figures)
    defaults = TrainConfig
    lines = [
        f"Whole pipeline, {n:,} fraud events on 4 partitions, the same data for every contender, default settings "
        f"(`TrainConfig()`: {defaults.window_events:,}-event windows, batch {defaults.batch_size} per worker, "
        f"checkpoints every {defaults.checkpoint_every_s:g} s or {defaults.checkpoint_every_steps} steps); "
        f"medians of {len(base_runs)} runs each (the baseline's first, before Ray starts; then the streamlearn "
        f"contenders round after round, one run each per round). {machine_line()}",
        "",
        "| contender | learned events/s (steady) | ratio to baseline | first step after `train()` | end to end |",
        "|---|---:|---:|---:|---:|",
        f"| baseline: one process, confluent-kafka + same decode + same MLP step | {base:,.0f} | 1.00 | – | – |",
        f"| for reference, not the bar: the baseline with the trainer's collector setting (`streamlearn/heap.py`) | "
        f"{figures['baseline_quiet_gc_events_per_s']:,.0f} | {figures['baseline_quiet_gc_events_per_s'] / base:.2f} "
        f"| – | – |",
        *[f"| streamlearn `--ingest {r['ingest']}`, {r['workers']} Ray Train worker{'s' if r['workers'] > 1 else ''} | "
          f"{r['steady_events_per_s']:,.0f} | {r['steady_events_per_s'] / base:.2f} | {r['first_step_s']:.1f} s | "
          f"{r['end_to_end_s']:.1f} s |" for r in (one, two, rd)],
        f"| streamlearn `--ingest direct --sync step` (DDP: every step's gradients allreduced), 2 workers | "
        f"{step['steady_events_per_s']:,.0f} | {step['steady_events_per_s'] / base:.2f} | {step['first_step_s']:.1f} s "
        f"| {step['end_to_end_s']:.1f} s |",
        *[f"| streamlearn, delayed labels joined in the trainer (`fraud_delayed`), {w} worker{'s' if w > 1 else ''} | "
          f"{d['steady_events_per_s']:,.0f} | {d['steady_events_per_s'] / base:.2f} | "
          f"{d['first_step_s']:.1f} s | {d['end_to_end_s']:.1f} s |" for w, d in delayed.items()],
        f"| streamlearn `--ingest ray-data`, delayed labels joined in the read lanes, 2 workers | "
        f"{rd_delayed['steady_events_per_s']:,.0f} | {rd_delayed['steady_events_per_s'] / base:.2f} | "
        f"{rd_delayed['first_step_s']:.1f} s | {rd_delayed['end_to_end_s']:.1f} s |",
        "",
        f"Ray Data against the direct path, 2 workers each: {figures['ratio_ray_data_vs_direct_2_workers']:.2f}x "
        f"the learned rate, first step {figures['first_step_gap_s_ray_data_vs_direct']:+.1f} s. Delayed labels "
        f"(each label on its own topic 0-1 s after its event, joined in the trainer) against inline labels, "
        f"same workers: {figures['ratio_delayed_labels_vs_inline_1_worker']:.2f}x the learned rate with 1 worker, "
        f"{figures['ratio_delayed_labels_vs_inline_2_workers']:.2f}x with 2 (the default); joined in Ray Data's "
        f"lanes, {figures['ratio_ray_data_delayed_labels_vs_ray_data_inline_2_workers']:.2f}x Ray Data's own "
        "inline-label rate.",
        "",
        f"Two workers against one (direct): {figures['ratio_2_workers_vs_1_worker']:.2f}x with the default "
        f"`--sync window` (each rank steps alone, weights and Adam's moments averaged once a window), "
        f"{figures['ratio_sync_step_2_workers_vs_1_worker']:.2f}x with `--sync step` (DDP). What they learned, "
        "each checkpoint's prequential AUC and log loss (each rank's newest 5,000 events, scored before "
        "learned), mean over the run and at its end (median run):",
        "",
        "| contender | AUC, mean | log loss, mean | AUC, last | log loss, last |", "|---|---:|---:|---:|---:|",
        *[f"| {name} | {q['auc_mean']:.4f} | {q['logloss_mean']:.4f} | {q['auc_last']:.4f} | {q['logloss_last']:.4f} |"
          for name, q in figures["quality"].items()],
        "",
        "| per run (median) | direct, 1 worker | direct, 2 workers | ray-data, 2 workers |", "|---|---:|---:|---:|",
        f"| checkpointing, share of the steady wall time (training thread) | {one['checkpoint_share']:.1%} | "
        f"{two['checkpoint_share']:.1%} | {rd['checkpoint_share']:.1%} |",
        f"| per-window overhead (plan + its collective with the sizes), ms | {one['window_overhead_ms_median']:.2f} | "
        f"{two['window_overhead_ms_median']:.2f} | {rd['window_overhead_ms_median']:.2f} |",
        "",
        "Where the first step's seconds went (1 worker, the median run; seconds since `train()` was called on a "
        "running Ray cluster):",
        "",
        "| mark | s |", "|---|---:|",
        *[f"| {k} | {v:.2f} |" for k, v in one["startup_s"].items() if k != "first_window_events"],
        "",
        "Where rank 0's time went in the 2-worker median run (seconds; `fetch` and `decode` run in the reader "
        "thread, overlapped with `train`):",
        "",
        "| phase | s |", "|---|---:|",
        *[f"| {k} | {v:.2f} |" for k, v in sorted(two["rank0_phases_s"].items(), key=lambda kv: -kv[1])],
        "",
        "The same for `--ingest ray-data` (`fetch` is the wait for the window's slices from Ray Data, "
        "`decode` rebuilding the arrays; the parsing ran in Ray Data's read lanes):",
        "",
        "| phase | s |", "|---|---:|",
        *[f"| {k} | {v:.2f} |" for k, v in sorted(rd["rank0_phases_s"].items(), key=lambda kv: -kv[1])],
        "",
        "Ray Data start-up marks (the median run):",
        "",
        "| mark | s |", "|---|---:|",
        *[f"| {k} | {v:.2f} |" for k, v in rd["startup_s"].items() if k != "first_window_events"],
    ]
    write_section("ingest", "Continuous training throughput (issue: learn at least as fast as one plain process)",
                  "\n".join(lines))
    print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, dict)}, default=str))


if __name__ == "__main__":
    main()
