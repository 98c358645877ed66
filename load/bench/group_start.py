"""Where a training group's start goes, process by process: from `train()` on a running Ray
cluster to the first optimizer step, with 1 and 2 workers (the issue-12 bar is 15 s).

    python -m load.bench.group_start [--events 100000] [--runs 3]

A sampler reads every process's title and CPU time (psutil) every SAMPLE_S. Ray renames a pooled
worker for each actor it runs, so each process born during the start is charged, boot included,
to the first role it takes (a process that never takes one was an idle pooled worker). What it
reports, medians of the runs (1 and 2 workers alternating):
- the chain of the start: Ray Train's controller process born, its `run` begun, the worker
  processes born, Ray Train's `init_train_context` (torch imported) begun, our loop entered
  (rank 0's own record from here: Kafka clients, model, restore, first window), the first step;
- the CPU seconds each role spent before the first step, and how many of the two cores were
  busy: CPU / 2 is the least the start could take on this machine if nothing waited on anything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil

from load.bench.common import Sampler, machine_line, write_json, write_section
from load.bench.ingest import alternating_rounds, pipeline_rate

SAMPLE_S = 0.2
CORES = os.cpu_count() or 2
# The first matching title a process takes names its role; a process born as a Ray worker that
# never ran anything ("ray::IDLE" to the end) was a pooled worker nobody used.
WORKERS = "Ray Train worker processes"
WORKERS_RAY = "workers, until our loop: process boot, Ray Train's set-up, torch imported"
WORKERS_OURS = "workers, our loop: Kafka clients, model, DDP, optimizer, restore, first window and step"
ROLES = (
    (WORKERS, ("ray::RayTrainWorker",)),
    ("Ray Train controller", ("ray::TrainController",)),
    ("Ray Train's helper actors", ("ray::PlacementGroupCleaner", "ray::SynchronizationActor",
                                    "ray::DatasetManager", "ray::_AutoscalingCoordinatorActor")),
    ("scale controller", ("ray::ScaleController", "ray::scaler-")),
    ("raylet, GCS and Ray's services", ("raylet", "gcs_server", "dashboard", "agent", "log_monitor", "monitor.py",
                                        "runtime_env")),
    ("Kafka broker", ("kafka.Kafka", "java")),
)
IDLE = "pooled Ray workers that ran nothing"
# Titles whose first appearance marks a step of the start.
MILESTONES = (("controller running", "ray::TrainController.run"),
              ("torch imported in the workers (init_train_context begun)", "ray::RayTrainWorker.init_train_context"))


def role_of(titles: list[str]) -> str | None:
    # A pooled worker's first title is its command line (default_worker.py, which names the
    # raylet): what it became decides, so every title is tried against each role in turn.
    for role, marks in ROLES:
        if any(mark in title for title in titles for mark in marks):
            return role
    return None


class Processes(Sampler):
    """Every process's titles (first seen when, after t0) and CPU time samples, until stopped."""

    def __init__(self):
        super().__init__(SAMPLE_S)
        self.t0 = time.time()
        self.titles: dict[int, list[tuple[float, str]]] = {}
        self.cpu: dict[int, list[tuple[float, float]]] = {}
        self.born: dict[int, float] = {}
        self.own_cpu_s = 0.0  # the sampler's, charged to it rather than to the driver it runs in

    def sample(self) -> None:
        started = time.thread_time()
        now = time.time() - self.t0
        for proc in psutil.process_iter(["pid", "cmdline", "name", "cpu_times", "create_time"]):
            info = proc.info
            if info["cpu_times"] is None:
                continue
            pid = info["pid"]
            title = "this driver" if pid == os.getpid() else " ".join(info["cmdline"] or [info["name"] or ""])
            seen = self.titles.setdefault(pid, [])
            if not seen or seen[-1][1] != title:
                seen.append((now, title))
            self.born.setdefault(pid, info["create_time"] - self.t0)
            self.cpu.setdefault(pid, []).append((now, info["cpu_times"].user + info["cpu_times"].system))
        self.own_cpu_s += time.thread_time() - started

    def cpu_until(self, pid: int, t: float) -> float:
        """CPU seconds process `pid` spent from t0 (or its birth) to t."""
        samples = self.cpu[pid]
        start = 0.0 if self.born[pid] > 0 else samples[0][1]
        before = [c for s, c in samples if s <= t]
        return (before[-1] if before else start) - start

    def first_seen(self, mark: str) -> float | None:
        times = [t for seen in self.titles.values() for t, title in seen if mark in title]
        return min(times) if times else None

    def role(self, pid: int) -> str:
        titles = [title for _, title in self.titles[pid]]
        if titles == ["this driver"]:
            return "this driver (train(): the trainer's set-up)"
        if any("ray::IDLE" in t or "default_worker" in t for t in titles):  # a pooled Ray worker
            return role_of([t for t in titles if t.startswith("ray::") and "ray::IDLE" not in t]) or IDLE
        return role_of(titles) or "other"


