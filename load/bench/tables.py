"""Each benchmark's headline table in docs/BENCHMARKS.md, rendered from its docs/bench/<name>.json.

    python -m load.bench.tables           # rewrite every marked table block in docs/BENCHMARKS.md
    python -m load.bench.tables --check   # exit 1, naming each block that differs from its JSON

A block sits between `<!-- table: NAME (generated ...) -->` and `<!-- /table: NAME -->`; nothing in it
is written by hand, so the page cannot say what its JSON does not. `write_section` (common.py) puts a
benchmark's block at the head of the section it rewrites. Bars that a JSON does not record (ingest's,
gate's, group_start's...) are the issues' own, written here once as constants.

Only the standard library: the doc test and the command run without Kafka, Ray or torch.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "docs" / "bench"
BENCHMARKS_MD = REPO_ROOT / "docs" / "BENCHMARKS.md"

# A benchmark's section in BENCHMARKS.md, where its name is not its JSON's.
SECTION_JSON = {"faults-bench": "faults"}

BLOCK = re.compile(r"<!-- table: (?P<name>[\w.-]+) \(generated [^\n]*?-->\n.*?<!-- /table: (?P=name) -->", re.S)

# Bars from the issues, where the JSON does not record its own.
INGEST_BARS = {"ratio_1": 0.8, "ratio_2": 1.0, "first_step_s": 15.0, "checkpoint_share": 0.05,
               "window_overhead_ms": 5.0, "ray_data_vs_direct": 0.8, "ray_data_first_step_gap_s": 10.0,
               "delayed_vs_inline": 0.9,
               # issue 48: a second worker adds throughput, and learns as well as DDP did
               "two_vs_one": 1.0, "two_vs_baseline": 1.3, "auc_vs_step": 0.005, "cpu_two_vs_one": 1.15}
RESIZE_BAR_S, PAUSE_BAR_S = 40.0, 10.0  # issue 12: decision → the new group's first step; the pause (scaling)
DRIFT_BAR_S = 30.0  # issue 16: drift → first alarm
FRESHNESS_P99_BAR_S, SWAP_P99_BAR = 5.0, 2.0  # issue 14 (load/bench/freshness.py)
GATE_GOOD_HELD_MAX, GATE_WORSE_HELD_MIN = 0.01, 0.95  # load/bench/gate.py


# --- formatting: every number goes through one of these ------------------------------------------------------------

def num(v: float | None, spec: str = ",.0f", unit: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{unit}"


def ratio(v: float | None) -> str:
    return num(v, ".2f", "×")


def secs(v: float | None, spec: str = ".1f") -> str:
    return num(v, spec, " s")


def pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f} %"


def met(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "**not met**")


def passed(ok: bool | None) -> str:
    return "–" if ok is None else ("pass" if ok else "**FAIL**")


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    """A Markdown table; `align` one letter a column: l(eft) or r(ight); first column left, others right."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), rule, *map(line, rows)]


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


MACHINE_LINE = re.compile(r"Machine: (?P<nproc>\d+) cores \(nproc\), (?P<cpu>.*?); Python (?P<python>\S+); "
                          r"measured (?P<date>.*?) \(1-min load average (?P<loadavg_1m>[^ ]+) when written\)")


def machine_facts(m: Any) -> dict[str, Any]:
    """A JSON's "machine": the dict write_json records, or the line machine_line() wrote instead."""
    if isinstance(m, str):
        found = MACHINE_LINE.search(m)
        return found.groupdict() if found else {"text": m}
    return dict(m or {})


def machine(m: Any, what: str = "Measured") -> str:
    f = machine_facts(m)
    if "text" in f:
        return f"{what}: {f['text']}"
    where = f.get("device") or f"{f.get('nproc', '?')} cores (nproc), {f.get('cpu', '?')}"
    extra = "".join(f", {k} {f[k]}" for k in ("torch", "nccl", "ray") if k in f)
    load = (f"1-min load average {f['loadavg_1m']} when written" if "loadavg_1m" in f else
            f"1-min load average {f['loadavg_1m_at_end']} at the end" if "loadavg_1m_at_end" in f else
            "load average not recorded")
    return f"{what} {f.get('date', '?')} on {where}; Python {f.get('python', '?')}{extra}; {load}."


def with_machine(lines: list[str], d: dict, before: float | None = None) -> str:
    foot = machine(d.get("machine"))
    if before is not None:
        foot = foot[:-1] + f" ({before} before the run)."
    if len(lines) > 2 and lines[-2] == "":  # the table's note, then the machine, in one paragraph
        return "\n".join([*lines[:-1], f"{lines[-1]} {foot}"])
    return "\n".join([*lines, "", foot])


# --- one renderer a JSON ------------------------------------------------------------------------------------------

def kafka_clients(d: dict) -> str:
    rows = [[op, num(d[f"{op}_confluent_events_per_s"]), num(d[f"{op}_kafka_python_events_per_s"]),
             ratio(d[f"{op}_ratio_confluent_vs_kafka_python"]), ratio(d[f"{op}_ratio_median_of_rounds"])]
            for op in ("produce", "consume")]
    incomplete = sum(d.get("incomplete_runs", {}).values())
    lines = table(["operation", "confluent-kafka, events/s", "kafka-python, events/s", "ratio of medians",
                   "median of per-round ratios"], rows)
    runs = len(next(iter(d["runs"].values())))
    lines += ["", f"{d['events']:,} events, {d['partitions']} partitions, medians of {runs} rounds; "
              f"runs cut short by the trial timeout: {incomplete}."]
    return with_machine(lines, d)


