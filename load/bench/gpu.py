"""A bigger machine's figures in one prepared run (issue 48): gloo workers 1/2/4/8, Ray Data against
direct at 4 workers (its read lanes on the cores the trainers leave), and the GPU path (`--use-gpu`:
NCCL, the model and every batch on CUDA), against the plain loop, in the same run on the same data.

    python -m load.bench.gpu [--events 1200000] [--runs 3]   # a 16-core, 1-GPU machine
    python -m load.bench.gpu --workers 1,4 --skip kill,baseline-cuda,nccl-1,ray-data-4x4,ray-data-4x8,ray-data-nccl-1
        # ^ 3 rounds in ~6.5 minutes on the H200 (2026-12-04) without gloo-4-window-8192 (new since; ~40 s a
        # round more); then --workers= --skip kill,baseline-cuda --events 600000
    python -m load.bench.gpu --cpu-only --workers 1,2 --events 20000 --runs 1 --out DIR   # its test here

Contenders, one run each per round (as in ingest.py): the single-process baseline on the CPU
(ingest.py's loop) and the same loop with its model on CUDA; streamlearn with 1, 2, 4 and 8 gloo
workers (the default sync, `--sync window`; gloo-4-window-8192: 4 with the window 2 share, as before
`TrainConfig.window_for`), `--ingest ray-data` with 4 (2 lanes, the default; 4 and
8), and 1 NCCL worker (one GPU is one rank: NCCL refuses two ranks on one device) reading directly
and through Ray Data (`ray-data-nccl-1`: what `--ingest auto` chooses for GPU trainers). GPU use is
sampled with nvidia-smi while each run lasts, so a run that silently trained on the CPU would show it.
First, once: the worker SIGKILLed right after a checkpoint is published and before its offsets are committed, its group
restarted (on the GPU) from that checkpoint, and the run audited for exactly-once against a
re-read of the topic. The report is rewritten after every run, so a lease that ends early
leaves the runs it held. `--cpu-only` leaves out the CUDA contenders (the kill runs on the CPU);
`--out DIR` writes DIR/gpu.json and leaves docs/ as it is. `--skip` leaves out contenders (and
`kill`, the kill check): a round of all of them took ~4 minutes on the lent H200, mostly each
group's ~25-s start, so three rounds and the kill outlast one 10-minute call; the CUDA contenders
and the kill were measured there on 2026-11-27 (docs/bench/gpu.json keeps what a run skipped).
1.2M events by default, as ingest.py: the 400k of the last lease left 8 workers ~0.7 s and 4
workers ~1 s of steady learning after a ~20-s start, too short a sample to rank anything by; the
extra 800k add ~30 s of learning to a round there (from ~115k events/s for the loop and ~65k
for Ray Data to ~550k at 8 workers), so `--skip` what a shorter lease cannot hold rather than `--events`.
The topic has 8 partitions (`--partitions`): with fewer partitions than ranks the direct path
cuts each partition's range into per-rank slices, which is not how an 8-worker job is deployed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from load.bench.common import audit_exactly_once, json_safe, machine_info, machine_line, write_json, write_section
from load.bench.ingest import TOPIC, alternating_rounds, baseline, median_run, pipeline_rate
from streamlearn import faults
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.train.trainer import run_dir, train

PARTITIONS = 8  # one a rank up to 8 workers: the direct path's contiguous reads (streamlearn/ingest/windows.py)
KILL = "after_publish_before_commit@rank0#1"  # the first checkpoint durable, its offsets not committed


@contextmanager
def gpu_sampled(out: dict):
    """Peak GPU utilisation (%) and memory used (MiB) while the block runs, from nvidia-smi."""
    stop, peaks = threading.Event(), {"gpu_util_peak_pct": 0, "gpu_memory_peak_mib": 0, "gpu_samples": 0}

    def sample() -> None:
        while not stop.wait(0.25):
            done = _smi("--query-gpu=utilization.gpu,memory.used")
            if done:
                util, mem = (int(float(v)) for v in done.stdout.splitlines()[0].split(","))
                peaks.update(gpu_util_peak_pct=max(peaks["gpu_util_peak_pct"], util),
                             gpu_memory_peak_mib=max(peaks["gpu_memory_peak_mib"], mem),
                             gpu_samples=peaks["gpu_samples"] + 1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        out.update(peaks)


CONTENDERS = {"baseline-cpu": {"device": "cpu"}, "baseline-cuda": {"device": "cuda"},
              **{f"gloo-{n}": {"workers": n} for n in (1, 2, 4, 8)},
              # 4 workers with the window 2 share (8,192 events), what gloo-4 had before
              # TrainConfig.window_for gave a group past 2 half a window a rank: the change, measured there.
              "gloo-4-window-8192": {"workers": 4, "window_events": 4096},
              "ray-data-4": {"workers": 4, "ingest": "ray-data"},
              "ray-data-4x4": {"workers": 4, "ingest": "ray-data", "read_lanes": 4},
              "ray-data-4x8": {"workers": 4, "ingest": "ray-data", "read_lanes": 8},
              "nccl-1": {"workers": 1, "use_gpu": True},
              # Ray Data under a GPU trainer: its read lanes decode on CPUs the trainer does not use,
              # the case `--ingest auto` would choose it for (issue 48), against nccl-1's direct reads.
              "ray-data-nccl-1": {"workers": 1, "use_gpu": True, "ingest": "ray-data"}}
CUDA = ("baseline-cuda", "nccl-1", "ray-data-nccl-1")
BARS = {"gloo_4_vs_1": 3.2, "ray_data_vs_direct_4": 1.0}  # issue 48, on the 16-core machine


def contenders(workers: list[int], cpu_only: bool, skip: frozenset[str] = frozenset()) -> list[str]:
    gloo = [f"gloo-{n}" for n in workers]
    lanes = ["gloo-4-window-8192", "ray-data-4", "ray-data-4x4", "ray-data-4x8"] if 4 in workers else []
    wanted = ["baseline-cpu", "baseline-cuda", *gloo, *lanes, "nccl-1", "ray-data-nccl-1"]
    return [name for name in wanted if name in CONTENDERS and name not in skip and not (cpu_only and name in CUDA)]


def run_one(bootstrap: str, events: int, home, name: str, partitions: int = PARTITIONS) -> dict:
    kwargs, sampled = CONTENDERS[name], {}
    with gpu_sampled(sampled):
        if name.startswith("baseline"):
            result = {"steady_events_per_s": baseline(bootstrap, events, partitions=partitions, **kwargs)}
        else:
            result = pipeline_rate(bootstrap, events, home=home, **kwargs)
    result = {**result, **sampled}
    print(f"# {name}: {result['steady_events_per_s']:,.0f} events/s, first step {result.get('first_step_s', 0):.1f} s, "
          f"GPU peak {sampled['gpu_util_peak_pct']} % / {sampled['gpu_memory_peak_mib']} MiB", flush=True)
    return result


def killed_and_restored(bootstrap: str, events: int, home, use_gpu: bool = True) -> dict:
    """One NCCL run with an aimed kill between publish and commit; Ray Train restarts the group,
    which restores the checkpoint onto the GPU. Audited against a re-read of the topic."""
    name = f"bench-killed-{time.time_ns()}"
    cfg = TrainConfig(topic=TOPIC, pipeline="fraud", workers=1, use_gpu=use_gpu, checkpoint_dir=str(home / name),
                      run_name=name, group_id=name, max_events=events, max_failures=1)
    os.environ[faults.ENV], sampled = KILL, {}
    try:
        with gpu_sampled(sampled):
            summary = train(cfg, KafkaSettings(bootstrap=bootstrap))
    finally:
        del os.environ[faults.ENV]
    return {"fault": KILL, "use_gpu": use_gpu, "fault_fired": faults.mark_of(run_dir(cfg), KILL).exists(), **sampled,
            "learned": summary["events_learned"], "seconds": summary["seconds"],
            "audit": audit_exactly_once(KafkaSettings(bootstrap=bootstrap), cfg, events)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_200_000)  # as ingest.py: a steady span, not a start
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4,8", help="gloo group sizes (ray-data-4 runs when 4 is one)")
    parser.add_argument("--cpu-only", action="store_true", help="no CUDA contenders; the kill runs on the CPU")
    parser.add_argument("--out", default="", help="write DIR/gpu.json only, docs/ left as it is (the test)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--skip", default="", help="contenders to leave out, and `kill` for the kill check")
    args = parser.parse_args()
    skip = frozenset(filter(None, args.skip.split(",")))
    if unknown := skip - set(CONTENDERS) - {"kill"}:
        parser.error(f"--skip: unknown {sorted(unknown)}; choose among {sorted(CONTENDERS)} and kill")
    names = contenders([int(n) for n in args.workers.split(",") if n], args.cpu_only, skip)
    if "baseline-cpu" not in names:
        parser.error("--skip: baseline-cpu is what every ratio is taken against; keep it")
    out = Path(args.out) if args.out else None
    killed: dict = {}

    def first(bootstrap: str, home) -> None:  # the proof first: a lease may end before the rounds do
        killed.update(killed_and_restored(bootstrap, args.events, home, use_gpu=not args.cpu_only))
        print(f"# killed and restored: fault fired {killed['fault_fired']}, exactly-once audit "
              f"{'passed' if killed['audit']['passed'] else 'FAILED'}", flush=True)

    one = functools.partial(run_one, partitions=args.partitions)
    # Reported after every run: a lent machine's call may end mid-round (twice on 2026-12-04).
    alternating_rounds(args.events, args.runs, names, one, first=None if "kill" in skip else first,
                       each_run=lambda runs: report(args.events, {n: rs for n, rs in runs.items() if rs}, killed,
                                                    args.runs, out, args.partitions),
                       partitions=args.partitions)


def _ratio(med: dict, a: str, b: str) -> float | None:
    return med[a]["steady_events_per_s"] / med[b]["steady_events_per_s"] if a in med and b in med else None


def report(n: int, runs: dict, killed: dict, rounds: int, out: Path | None = None,
           partitions: int = PARTITIONS) -> None:
    """Written after every run: what a time limit leaves is the report of the runs done."""
    base = statistics.median(r["steady_events_per_s"] for r in runs["baseline-cpu"])
    med = {name: median_run(rs) if not name.startswith("baseline") else
           {"steady_events_per_s": statistics.median(r["steady_events_per_s"] for r in rs),
            "gpu_util_peak_pct": max(r["gpu_util_peak_pct"] for r in rs)} for name, rs in runs.items()}
    audit = killed.get("audit")  # None: the kill check was skipped
    done = min(len(rs) for rs in runs.values())  # whole rounds; a contender's own count is its runs
    scaling = {f"ratio_{name.replace('-', '_')}_vs_gloo_1": _ratio(med, name, "gloo-1")
               for name in med if name.startswith("gloo-")}
    figures = {"events": n, "partitions": partitions, "gpu": _gpu_name(), "rounds_done": done, "rounds_asked": rounds,
               "baseline_events_per_s": base,
               **{f"{name}_events_per_s": m["steady_events_per_s"] for name, m in med.items()},
               **{f"ratio_{name}_vs_baseline_cpu": m["steady_events_per_s"] / base for name, m in med.items()},
               **scaling, "ratio_nccl_1_vs_gloo_1": _ratio(med, "nccl-1", "gloo-1"),
               "ratio_ray_data_4_vs_gloo_4": _ratio(med, "ray-data-4", "gloo-4"),
               "ratio_ray_data_nccl_1_vs_nccl_1": _ratio(med, "ray-data-nccl-1", "nccl-1"), "bars": BARS,
               **{f"first_step_s_{name}": m["first_step_s"] for name, m in med.items() if "first_step_s" in m},
               "killed_restored_exactly_once": audit and audit["passed"], "killed": killed or None, "runs": runs}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        body = {"benchmark": "gpu", "machine": {**machine_info(), **_versions()}, **figures}
        (out / "gpu.json").write_text(json.dumps(json_safe(body), indent=1, default=str))
        return
    write_json("gpu", figures)
    rows = [f"| {name} | {m['steady_events_per_s']:,.0f} | {m['steady_events_per_s'] / base:.2f} | "
            f"{_seconds(m.get('first_step_s'))} | {m['gpu_util_peak_pct']} % |"
            for name, m in med.items()]
    kill_line = "The kill check was skipped (`--skip kill`)." if audit is None else (
        f"Killed ({'on the GPU' if killed.get('use_gpu', True) else 'on the CPU'}) between a checkpoint's publish "
        f"and its offsets' commit (`{KILL}`), restarted from "
        f"that checkpoint: fault fired: {killed['fault_fired']}; exactly-once audit against a re-read "
        f"of the topic {'passed' if audit['passed'] else 'FAILED'} (learned {audit['learned']:,} of "
        f"{audit['produced']:,}; {', '.join(k for k, ok in audit['checks'].items() if not ok) or 'every check held'}).")
    lines = [
        f"{n:,} fraud events on {partitions} partitions, the same data for every contender, default settings; "
        f"medians of each contender's runs ({done} of {rounds} rounds whole when written), contenders round after "
        f"round. "
        f"GPU: {figures['gpu']}. {machine_line()}",
        "",
        "| contender | learned events/s (steady) | ratio to the CPU baseline | first step | GPU utilisation, peak |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        "`baseline-*`: one process, confluent-kafka + the same decode + the same MLP step, on the CPU or with "
        "its model on CUDA. `gloo-N`: streamlearn, N Ray Train workers on CPUs (the default). `ray-data-4`: "
        "`--ingest ray-data` with 4 workers. `nccl-1`: `--use-gpu`, one worker, NCCL, model and batches on "
        "CUDA. Against 1 gloo worker: " + ", ".join(f"{k.removeprefix('ratio_').removesuffix('_vs_gloo_1')} "
                                                       f"{v:.2f}x" for k, v in scaling.items() if v is not None)
        + f" (issue 48: 4 workers ≥ {BARS['gloo_4_vs_1']}x); Ray Data against direct at 4 workers: "
        f"{_x(figures['ratio_ray_data_4_vs_gloo_4'])} (≥ {BARS['ray_data_vs_direct_4']}x); NCCL against gloo, "
        f"1 worker: {_x(figures['ratio_nccl_1_vs_gloo_1'])}; Ray Data against direct under one NCCL worker: "
        f"{_x(figures['ratio_ray_data_nccl_1_vs_nccl_1'])}.",
        "",
        kill_line,
    ]
    write_section("gpu", "GPU path (NCCL, `--use-gpu`)", "\n".join(lines))


def _versions() -> dict:
    import ray
    import torch

    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "ray": ray.__version__, "nccl": ".".join(map(str, nccl)) if nccl else None}


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def _gpu_name() -> str:
    done = _smi("--query-gpu=name,driver_version")
    return done.stdout.strip() if done else "none found"


def _smi(query: str) -> subprocess.CompletedProcess | None:
    """nvidia-smi's CSV answer to `query`; None where there is no nvidia-smi or it fails."""
    try:
        done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done if done.returncode == 0 and done.stdout.strip() else None


if __name__ == "__main__":
    main()