def profiled_start(bootstrap: str, n: int, home, workers: int) -> dict:
    with Processes() as procs:
        run = pipeline_rate(bootstrap, n, workers, home)
    first_step = run["first_step_s"]  # counted from the call to train(), a moment after t0
    loop_entered = run["startup_s"]["loop_entered"]
    cpu: dict[str, float] = {}
    for pid in procs.cpu:
        if procs.born[pid] < first_step:
            role = procs.role(pid)
            if role == WORKERS:  # Ray's part (process, Ray Train's set-up, torch) apart from our loop's
                before = procs.cpu_until(pid, loop_entered)
                cpu[WORKERS_RAY] = cpu.get(WORKERS_RAY, 0.0) + before
                role, spent = WORKERS_OURS, procs.cpu_until(pid, first_step) - before
            else:
                spent = procs.cpu_until(pid, first_step)
            cpu[role] = cpu.get(role, 0.0) + spent
    sampler = procs.own_cpu_s * min(1.0, first_step / (time.time() - procs.t0))  # its share before the step
    driver = "this driver (train(): the trainer's set-up)"
    cpu[driver] = cpu.get(driver, 0.0) - sampler
    trainers = [pid for pid in procs.cpu if procs.role(pid) == WORKERS]
    controller = [pid for pid in procs.cpu if procs.role(pid) == "Ray Train controller"]
    # A pooled process of an earlier run, with the same runtime environment, is reused: no birth.
    born = [procs.born[p] for p in controller if procs.born[p] > 0]
    chain = {"controller process born": min(born, default=None)}
    chain.update({name: procs.first_seen(mark) for name, mark in MILESTONES[:1]})
    born = [procs.born[p] for p in trainers if procs.born[p] > 0]
    chain["worker processes born"] = max(born, default=None)
    chain.update({name: procs.first_seen(mark) for name, mark in MILESTONES[1:]})
    marks = run["startup_s"]
    chain.update({"our loop entered (rank 0)": loop_entered, "Kafka clients": marks["kafka_clients"],
                  "model, DDP and optimizer ready": marks["model_ready"], "first step": first_step})
    total = sum(cpu.values())
    return {"workers": workers, "first_step_s": first_step, "chain_s": chain, "cpu_s_by_role": cpu,
            "cpu_s": total, "cores_busy": total / first_step, "least_wall_s": total / CORES,
            "processes_born": sum(1 for p in procs.born if 0 < procs.born[p] < first_step),
            "processes_reused": sum(1 for p in controller + trainers if procs.born[p] <= 0), "sampler_cpu_s": sampler,
            "steady_events_per_s": run["steady_events_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)  # the start is measured, not the steady rate
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = alternating_rounds(args.events, args.runs, [1, 2], profiled_start)
    report(args.events, runs)


def report(n: int, runs: dict[int, list[dict]]) -> None:
    def med(values) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    chain = {w: {k: med(r["chain_s"][k] for r in rs) for k in rs[0]["chain_s"]} for w, rs in runs.items()}
    roles = sorted({role for rs in runs.values() for r in rs for role in r["cpu_s_by_role"]})
    cpu = {w: {role: med(r["cpu_s_by_role"].get(role, 0.0) for r in rs) for role in roles} for w, rs in runs.items()}
    summary = {w: {k: med(r[k] for r in rs) for k in ("first_step_s", "cpu_s", "cores_busy", "least_wall_s",
                                                      "processes_born", "processes_reused", "sampler_cpu_s")}
               for w, rs in runs.items()}
    write_json("group_start", {"benchmark": "group_start", "machine": machine_line(), "events": n, "cores": CORES,
                               "summary": summary, "chain_s": chain, "cpu_s_by_role": cpu,
                               "runs": {str(w): rs for w, rs in runs.items()}})

    def cell(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"

    chain_rows = "\n".join(f"| {k} | {cell(chain[1][k])} | {cell(chain[2][k])} |" for k in chain[1])
    order = sorted(roles, key=lambda r: -cpu[2][r])
    cpu_rows = "\n".join(f"| {role} | {cpu[1][role]:.1f} | {cpu[2][role]:.1f} |" for role in order)
    s1, s2 = summary[1], summary[2]
    write_section("group_start", "Where a group's start goes (train() to the first step)", "\n".join([
        f"`train()` on a running Ray cluster, {n:,} fraud events, default settings, 1 and 2 workers "
        f"alternating, medians of {len(runs[1])} runs. Every process's title and CPU time sampled every "
        f"{SAMPLE_S} s (psutil); a process born during the start is charged, boot included, to the first "
        f"role it takes. {machine_line()}",
        "",
        "| the chain, seconds after `train()` | 1 worker | 2 workers |",
        "|---|---:|---:|",
        chain_rows,
        "",
        "| CPU seconds before the first step | 1 worker | 2 workers |",
        "|---|---:|---:|",
        cpu_rows,
        f"| **all** | **{s1['cpu_s']:.1f}** | **{s2['cpu_s']:.1f}** |",
        "",
        f"Cores busy from `train()` to the first step: {s1['cores_busy']:.2f} / {s2['cores_busy']:.2f} of "
        f"{CORES}; processes started: {s1['processes_born']:.0f} / {s2['processes_born']:.0f}, Ray Train processes "
        f"reused from the run before (Ray pools a worker process by its runtime environment): "
        f"{s1['processes_reused']:.0f} / {s2['processes_reused']:.0f}. The sampler's own CPU "
        f"({s1['sampler_cpu_s']:.1f} s / {s2['sampler_cpu_s']:.1f} s) is left out of the table. The CPU alone, "
        f"spread over {CORES} cores with nothing waiting, would take {s1['least_wall_s']:.1f} s / "
        f"{s2['least_wall_s']:.1f} s: the least a start of this shape can take here. The first run (1 worker) "
        f"started on processes Ray had never started (nothing reused): first step {runs[1][0]['first_step_s']:.1f} s.",
    ]))


if __name__ == "__main__":
    main()