def generator(d: dict) -> str:
    target = d["target_events_per_s"]
    rows = [["events/s, end to end (incl. the final flush)", num(d["events_per_s"]), f"≥ {target:,}",
             f"{met(d['meets_target'])} ({ratio(d['ratio_to_target'])} the target)"],
            ["events per CPU second of the whole process", num(d["events_per_cpu_s"]), f"≥ {target:,}",
             met(d["events_per_cpu_s"] >= target)],
            ["generation + encoding only, no Kafka, events/s", num(d["generation_only_events_per_s"]), "", ""]]
    lines = table(["measure (median)", "value", "target", ""], rows, "lrll")
    lines += ["", f"{d['events']:,} events into {d['partitions']} partitions, medians of {len(d['runs'])} runs."]
    return with_machine(lines, d)


def scoring(d: dict) -> str:
    target_ratio, target_p99 = d["target_ratio_serve_vs_plain_8c"], d["target_p99_vs_plain_8c"]
    plain = d["plain_median"]["8"]
    rows = [["plain uvicorn + FastAPI, 1 process (the baseline, median of its runs)", "", num(plain["req_per_s"]),
             "1.00×", num(plain["p99_ms"], ".1f"), "", ""]]
    for name, g in d["by_variant"].items():
        ok = g["ratio_8c"] >= target_ratio and g["p99_ms_8c"] <= target_p99 * g["plain_p99_ms_8c"]
        description = d["variants"].get(name, {}).get("description", name)
        rows.append([f"`{name}`: {description}", str(g["measurements"]), num(g["req_per_s_8c"]), ratio(g["ratio_8c"]),
                     num(g["p99_ms_8c"], ".1f"), ratio(g["p99_ms_8c"] / g["plain_p99_ms_8c"]), met(ok)])
    lines = table(["at 8 connections", "runs", "req/s", "Serve / plain", "p99 ms", "p99 / plain's",
                   f"issue 14: ≥ {target_ratio:g}× and p99 ≤ {target_p99:g}× plain's"], rows, "lrrrrrl")
    lines += ["", "Medians over each variant's runs; every ratio is against the plain run right before it."]
    return with_machine(lines, d)


def ingest(d: dict) -> str:
    b = INGEST_BARS
    base = d["baseline_events_per_s"]
    r1, r2 = d["ratio_1_worker_vs_baseline"], d["ratio_2_workers_vs_baseline"]
    rd, gap = d["ratio_ray_data_vs_direct_2_workers"], d["first_step_gap_s_ray_data_vs_direct"]
    dl1, dl2 = d["ratio_delayed_labels_vs_inline_1_worker"], d["ratio_delayed_labels_vs_inline_2_workers"]
    first = (d["first_step_s_1_worker"], d["first_step_s_2_workers"])
    share = (d["checkpoint_share_1_worker"], d["checkpoint_share_2_workers"])
    window = (d["window_overhead_ms_median_1_worker"], d["window_overhead_ms_median_2_workers"])
    rows = [
        ["baseline: one process, confluent-kafka + the same decode and MLP step", num(base), "1.00×", "", ""],
        ["for reference, not the bar: the baseline with the trainer's collector setting",
         num(d["baseline_quiet_gc_events_per_s"]), ratio(d["baseline_quiet_gc_events_per_s"] / base), "", ""],
        ["`--ingest direct`, 1 worker", num(d["streamlearn_1_worker_events_per_s"]), ratio(r1),
         f"≥ {b['ratio_1']}× (issue 12)", met(r1 >= b["ratio_1"])],
        ["`--ingest direct`, 2 workers", num(d["streamlearn_2_workers_events_per_s"]), ratio(r2),
         f"≥ {b['ratio_2']}× (issue 12)", met(r2 >= b["ratio_2"])],
        *_scaling_rows(d, b),
        ["`--ingest ray-data`, 2 workers: against direct, 2 workers", num(d["ray_data_2_workers_events_per_s"]),
         ratio(rd), f"≥ {b['ray_data_vs_direct']}× direct (issue 13)", met(rd >= b["ray_data_vs_direct"])],
        ["delayed labels joined in the trainer, 1 worker: against inline",
         num(d["delayed_labels_1_worker_events_per_s"]), ratio(dl1),
         f"≥ {b['delayed_vs_inline']}× inline (issue 16)", met(dl1 >= b["delayed_vs_inline"])],
        ["delayed labels joined in the trainer, 2 workers: against inline",
         num(d["delayed_labels_2_workers_events_per_s"]), ratio(dl2), f"≥ {b['delayed_vs_inline']}× inline (issue 16)",
         met(dl2 >= b["delayed_vs_inline"])],
        ["delayed labels joined in Ray Data's lanes, 2 workers: against Ray Data inline",
         num(d["ray_data_delayed_labels_2_workers_events_per_s"]),
         ratio(d["ratio_ray_data_delayed_labels_vs_ray_data_inline_2_workers"]), "", ""],
        ["first step after `train()`, 1 / 2 workers", f"{secs(first[0])} / {secs(first[1])}", "",
         f"≤ {b['first_step_s']:g} s (issue 12)", met(max(first) <= b["first_step_s"])],
        ["first step, Ray Data after direct (2 workers)", f"{gap:+.1f} s", "",
         f"≤ +{b['ray_data_first_step_gap_s']:g} s (issue 13)", met(gap <= b["ray_data_first_step_gap_s"])],
        ["checkpointing, share of the steady wall time, 1 / 2 workers", f"{pct(share[0])} / {pct(share[1])}", "",
         f"≤ {b['checkpoint_share'] * 100:g} % (issue 12)", met(max(share) <= b["checkpoint_share"])],
        ["per-window overhead, 1 / 2 workers", f"{num(window[0], '.2f')} / {num(window[1], '.2f')} ms", "",
         f"≤ {b['window_overhead_ms']:g} ms (issue 12)", met(max(window) <= b["window_overhead_ms"])],
    ]
    lines = table(["contender or figure (median)", "learned events/s, or value", "ratio", "bar", ""], rows, "lrrll")
    runs = len(d["baseline_runs"])
    lines += ["", f"{d['events']:,} events, medians of {runs} runs each; ratios are to the baseline unless the row "
              "names another contender."]
    return with_machine(lines, d)


