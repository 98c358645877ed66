"""Where the two cores go: CPU seconds by process role while `--ingest direct` and
`--ingest ray-data` each learn the same events with 2 workers (the default count); with
`--labels`, while the same events are learned with their label inline and joined from
`<topic>.labels` (issue 16), with 1 and 2 workers.

    python -m load.bench.cpu_roles [--events 600000] [--runs 3] [--labels | --workers]

Issue 13's bar is Ray Data at 0.8x the direct path's learned rate; on two cores every CPU
second Ray Data's own machinery spends (its read lanes beside the trainers, the split
coordinator's scheduling loop, the object store, the raylet) is a second the trainers lose.
A sampler thread reads every process's CPU time (psutil) every 0.25 s and charges each delta
to the role its title names at that moment (Ray renames a pooled worker for each task or actor
it runs). Runs alternate the two modes, as the ingest benchmark does. Reported: each role's CPU
per 1,000 events learned in the steady part (first step to last checkpoint), and its CPU seconds
over the whole run (start-up and teardown included), medians of the runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import psutil

from load.bench.common import machine_line, write_json, write_section
from load.bench.ingest import DELAYED, alternating_rounds, pipeline_rate

SAMPLE_S = 0.25
# Ray's process titles ("ray::<actor or task>") and the rest of the machine, first match wins.
ROLES = (
    ("trainers (Ray Train workers)", ("ray::RayTrainWorker", "ray::_RayTrainWorker")),
    ("Ray Data read lanes (read + decode)", ("ray::ReadKafkaWindows", "ray::Read", "ray::MapBatches")),
    ("Ray Data split coordinator", ("ray::SplitCoordinator",)),
    ("window feed", ("ray::WindowFeed",)),
    ("Ray Train controller", ("ray::TrainController",)),
    ("scale controller", ("ray::ScaleController",)),
    ("raylet + object store", ("raylet",)),
    ("GCS", ("gcs_server",)),
    ("Kafka broker", ("kafka.Kafka", "java")),
    ("Ray's own services (dashboard, agents, autoscaling)", ("dashboard", "agent", "log_monitor", "monitor.py",
                                                              "runtime_env", "autoscalingcoordinator")),
    ("idle Ray workers", ("ray::IDLE",)),
)


def role_of(title: str) -> str:
    title = title.lower()
    for role, marks in ROLES:
        if any(mark.lower() in title for mark in marks):
            return role
    return "this driver" if title.startswith(f"pid {os.getpid()}") else "other"


class CpuByRole:
    """Charges every process's CPU time delta to its current role, every SAMPLE_S, until stopped."""

    def __init__(self):
        self.samples: list[tuple[float, dict[str, float]]] = []  # (monotonic time, CPU s by role since the last)
        self.other: dict[str, float] = {}  # what "other" was, by title: a role this table is missing
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuByRole:
        self._sample(charge=False)
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(charge=True)
        self.wall_s = time.monotonic() - self.started

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample(charge=True)

    @property
    def seconds(self) -> dict[str, float]:
        """CPU seconds by role over the whole run."""
        return self.between(float("-inf"), float("inf"))

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds by role in the samples taken from t0 to t1 (monotonic)."""
        out: dict[str, float] = {}
        for t, by_role in self.samples:
            if t0 < t <= t1:
                for role, s in by_role.items():
                    out[role] = out.get(role, 0.0) + s
        return out

    def _sample(self, charge: bool) -> None:
        now, by_role = time.monotonic(), {}
        for proc in psutil.process_iter(["pid", "cmdline", "name", "cpu_times"]):
            info = proc.info
            times = info["cpu_times"]
            if times is None:
                continue
            used = times.user + times.system
            before = self._last.get(info["pid"])
            self._last[info["pid"]] = used
            if not charge:
                continue
            delta = used - before if before is not None else used  # a process born during the run
            if delta <= 0:
                continue
            me = f"pid {info['pid']} " if info["pid"] == os.getpid() else ""
            title = me + " ".join(info["cmdline"] or [info["name"] or ""])
            role = role_of(title)
            by_role[role] = by_role.get(role, 0.0) + delta
            if role == "other":
                self.other[title[:100]] = self.other.get(title[:100], 0.0) + delta
        if charge:
            self.samples.append((now, by_role))


def profiled_run(bootstrap: str, n: int, home, ingest: str, workers: int = 2, **kwargs) -> dict:
    """One run, its CPU by role over the whole run and over its steady part alone (from the first
    step to the last checkpoint: start-up and teardown are most of a 200k-event run's wall time)."""
    with CpuByRole() as cpu:
        run = pipeline_rate(bootstrap, n, workers, home, ingest=ingest, **kwargs)
    steady_from = cpu.started + run["first_step_s"]
    steady = cpu.between(steady_from, steady_from + run["steady_s"])
    steady_events = run["steady_events_per_s"] * run["steady_s"]
    startup = cpu.between(cpu.started, steady_from)
    total = sum(cpu.seconds.values())
    return {"ingest": ingest, "steady_events_per_s": run["steady_events_per_s"], "wall_s": cpu.wall_s,
            "auc_mean": run["auc_mean"], "logloss_mean": run["logloss_mean"],
            "first_window_events": run["startup_s"]["first_window_events"],
            "steady_s": run["steady_s"], "first_step_s": run["first_step_s"],
            "cpu_s": total, "cores_busy": total / cpu.wall_s, "cpu_s_by_role": cpu.seconds,
            "steady_cores_busy": sum(steady.values()) / run["steady_s"], "steady_cpu_s_by_role": steady,
            "startup_cores_busy": sum(startup.values()) / run["first_step_s"], "startup_cpu_s_by_role": startup,
            "steady_cpu_ms_per_1k_events_by_role": {role: 1e6 * s / steady_events for role, s in steady.items()},
            "other_by_title": dict(sorted(cpu.other.items(), key=lambda kv: -kv[1])[:8])}


def main() -> None:
    parser = argparse.ArgumentParser()
    # More than the ingest benchmark's 200k: its steady part is ~3 s of a ~35 s run.
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--labels", action="store_true", help="inline against joined labels, 1 and 2 workers")
    parser.add_argument("--workers", action="store_true", help="1, 2 and 4 workers, both sync modes (issue 48)")
    args = parser.parse_args()
    if args.workers:
        report_workers(args.events, alternating_rounds(
            args.events, args.runs, list(WORKER_CONTENDERS),
            run_one=lambda bootstrap, n, home, name: profiled_run(bootstrap, n, home,
                                                                    **{"ingest": "direct", **WORKER_CONTENDERS[name]})))
        return
    if args.labels:
        report_labels(args.events, alternating_rounds(
            args.events, args.runs, list(LABEL_CONTENDERS), delayed=True,
            run_one=lambda bootstrap, n, home, name: profiled_run(bootstrap, n, home, "direct",
                                                                    **LABEL_CONTENDERS[name])))
        return
    runs = alternating_rounds(args.events, args.runs, ["direct", "ray-data"], profiled_run)
    report(args.events, runs)


JOINED = {"topic": DELAYED, "pipeline": "fraud_delayed"}
LABEL_CONTENDERS = {"inline-1": {"workers": 1}, "delayed-1": {"workers": 1, **JOINED},
                    "inline-2": {"workers": 2}, "delayed-2": {"workers": 2, **JOINED}}


WORKER_CONTENDERS = {"1-worker": {"workers": 1}, "2-workers": {"workers": 2},
                     "2-workers-sync-step": {"workers": 2, "sync": "step"},
                     # 4 ranks on 2 cores: their rate says little here, their CPU per event what a worker
                     # costs where each has its cores. The same window as 2 workers' (8,192: window_events
                     # 4,096 at 4 ranks, TrainConfig.window_for) is what 4 workers had before half a window a
                     # rank; DDP is the learning baseline at the same size.
                     "4-workers": {"workers": 4}, "4-workers-window-8192": {"workers": 4, "window_events": 4096},
                     "4-workers-sync-step": {"workers": 4, "sync": "step"},
                     # Ray Data's cost is per window and block (DECISIONS §1): at both windows too.
                     "4-workers-ray-data": {"workers": 4, "ingest": "ray-data"},
                     "4-workers-ray-data-window-8192": {"workers": 4, "ingest": "ray-data", "window_events": 4096}}


def contender_table(runs: dict[str, list[dict]]) -> tuple[dict, list[str]]:
    """Per contender: the learned rate, cores busy and each role's CPU per 1,000 events learned
    (steady part, medians), and the table's rows for BENCHMARKS.md."""
    cores = os.cpu_count() or 1
    roles = sorted({role for rs in runs.values() for r in rs for role in r["steady_cpu_ms_per_1k_events_by_role"]})
    per_1k = {name: {role: statistics.median(r["steady_cpu_ms_per_1k_events_by_role"].get(role, 0.0) for r in rs)
                     for role in roles} for name, rs in runs.items()}
    rate = {name: statistics.median(r["steady_events_per_s"] for r in rs) for name, rs in runs.items()}
    busy = {name: statistics.median(r["steady_cores_busy"] for r in rs) for name, rs in runs.items()}
    total = {name: sum(v.values()) for name, v in per_1k.items()}
    # Every core busy, each event costing what it cost: the most a run could learn here.
    ceiling = {name: 1e6 * cores / total[name] for name in runs}
    figures = {"machine": machine_line(), "cores": cores, "steady_events_per_s": rate, "steady_cores_busy": busy,
               "steady_cpu_ms_per_1k_events": total, "ceiling_events_per_s_all_cores_busy": ceiling,
               "steady_cpu_ms_per_1k_events_by_role": per_1k, "runs": runs}
    order = sorted(roles, key=lambda r: -sum(per_1k[name][r] for name in runs))
    names = list(runs)
    return figures, [
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        "| learned, events/s | " + " | ".join(f"{rate[name]:,.0f}" for name in names) + " |",
        "| cores busy | " + " | ".join(f"{busy[name]:.2f}" for name in names) + " |",
        "| **CPU ms per 1,000 events, all** | " + " | ".join(f"**{total[name]:.1f}**" for name in names) + " |",
        *[f"| {role} | " + " | ".join(f"{per_1k[name][role]:.1f}" for name in names) + " |"
          for role in order if any(per_1k[name][role] >= 0.05 for name in names)],
        f"| ceiling: all {cores} cores busy, events/s | " + " | ".join(f"{ceiling[name]:,.0f}" for name in names)
        + " |",
    ]


def report_labels(n: int, runs: dict[str, list[dict]]) -> None:
    """Per worker count: each role's CPU per 1,000 events learned, inline against joined, and what
    the joined rate could be at most on this machine's cores if every one of them were busy."""
    figures, table = contender_table(runs)
    rate, ceiling = figures["steady_events_per_s"], figures["ceiling_events_per_s_all_cores_busy"]
    figures = {"benchmark": "cpu_labels", "events": n, **figures,
               **{f"ratio_delayed_vs_inline_{w}": rate[f"delayed-{w}"] / rate[f"inline-{w}"] for w in (1, 2)},
               **{f"ceiling_ratio_delayed_vs_inline_{w}": ceiling[f"delayed-{w}"] / rate[f"inline-{w}"]
                  for w in (1, 2)}}
    write_json("cpu_labels", figures)
    write_section("cpu_labels", "Where the cores go with delayed labels: inline against joined", "\n".join([
        f"{n:,} fraud events learned with their label inline (`fraud`) and joined from `<topic>.labels` "
        f"0-1 s later (`fraud_delayed`), direct ingest, default settings, every contender once per round, "
        f"medians of {len(runs['inline-1'])} runs. CPU sampled as in the section above; steady part only. "
        f"{machine_line()}",
        "",
        *table,
        "",
        f"Joined against inline: {figures['ratio_delayed_vs_inline_1']:.2f}x with 1 worker, "
        f"{figures['ratio_delayed_vs_inline_2']:.2f}x with 2. Were every core busy at the joined runs' CPU "
        f"per event, the most they could learn is {figures['ceiling_ratio_delayed_vs_inline_1']:.2f}x / "
        f"{figures['ceiling_ratio_delayed_vs_inline_2']:.2f}x the inline runs' measured rate.",
    ]))


def report_workers(n: int, runs: dict[str, list[dict]]) -> None:
    """What a worker costs: CPU per 1,000 events learned with 1, 2 and 4 workers (issue 48's
    machine-independent measure: on a cluster each worker has cores of its own), both sync modes,
    4 workers with the window 2 share, Ray Data at 4 with either window; each contender's AUC
    against DDP's at its size."""
    figures, table = contender_table(runs)
    total, rate = figures["steady_cpu_ms_per_1k_events"], figures["steady_events_per_s"]
    auc, logloss = ({name: statistics.median(r[key] for r in rs) for name, rs in runs.items()}
                    for key in ("auc_mean", "logloss_mean"))
    ddp = {name: f"{name.split('-')[0]}-workers-sync-step" for name in runs if name != "1-worker"}
    figures = {"benchmark": "cpu_workers", "events": n, **figures, "auc_mean": auc, "logloss_mean": logloss,
               "first_window_events": {name: [r["first_window_events"] for r in rs] for name, rs in runs.items()},
               "cpu_ratio_vs_1_worker": {name: total[name] / total["1-worker"] for name in runs},
               "rate_ratio_vs_1_worker": {name: rate[name] / rate["1-worker"] for name in runs},
               "auc_vs_sync_step": {name: auc[name] - auc[base] for name, base in ddp.items() if name != base}}
    write_json("cpu_workers", figures)
    cpu, vs_ddp = figures["cpu_ratio_vs_1_worker"], figures["auc_vs_sync_step"]
    write_section("cpu_workers", "What a worker costs: CPU per 1,000 events, 1, 2 and 4 workers (issue 48)",
                  "\n".join([
                      f"{n:,} fraud events, default settings (direct ingest, `--sync window`) with 1, 2 and 4 "
                      f"workers, 4 workers with the window 2 workers share (8,192 events, what 4 had before "
                      f"`TrainConfig.window_for`), 2 and 4 workers with `--sync step` (DDP, the learning "
                      f"baseline), and `--ingest ray-data` at 4 workers with either window; every contender "
                      f"once per round, medians of {len(runs['1-worker'])} runs. CPU "
                      f"sampled as above; steady part only. 4 workers on 2 cores share them: their rate says "
                      f"little, their CPU per event what a worker costs where each has cores of its own. "
                      f"{machine_line()}",
                      "",
                      *table,
                      "",
                      f"CPU per 1,000 events learned against 1 worker: 2 workers **{cpu['2-workers']:.2f}x** (bar "
                      f"1.15x), 4 workers **{cpu['4-workers']:.2f}x** ({cpu['4-workers-window-8192']:.2f}x with "
                      f"2 workers' window); DDP {cpu['2-workers-sync-step']:.2f}x / "
                      f"{cpu['4-workers-sync-step']:.2f}x. Prequential AUC (mean over each run's checkpoints) "
                      f"against DDP at the same size: 2 workers {vs_ddp['2-workers']:+.4f}, 4 workers "
                      f"{vs_ddp['4-workers']:+.4f} ({vs_ddp['4-workers-window-8192']:+.4f} with 2 workers' "
                      f"window; bar: within 0.005). Ray Data at 4 workers: "
                      f"{total['4-workers-ray-data'] / total['4-workers']:.2f}x the direct path's CPU per event "
                      f"({total['4-workers-ray-data-window-8192'] / total['4-workers-window-8192']:.2f}x at 2 "
                      f"workers' window), learned at {rate['4-workers-ray-data'] / rate['4-workers']:.2f}x its rate "
                      f"({rate['4-workers-ray-data-window-8192'] / rate['4-workers-window-8192']:.2f}x).",
                  ]))


def report(n: int, runs: dict[str, list[dict]]) -> None:
    roles = sorted({role for rs in runs.values() for r in rs for role in r["cpu_s_by_role"]})

    def med(key: str, ingest: str, role: str) -> float:
        return statistics.median(r[key].get(role, 0.0) for r in runs[ingest])

    per_1k = {i: {role: med("steady_cpu_ms_per_1k_events_by_role", i, role) for role in roles} for i in runs}
    whole = {i: {role: med("cpu_s_by_role", i, role) for role in roles} for i in runs}
    rate = {i: statistics.median(r["steady_events_per_s"] for r in rs) for i, rs in runs.items()}
    busy = {i: statistics.median(r["steady_cores_busy"] for r in rs) for i, rs in runs.items()}
    busy_run = {i: statistics.median(r["cores_busy"] for r in rs) for i, rs in runs.items()}
    busy_start = {i: statistics.median(r["startup_cores_busy"] for r in rs) for i, rs in runs.items()}
    first_step = {i: statistics.median(r["first_step_s"] for r in rs) for i, rs in runs.items()}
    figures = {"benchmark": "cpu_roles", "machine": machine_line(), "events": n, "workers": 2,
               "steady_events_per_s": rate, "ratio_ray_data_vs_direct": rate["ray-data"] / rate["direct"],
               "steady_cores_busy": busy, "run_cores_busy": busy_run, "startup_cores_busy": busy_start,
               "first_step_s": first_step,
               "steady_cpu_ms_per_1k_events_by_role": per_1k, "run_cpu_s_by_role": whole, "runs": runs}
    write_json("cpu_roles", figures)
    order = sorted(roles, key=lambda r: -(per_1k["ray-data"][r] + per_1k["direct"][r]))
    rows = "\n".join(f"| {role} | {per_1k['direct'][role]:.1f} | {per_1k['ray-data'][role]:.1f} | "
                     f"{whole['direct'][role]:.1f} | {whole['ray-data'][role]:.1f} |" for role in order)
    total = {i: sum(per_1k[i].values()) for i in per_1k}
    write_section("cpu_roles", "Where the two cores go: direct against Ray Data (2 workers)", "\n".join([
        f"{n:,} fraud events, 2 workers, default settings; the two modes alternate, medians of "
        f"{len(runs['direct'])} runs each. Every process's CPU time sampled every {SAMPLE_S} s (psutil) and "
        f"charged to the role its title names; the steady part is from the first step to the last "
        f"checkpoint. {machine_line()}",
        "",
        f"Learned (steady): direct {rate['direct']:,.0f} events/s, Ray Data {rate['ray-data']:,.0f} "
        f"({rate['ray-data'] / rate['direct']:.2f}x). Cores busy in the steady part {busy['direct']:.2f} / "
        f"{busy['ray-data']:.2f} of 2; from `train()` to the first step ({first_step['direct']:.1f} s / "
        f"{first_step['ray-data']:.1f} s) {busy_start['direct']:.2f} / {busy_start['ray-data']:.2f}; over the "
        f"whole run {busy_run['direct']:.2f} / {busy_run['ray-data']:.2f}.",
        "",
        "| role | direct, steady: CPU ms per 1,000 events | Ray Data, steady | direct, whole run: CPU s "
        "| Ray Data, whole run |",
        "|---|---:|---:|---:|---:|",
        rows,
        f"| **all** | **{total['direct']:.1f}** | **{total['ray-data']:.1f}** | "
        f"**{sum(whole['direct'].values()):.1f}** | **{sum(whole['ray-data'].values()):.1f}** |",
    ]))


if __name__ == "__main__":
    main()