def _scaling_rows(d: dict, b: dict) -> list[list[str]]:
    """Issue 48's rows: 2 workers against 1 with each sync mode, and what they learned."""
    if "ratio_2_workers_vs_1_worker" not in d:
        return []
    two, step = d["ratio_2_workers_vs_1_worker"], d["ratio_sync_step_2_workers_vs_1_worker"]
    r2, q = d["ratio_2_workers_vs_baseline"], d["quality"]
    gap = q["direct-2-step"]["auc_mean"] - q["direct-2"]["auc_mean"]
    return [
        ["`--ingest direct`, 2 workers (`--sync window`): against 1 worker",
         num(d["streamlearn_2_workers_events_per_s"]), ratio(two),
         f"≥ {b['two_vs_one']}× 1 worker, ≥ {b['two_vs_baseline']}× baseline (issue 48)",
         met(two >= b["two_vs_one"] and r2 >= b["two_vs_baseline"])],
        ["`--sync step` (DDP), 2 workers: against 1 worker", num(d["sync_step_2_workers_events_per_s"]), ratio(step),
         "", ""],
        ["prequential AUC over the run, 2 workers: `--sync window` / `step`",
         f"{q['direct-2']['auc_mean']:.4f} / {q['direct-2-step']['auc_mean']:.4f}", "",
         f"within {b['auc_vs_step']} of `step` (issue 48)", met(gap <= b["auc_vs_step"])],
    ]


def faults(d: dict) -> str:
    audit = d["exactly_once"]
    runs = ", ".join(f"{r['resumed_s']:.1f}" for r in d["runs"])
    bar = d.get("bar_s_issue_47")
    resumed = d["worker_kill_to_learning_s_median"]
    rows = [["SIGKILL of a Train worker → the new group's first step", secs(resumed), runs,
             f"≤ {d['target_s']:g} s (issue 15)" + (f"; ≤ {bar:g} s (issue 47)" if bar else ""),
             met(d["met"]) + (f"; {met(resumed <= bar)}" if bar else "")],
            ["SIGKILL → the new group's first checkpoint", secs(d["worker_kill_to_first_checkpoint_s_median"]),
             ", ".join(f"{r['first_checkpoint_s']:.1f}" for r in d["runs"]), "", ""],
            [f"exactly once after the kills: {audit['learned']:,} learned + {audit['dead_lettered']:,} dead-lettered "
             f"of {audit['produced']:,} produced, against a re-read", "", "", "every check", met(audit["passed"])]]
    if failover := d.get("broker_failover"):
        moved, audit = failover["runs"], failover["exactly_once"]
        learning = failover["new_leaders_to_learning_s_median"]
        rows += [["SIGKILL of the busiest Kafka leader (3 brokers) → new leaders",
                  secs(failover["kill_to_new_leaders_s_median"]), ", ".join(f"{r['new_leaders_s']:.1f}" for r in moved),
                  "Kafka's broker.session.timeout.ms: 9 s", ""],
                 ["new leaders → learning from them (a checkpoint past the kill)", secs(learning),
                  ", ".join(f"{r['learning_s']:.1f}" for r in moved), f"≤ {bar:g} s (issue 47)", met(learning <= bar)],
                 [f"exactly once after the broker kills: {audit['learned']:,} learned + {audit['dead_lettered']:,} "
                  f"dead-lettered of {audit['produced']:,} produced", "", "", "every check", met(audit["passed"])]]
        if scoring := failover.get("scoring"):
            shortest = min(r["new_leaders_s"] for r in moved)  # issue 47: no failure outlasts an election
            rows += [[f"scoring through the broker kills ({scoring['clients']} clients): failed of "
                      f"{scoring['requests_once_served']:,} once served; the longest span of failing ones",
                      secs(scoring["longest_failing_span_s"]), f"{scoring['failed_once_served']:,} failed",
                      f"no span longer than an election ({shortest:.1f} s)",
                      met(scoring["longest_failing_span_s"] <= shortest)]]
    lines = table(["measure", "median", "runs (s)", "target", ""], rows, "lrlll")
    service = f", each after its group learned {d['in_service_s']:g} s past its checkpoints" \
        if "in_service_s" in d else ""
    lines += ["", f"{d['kills']} kills, 2 workers under {d['rate']:,} events/s{service}."]
    return with_machine(lines, d, d.get("loadavg_1m_before"))


def soak(d: dict) -> str:
    g = d["gates"]

    def figures(gate: dict) -> str:
        if "worst" in gate:
            w = gate["worst"] or {}
            return f"worst: {w.get('process', '–')}, {num(w.get('slope_mib_per_min'), '+.2f')} MiB/min"
        if "first_ms" in gate:
            return f"first 2 min {num(gate['first_ms'], '.1f')} ms, last 2 min {num(gate['last_ms'], '.1f')} ms"
        if "rise_events" in gate:
            return (f"rise {num(gate['rise_events'])} events (standard error {num(gate['rise_standard_error'])}), "
                    f"most {num(gate['max_events'])}")
        if "produced" in gate:
            return (f"{gate['learned']:,} learned + {gate['dead_lettered']:,} dead-lettered of "
                    f"{gate['produced']:,} produced")
        if "failed" in gate:
            return f"{gate['failed']:,} failed after the first model, served at {secs(gate['first_served_s'])}"
        return ""

    rows = [[name, passed(gate["passed"]), figures(gate)] for name, gate in g.items()]
    after = next((gate["failed"] for gate in g.values() if "failed" in gate), 0)
    rows.append([f"overall ({d['minutes']:g} min at {d['rate']:,} events/s, {d['clients']} clients)",
                 passed(d["passed"]), f"{d['requests']:,} requests, p50 {num(d['scoring_p50_ms'], '.1f')} ms, "
                 f"p99 {num(d['scoring_p99_ms'], '.1f')} ms; {d['failed_requests']:,} failed, "
                 f"{d['failed_requests'] - after:,} of them before the first model was served"])
    lines = table(["gate", "result", "figures"], rows, "lll")
    return with_machine(lines, d, d.get("loadavg_1m_before"))


def scaling(d: dict) -> str:
    t = d["throughput"]
    base = t["baseline_events_per_s"]
    runs = sorted(t["runs"].items(), key=lambda kv: int(kv[0]))
    rows = [["learned events/s: the baseline (one process, no Ray)", num(base), "", ""],
            [f"learned events/s: {' / '.join(w for w, _ in runs)} workers on the same 2 cores",
             " / ".join(num(r["steady_events_per_s"]) for _, r in runs),
             " / ".join(ratio(r["steady_events_per_s"] / base) for _, r in runs) + " the baseline", ""]]
    spike = d.get("spike")
    if spike:
        rows += [["spike start → the policy decides on more workers; → room for the bigger group",
                  f"{secs(spike.get('decision_up_s'))}; {secs(spike.get('reaction_up_s'))}", "", ""],
                 ["spike start → backlog drained; then → the policy asks for fewer",
                  f"{secs(spike.get('backlog_drained_s'))}; {secs(spike.get('reaction_down_s'))}", "", ""]]
        for r in spike["resizes"]:
            s, up = r.get("decision_to_first_step_s"), r["to"] > r["from"]
            rows.append([f"resize {r['from']} → {r['to']}: decision → the new group's first step", secs(s),
                         f"≤ {RESIZE_BAR_S:g} s (issue 12)" if up else "no bar for a scale-down",
                         met(None if s is None else s <= RESIZE_BAR_S) if up else ""])
        pause = median(spike["pauses_s"])
        rows.append([f"resize pause, median of {len(spike['pauses_s'])}", secs(pause), f"≤ {PAUSE_BAR_S:g} s",
                     met(None if pause is None else pause <= PAUSE_BAR_S)])
    lines = table(["measure", "value", "ratio or bar", ""], rows, "lrll")
    foot = machine(t.get("machine") or d["machine"], "Throughput rows measured")
    if spike:
        foot += " " + machine(d["machine"], "Spike measured")
    return "\n".join([*lines, "", foot])


def freshness(d: dict) -> str:
    m = d["median"]
    rows = [["freshness: produced → the served model has learned it", secs(m["freshness_p50_s"], ".2f"),
             secs(m["freshness_p99_s"], ".2f"), f"p99 ≤ {FRESHNESS_P99_BAR_S:g} s",
             met(m["freshness_p99_s"] <= FRESHNESS_P99_BAR_S)],
            ["scoring latency, steady", num(m["steady_p50_ms"], ".1f", " ms"), num(m["steady_p99_ms"], ".1f", " ms"),
             "", ""],
            ["scoring latency, ≤ 1 s after a swap", num(m["swap_p50_ms"], ".1f", " ms"),
             num(m["swap_p99_ms"], ".1f", " ms"),
             f"p99 ≤ {SWAP_P99_BAR:g}× steady (here {ratio(m['swap_p99_vs_steady'])})",
             met(m["swap_p99_vs_steady"] <= SWAP_P99_BAR)]]
    lines = table(["measure (median of runs)", "p50", "p99", "target", ""], rows, "lrrll")
    lines += ["", f"{len(d['runs'])} runs at {d['rate']:,} events/s, checkpoints every {d['checkpoint_every_s']:g} s, "
              f"{d['replicas']} replicas; failed requests {m['failed_requests']:,} of "
              f"{sum(r['requests'] for r in d['runs']):,}; versions only moved forward: "
              f"{'yes' if m['versions_monotonic'] else '**no**'}."]
    return with_machine(lines, d)


def join(d: dict) -> str:
    rows = [["bytes per pending event (tracemalloc)", num(d["bytes_per_pending_event_traced"]),
             f"≤ {d['target_bytes']}", met(d["bytes_per_pending_event_traced"] <= d["target_bytes"])],
            ["the cap held (every evicted event counted)", "yes" if d["cap_enforced"] else "no", "",
             met(d["cap_enforced"])],
            ["µs per event: hash its id / add it / join its label",
             f"{d['hash_us_per_event']:.2f} / {d['add_us_per_event']:.2f} / {d['label_join_us_per_label']:.2f}", "",
             ""],
            ["µs per event, the join in all", num(d["join_us_per_event"], ".2f"), "", ""]]
    for case, c in (d.get("checkpoints_at_cap") or {}).items():
        share = case.removeprefix("label_share_")
        what = "labels that never come" if float(share) == 0 else f"{float(share):.0%} of those waiting labelled"
        whole, delta = c["whole"], c["delta"]
        rows.append([f"a checkpoint at the cap, {what}: new rows + bits / the whole state, handed to rank 0; "
                     "written (write, hash, fsync)",
                     f"{delta['handed_bytes'] / 1e6:.1f} / {whole['handed_bytes'] / 1e6:.1f} MB; "
                     f"{delta['write_s'] * 1e3:.0f} / {whole['write_s'] * 1e3:.0f} ms", "", ""])
    lines = table(["measure (median of runs)", "value", "target", ""], rows, "lrll")
    lines += ["", f"{d['pending']:,} events pending, {d['n_features']} features, {len(d['runs'])} runs."]
    return with_machine(lines, d)


def drift_cost(d: dict) -> str:
    rows = [[labels, num(d[f"{labels}-on_events_per_s"]), num(d[f"{labels}-off_events_per_s"]),
             ratio(d[f"ratio_drift_on_vs_off_{labels}"])] for labels in ("inline", "delayed")]
    rows.append(["delayed / inline", ratio(d["ratio_delayed_vs_inline_drift_on"]),
                 ratio(d["ratio_delayed_vs_inline_drift_off"]), ""])
    lines = table(["labels", "detectors on (default), events/s", "off, events/s", "on / off"], rows)
    runs = len(next(iter(d["runs"].values())))
    lines += ["", f"{d['events']:,} events, {d['workers']} worker, medians of {runs} runs."]
    return with_machine(lines, d)


def cpu_roles(d: dict) -> str:
    modes = ("direct", "ray-data")
    per_1k = d["steady_cpu_ms_per_1k_events_by_role"]
    r = d["ratio_ray_data_vs_direct"]
    roles = ["trainers (Ray Train workers)", "Ray Data read lanes (read + decode)"]
    rows = [["learned events/s (steady)", *(num(d["steady_events_per_s"][m]) for m in modes), ""],
            ["Ray Data / direct (issue 13: ≥ 0.8×)", "", ratio(r), met(r >= INGEST_BARS["ray_data_vs_direct"])],
            ["cores busy, steady part", *(num(d["steady_cores_busy"][m], ".2f") for m in modes), ""],
            ["**CPU ms per 1,000 events, all**", *(f"**{sum(per_1k[m].values()):.1f}**" for m in modes), ""],
            *([f"CPU ms per 1,000 events: {role}", *(num(per_1k[m].get(role, 0.0), ".1f") for m in modes), ""]
              for role in roles)]
    lines = table(["2 workers (medians)", "direct", "Ray Data", ""], rows, "lrrl")
    lines += ["", f"{d['events']:,} events, {len(d['runs']['direct'])} runs of each mode."]
    return with_machine(lines, d)


def cpu_labels(d: dict) -> str:
    names = list(d["steady_events_per_s"])
    bar = INGEST_BARS["delayed_vs_inline"]

    def against_inline(name: str) -> str:
        if not name.startswith("delayed-"):
            return ""
        r = d.get(f"ratio_delayed_vs_inline_{name.removeprefix('delayed-')}")
        return "–" if r is None else f"{ratio(r)}, {met(r >= bar)}"

    rows = [["learned events/s (steady)", *(num(d["steady_events_per_s"][n]) for n in names)],
            [f"delayed / inline (issue 16: ≥ {bar}×)", *(against_inline(n) for n in names)],
            ["cores busy", *(num(d["steady_cores_busy"][n], ".2f") for n in names)],
            ["CPU ms per 1,000 events, all", *(num(d["steady_cpu_ms_per_1k_events"][n], ".1f") for n in names)],
            [f"ceiling: all {d['cores']} cores busy, events/s",
             *(num(d["ceiling_events_per_s_all_cores_busy"][n]) for n in names)]]
    lines = table(["medians", *names], rows)
    lines += ["", f"{d['events']:,} events, direct ingest, {len(d['runs'][names[0]])} runs of each."]
    return with_machine(lines, d)


def cpu_workers(d: dict) -> str:
    bar, auc_bar = INGEST_BARS["cpu_two_vs_one"], INGEST_BARS["auc_vs_step"]
    cpu, vs_ddp = d["cpu_ratio_vs_1_worker"], d["auc_vs_sync_step"]

    def against_one(name: str) -> str:
        return f"{ratio(cpu[name])}, {met(cpu[name] <= bar)}" if name == "2-workers" else ratio(cpu[name])

    def against_ddp(name: str) -> str:
        delta = vs_ddp.get(name)
        return "" if delta is None else f"{delta:+.4f}, {met(delta >= -auc_bar)}"

    rows = [[f"`{name}`", num(d["steady_events_per_s"][name]), num(d["steady_cores_busy"][name], ".2f"),
             num(d["steady_cpu_ms_per_1k_events"][name], ".1f"), against_one(name),
             num(d["auc_mean"][name], ".4f"), num(d["logloss_mean"][name], ".4f"), against_ddp(name)]
            for name in d["steady_events_per_s"]]
    lines = table(["medians", "learned events/s (steady)", "cores busy", "CPU ms per 1,000 events",
                   f"CPU per event ÷ 1 worker (issue 48: 2 workers ≤ {bar}×)", "prequential AUC", "log loss",
                   f"AUC − DDP's, same workers (issue 48: within {auc_bar})"], rows)
    lines += ["", f"{d['events']:,} events, direct ingest where the name says nothing else, "
                  f"{len(d['runs']['1-worker'])} runs of each."]
    return with_machine(lines, d)


def group_start(d: dict) -> str:
    s = d["summary"]
    ws = sorted(s, key=int)
    bar = INGEST_BARS["first_step_s"]
    rows = [["first step after `train()`", *(secs(s[w]["first_step_s"]) for w in ws),
             f"≤ {bar:g} s (issue 12), under the sampler: "
             f"{met(all(s[w]['first_step_s'] <= bar for w in ws))}"],
            ["CPU seconds before the first step, all processes", *(secs(s[w]["cpu_s"]) for w in ws), ""],
            [f"cores busy of {d['cores']}", *(num(s[w]["cores_busy"], ".2f") for w in ws), ""],
            [f"the least this CPU could take on {d['cores']} cores", *(secs(s[w]["least_wall_s"]) for w in ws), ""]]
    lines = table(["medians", *(f"{w} worker{'s' if int(w) > 1 else ''}" for w in ws), "bar"], rows,
                  "l" + "r" * len(ws) + "l")
    lines += ["", f"{d['events']:,} events, {len(d['runs'][ws[0]])} runs of each."]
    return with_machine(lines, d)


def gpu(d: dict) -> str:
    # Keyed per contender as load/bench/gpu.py writes them, or grouped as the transcribed JSON has them.
    med = d.get("medians_events_per_s") or {name: d[f"{name}_events_per_s"] for name in d["runs"]}
    ratios = d.get("ratios_vs_baseline_cpu") or {name: d[f"ratio_{name}_vs_baseline_cpu"] for name in d["runs"]}
    first = d.get("first_step_s_median") or {name: d.get(f"first_step_s_{name}") for name in d["runs"]}
    rows = []
    for name, runs in d["runs"].items():
        peak = max((r.get("gpu_util_peak_pct") or 0) for r in runs)
        rows.append([f"`{name}`", num(med[name]), ratio(ratios[name]), str(len(runs)), secs(first.get(name)),
                     f"{peak} %"])
    lines = table(["contender", "learned events/s (median)", "ratio to the CPU baseline", "runs",
                   "first step (median)", "GPU busy, peak"], rows)
    scaling = [f"{k.removeprefix('ratio_').removesuffix('_vs_gloo_1').replace('_', '-')} {ratio(v)}"
               for k, v in d.items() if k.startswith("ratio_gloo_") and k.endswith("_vs_gloo_1") and v is not None
               and k != "ratio_gloo_1_vs_gloo_1"]
    if scaling:
        lines += ["", f"Against 1 gloo worker: {', '.join(scaling)} (issue 48: gloo-4 ≥ 3.20×); Ray Data against "
                  f"direct, 4 workers: {ratio(d.get('ratio_ray_data_4_vs_gloo_4'))} (≥ 1.00×)."]
    if lanes := d.get("more_read_lanes"):
        n, against = lanes["read_lanes"], (f"{ratio(lanes['ratio_vs_gloo_4'])} gloo-4 in the same call"
                                           if lanes.get("ratio_vs_gloo_4") else
                                           f"{ratio(lanes['ratio_vs_baseline_cpu'])} its own CPU baseline")
        lines[-1] += (f" With {n} read lanes (`--read-lanes`, a later call, {lanes['rounds_done']} "
                      f"run{'s' if lanes['rounds_done'] > 1 else ''}): "
                      f"{num(lanes[f'ray-data-4x{n}_events_per_s'])} events/s, {against}.")
    if gpu_trainer := d.get("gpu_trainer"):  # what `--ingest auto` chooses for GPU trainers
        lines += ["", f"Under one NCCL worker (`--use-gpu`, {gpu_trainer['events']:,} events, "
                      f"{gpu_trainer['rounds_done']} round{'s' if gpu_trainer['rounds_done'] > 1 else ''}, "
                      f"after the rounds above): direct "
                      f"{num(gpu_trainer['nccl-1_events_per_s'])} events/s, Ray Data "
                      f"{num(gpu_trainer['ray-data-nccl-1_events_per_s'])}: "
                      f"{ratio(gpu_trainer['ratio_ray_data_nccl_1_vs_nccl_1'])}."]
    if prev := d.get("previous_lease"):
        when = prev["machine"]["date"].split()[0]
        lines += ["", f"Before ({when} lease, {prev['events']:,} events, {prev['note']}): "
                      f"gloo-4 {ratio(prev['ratio_gloo_4_vs_gloo_1'])} gloo-1, Ray Data against direct at 4 workers "
                      f"{ratio(prev['ratio_ray_data_4_vs_gloo_4'])}."]
    # A lease too short for every contender skips the CUDA ones and the kill: the earlier lease's stand.
    earlier = d.get("earlier_lease") or {}
    source = d if d.get("killed") else earlier
    killed = source.get("killed") or {}
    audit = killed.get("audit") or {}
    nccl = d.get("ratio_nccl_1_vs_gloo_1") or earlier.get("ratio_nccl_1_vs_gloo_1")
    when = "" if source is d else f" (the {earlier['machine']['date'].split()[0]} lease)"
    lines += ["", f"NCCL / gloo, 1 worker each{'' if d.get('ratio_nccl_1_vs_gloo_1') else when}: {ratio(nccl)}. "
              f"Killed and restored on the GPU{when} (`{killed.get('fault', '–')}`): {audit.get('learned', 0):,} of "
              f"{audit.get('produced', 0):,} learned; exactly-once audit: {passed(audit.get('passed'))}."]
    if d.get("gpu"):
        lines[-1] += f" GPU: {d['gpu']}."
    if d.get("rounds_done") is not None:
        lines[-1] += f" Rounds done: {d['rounds_done']} of {d['rounds_asked']}."
    if d.get("source"):
        lines[-1] += " Source: " + d["source"].split(";")[0].rstrip(".") + "."
    return with_machine(lines, d)


def warm_pool(d: dict) -> str:
    parts = ("waiting_for_room", "until_started", "group_start", "old_group_to_stop", "pause")
    rows = []
    for mode, m in d["medians"].items():
        s = m["decision_to_first_step_s"]
        each = ", ".join(f"{r['decision_to_first_step_s']:.1f}" for r in d["runs"][mode])
        rows.append([mode, f"{secs(s)} ({each})", *(num(m[p], ".1f") for p in parts), f"{m['prestarted']:.0f}",
                     met(s <= RESIZE_BAR_S)])
    lines = table(["1 → 3 workers (medians, s)", "decision → first step (runs)",
                   *(p.replace("_", " ") for p in parts), "prestarted", f"≤ {RESIZE_BAR_S:g} s (issue 12)"], rows,
                  "l" + "r" * (len(parts) + 2) + "l")
    lines += ["", f"Warm pool / none: {ratio(d['decision_to_first_step_ratio'])}; {d['rounds']} rounds, a spike "
              f"of {d['peak_events_per_s']:,} events/s."]
    return with_machine(lines, d)


def drift(d: dict) -> str:
    runs = [r["figures"] for r in d["runs"]]
    s = d["median_alarm_after_drift_s"]
    alarm_bar = f"≤ {DRIFT_BAR_S:g} s (issue 16): {met(None if s is None else s <= DRIFT_BAR_S)}"

    def each(key: str, fmt: Callable[[Any], str]) -> str:
        return " / ".join(fmt(r[key]) for r in runs)

    def auc(v: float | None) -> str:
        return num(v, ".3f")

    rows = [[f"detected in {d['runs_detected']} of {len(runs)} runs: drift → the first alarm", secs(s),
             each("alarm_after_drift_s", secs), alarm_bar],
            ["alarms before the drift", str(d["alarms_before_drift"]), each("alarms_before_drift", str), ""],
            ["served AUC before the drift", auc(d["median_served_auc_before"]), each("served_auc_before", auc), ""],
            ["served AUC at the dip; drift → the dip",
             f"{auc(d['median_served_auc_dip'])}; {secs(d['median_dip_after_drift_s'])}",
             " / ".join(f"{auc(r['served_auc_dip'])}; {secs(r['dip_after_drift_s'])}" for r in runs), ""],
            ["drift → served AUC recovered", secs(d["median_recovered_after_drift_s"]),
             each("recovered_after_drift_s", secs), ""]]
    lines = table(["measure", "median", "per run", "bar"], rows, "lrrl")
    lines += ["", f"{d['rate']:,} events/s, the fraud pattern changed after {d['before_s']} s of events."]
    return with_machine(lines, d)


def gate(d: dict) -> str:
    f, runs = d["figures"], d["runs"]

    def each(kind: str, key: str) -> str:
        return " / ".join(pct(r[kind][key]) for r in runs)

    rows = [[f"good candidates held ({runs[0]['good']['candidates']} a run)", pct(f["false_rejections"]),
             each("good", "held_share"), f"≤ {GATE_GOOD_HELD_MAX * 100:g} %",
             met(f["false_rejections"] <= GATE_GOOD_HELD_MAX), pct(f["old_gate_false_rejections"])],
            [f"worse candidates held ({runs[0]['worse']['candidates']} a run)", pct(f["true_rejections"]),
             each("worse", "held_share"), f"≥ {GATE_WORSE_HELD_MIN * 100:g} %",
             met(f["true_rejections"] >= GATE_WORSE_HELD_MIN), pct(f["old_gate_true_rejections"])],
            ["a judgement, ms", num(f["judge_ms"], ".1f"), " / ".join(num(r["judge_ms_median"], ".1f") for r in runs),
             "", "", ""]]
    lines = table(["paired gate (median of runs)", "value", "per run", "target", "", "the old gate"], rows,
                  "lrrllr")
    a = d["args"]
    lines += ["", f"{a['runs']} runs of {a['candidates']} candidates, a checkpoint every {a['events']:,} events."]
    return with_machine(lines, d)


def gate_feedback(d: dict) -> str:
    rows = []
    for name, regime in d["regimes"].items():
        f, runs = regime["figures"], regime["runs"]
        late = f"{name}: {regime['median_delay'] // d['args']['events']} intervals"
        for kind in ("matured", "fake negatives"):
            label = "matured labels (now)" if kind == "matured" else "fake negatives (before)"
            for group, bar, ok in (("good", f"≤ {GATE_GOOD_HELD_MAX * 100:g} %", lambda v: v <= GATE_GOOD_HELD_MAX),
                                   ("worse", f"≥ {GATE_WORSE_HELD_MIN * 100:g} %", lambda v: v >= GATE_WORSE_HELD_MIN)):
                share = f[kind][f"{group}_held_of_judged"]
                rows.append([late, f"{label}: {group} held", pct(share),
                             " / ".join(pct(r[kind][group]["held_of_judged"]) for r in runs), bar, met(ok(share)),
                             pct(f[kind][f"{group}_held_share"]), pct(f[kind][f"{group}_judged_share"])])
    lines = table(["reports late (median)", "evidence: candidates", "held of judged (median)", "per run", "target",
                   "", "held of all", "judged"], rows, "llrrllrr")
    far = d["regimes"]["far"]
    lines += ["", f"{d['args']['runs']} runs a regime, a checkpoint every {d['args']['events']:,} events "
                  f"({far['candidates']} candidates `far`, {d['regimes']['near']['candidates']} `near`); the good "
                  f"lineage's held-out AUC {num(far['figures']['held_out_auc'], '.4f')} `far` (median)."]
    return with_machine(lines, d)


def delayed_feedback(d: dict) -> str:
    med, gap, t = d["medians"], d["auc_gap_to_oracle"], d["targets"]
    to_bound = d.get("auc_gap_to_bound", {})
    low, high = t["calibration"]
    rows = [[f"`{c}`", num(m["auc"], ".4f"), num(gap.get(c), "+.4f"), num(to_bound.get(c), "+.4f"),
             num(m["auc_second_half"], ".4f"),
             num(m["logloss"], ".4f"), num(m["calibration"], ".2f"), met(d["met"][c]) if c in d["met"] else ""]
            for c, m in med.items()]
    lines = table(["method", "AUC", "gap to the oracle", "gap to the bound", "AUC, second half", "log loss",
                   "calibration",
                   f"AUC within {t['auc_within_of_oracle']:g} of the oracle, calibration {low:g}-{high:g}"],
                  rows, "lrrrrrrl")
    lines += ["", f"{d['events']:,} events ({d['days']:g} simulated days), reports after a {d['delay']} delay of "
              f"median {d['median_delay_days']:g} days, the window {d['window_s']:,.0f} s; "
              f"medians of {d['runs']} runs."]
    return with_machine(lines, d)


def feedback_ingest(d: dict) -> str:
    per = d["steady_events_per_s"]
    rows = [[f"`{name}`", num(d["medians"][name]), " / ".join(num(v) for v in per[name]),
             ratio(d["medians"][name] / d["medians"]["inline"]),
             f"≥ {d['bar']:g}× {met(d['ratio'] >= d['bar'])}" if name == "feedback" else ""]
            for name in ("inline", "feedback")]
    lines = table(["labels", "learned events/s (median, steady)", "per run", "ratio to inline", "bar"], rows)
    lines += ["", f"{d['events']:,} events, {d['reports']:,} chargebacks, {d['workers']} worker(s); "
              f"medians of {d['runs']} runs."]
    return with_machine(lines, d)


def feedback_delay(d: dict) -> str:
    longest = f"{d['delays_days'][-1]}d"
    rows = [[f"`{name}`", num(m["events_per_s"]), ratio(d["vs_inline"][name]),
             num(m["rss_peak_mib"], ",.0f", " MiB"), num(m["rss_median_mib"], ",.0f", " MiB"),
             num(m.get("state_bytes", m["checkpoint_bytes"]), ",.0f"),
             num(m["evidence_bytes"], ",.0f") if "evidence_bytes" in m else "",
             num(m["join_npz_bytes"], ",.0f") if name != "inline" else "",
             num(m["rows_disk_bytes"] / 2**20, ",.0f", " MiB") if m.get("rows_disk_bytes") else "",
             num(m["reports_applied"]) if name != "inline" else ""]
            for name, m in d["medians"].items()]
    lines = table(["labels", "learned events/s", "÷ inline", "worker RSS, peak", "worker RSS, median",
                   "checkpoint bytes, but the gate's evidence", "evidence.npz bytes", "join.npz bytes",
                   "row store on disk", "chargebacks applied"], rows)
    lines += ["", f"{d['events']:,} events ({d['days']:g} simulated days), 1 worker; medians of {d['runs']} runs. "
              f"RSS at {longest} ÷ at {d['delays_days'][0]}d: peak {ratio(d['rss_peak_ratio'])} (within "
              f"{d['bar']:.0%}: {met(d['met'])}), median {ratio(d.get('rss_median_ratio'))} "
              f"({met(d.get('met_on_median'))}); delayed feedback (the defaults) ≥ {d['ingest_bar']:g}× inline: "
              f"{met(d['ingest_met'])}."]
    return with_machine(lines, d)


def ingest_rounds(d: dict) -> str:
    rows = [[f"`{name}`", str(d["runs_completed"][name]), num(c["steady_events_per_s"]),
             f"{min(c['steady_runs']):,.0f}–{max(c['steady_runs']):,.0f}"] for name, c in d["contenders"].items()]
    lines = table(["contender", "runs completed (no lost window)", "steady events/s (median)", "range"], rows)
    lines += ["", f"{d['rounds']} rounds of {d['events']:,} events, one Ray session."]
    return with_machine(lines, d)


def pacing(d: dict) -> str:
    rows = [[num(float(rate)), num(by["default"]["events_per_s"]), num(by["default"]["cores"], ".3f"),
             num(by["per event, 1 ms floor"]["cores"], ".3f"), num(by["before"]["cores"], ".3f"),
             ratio(by["ratio_before_vs_default"])]
            for rate, by in d["figures"].items()]
    lines = table(["events/s asked", "events/s sent", "cores: default (slices, 1 ms floor)",
                   "per event, 1 ms floor", "before (per event, no floor)", "before ÷ default"], rows, "rrrrrr")
    rounds = len(next(iter(next(iter(d["runs"].values())).values())))
    lines += ["", f"Medians of {rounds} alternating rounds of {d['seconds']:g} s each."]
    return with_machine(lines, d, d.get("loadavg_1m_before"))


RENDERERS: dict[str, Callable[[dict], str]] = {
    "cpu_labels": cpu_labels, "cpu_roles": cpu_roles, "delayed_feedback": delayed_feedback, "drift": drift,
    "feedback_delay": feedback_delay, "feedback_ingest": feedback_ingest, "cpu_workers": cpu_workers,
    "ingest_rounds": ingest_rounds, "pacing": pacing,
    "drift_cost": drift_cost, "faults": faults, "freshness": freshness, "gate": gate, "gate_feedback": gate_feedback,
    "generator": generator,
    "gpu": gpu, "group_start": group_start, "ingest": ingest, "join": join, "kafka_clients": kafka_clients,
    "scaling": scaling, "scoring": scoring, "soak": soak, "warm_pool": warm_pool,
}


def renderer(name: str) -> Callable[[dict], str] | None:
    """`freshness_ckpt1s` (freshness at a cadence that is not the default) renders as freshness does."""
    return RENDERERS.get(name) or (RENDERERS["freshness"] if name.startswith("freshness_ckpt") else None)


def start_marker(name: str) -> str:
    return (f"<!-- table: {name} (generated by python -m load.bench.tables from docs/bench/{name}.json; "
            "do not edit) -->")


def render(name: str, bench_dir: Path = BENCH_DIR) -> str:
    """The block for docs/bench/<name>.json, markers included."""
    fn = renderer(name)
    if fn is None:
        raise KeyError(f"no table renderer for {name!r}")
    data = json.loads((bench_dir / f"{name}.json").read_text())
    return f"{start_marker(name)}\n{fn(data).rstrip()}\n<!-- /table: {name} -->"


def section_table(section: str, bench_dir: Path = BENCH_DIR) -> str | None:
    """The block that heads a benchmark's BENCHMARKS.md section, or None where there is no JSON or renderer."""
    name = SECTION_JSON.get(section, section)
    if renderer(name) is None or not (bench_dir / f"{name}.json").exists():
        return None
    return render(name, bench_dir)


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def refresh(text: str, bench_dir: Path = BENCH_DIR) -> tuple[str, list[str], list[str]]:
    """(the text with every block re-rendered, names of blocks that changed, names whose JSON is missing)."""
    changed, missing = [], []

    def sub(m: re.Match) -> str:
        name = m["name"]
        if renderer(name) is None or not (bench_dir / f"{name}.json").exists():
            missing.append(name)
            return m[0]
        new = render(name, bench_dir)
        if new != m[0]:
            changed.append(name)
        return new

    return BLOCK.sub(sub, text), changed, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    parser.add_argument("--path", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    text = args.path.read_text()
    new, changed, missing = refresh(text)
    present = {m["name"] for m in blocks(text)}
    unplaced = sorted(p.stem for p in BENCH_DIR.glob("*.json") if p.stem not in present)
    for name in missing:
        print(f"table {name}: no docs/bench/{name}.json or no renderer", file=sys.stderr)
    for name in unplaced:
        print(f"docs/bench/{name}.json: no table block in {args.path.name}", file=sys.stderr)
    if args.check:
        for name in changed:
            print(f"table {name}: differs from docs/bench/{name}.json (run python -m load.bench.tables)",
                  file=sys.stderr)
        return 1 if changed or missing or unplaced else 0
    if new != text:
        args.path.write_text(new)
    print(f"{len(blocks(text))} table blocks; rewritten: {', '.join(changed) or 'none'}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
