"""Soak: the whole service at a steady rate for minutes, judged against gates; exit 1 if one fails.

    make soak                 # = python -m load.bench.soak (10 minutes)
    python -m load.bench.soak [--minutes 10] [--rate 2000] [--clients 8] [--sample-every 10]

On this machine: Kafka, continuous training (2 Ray Train workers, default settings), the default
Ray Serve scorer, the load generator at a steady rate with 5 % malformed events, and 8 clients
scoring single events back to back. Every sample (~10 s): the resident memory (RSS) of every
process of the service, the consumer lag (events in Kafka that no checkpoint holds yet) and the
scoring latencies since the last sample; and each process's CPU seconds and the machine's by
kind (user, system, iowait, steal, idle), cumulative, so a slow patch shows what took the cores.

The gates (issue 15), each recorded with its figures in docs/bench/soak.json:
- no scoring request fails once the first model is served (no retries: the clients count the
  first answer);
- lag stays bounded: over the last 5 minutes the rise of its peaks (read every second, the peak
  of each two checkpoint intervals) is not significantly above zero and is under one checkpoint
  interval's events (lag climbs between checkpoints and drops at each);
- memory: every service process's RSS slope after warm-up ≤ 2 MiB/min (warm-up: until a minute
  after the backlog piled up during start-up is learned, and at least a fifth of the run). The
  Kafka broker is a JVM: its heap grows by design up to its bound (-Xmx, 512 MiB) as G1 commits
  regions, which is no leak, so its gate judges the RSS outside the committed heap (`jstat -gc`,
  sampled with the RSS) and shows the heap beside its bound; without `jstat`, the whole RSS;
- scoring p99 of the last 2 minutes ≤ 1.5x the p99 of the first 2 after warm-up;
- at the end, learned + dead-lettered == produced, and the counters, the fingerprint, the
  offsets and the dead-letter topic agree with an independent re-read of both topics.
Not part of `make test`: it runs for minutes.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import psutil

from load.bench.common import (
    BENCH_DIR,
    audit_exactly_once,
    bench_broker,
    machine_line,
    start_bench_ray,
    write_json,
    write_section,
)
from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.kafka.admin import end_offsets
from streamlearn.kafka.broker import JVM_FLAGS, free_port
from streamlearn.loadgen.generator import BankingSimulator, run_load
from streamlearn.loadgen.profiles import parse_profile
from streamlearn.rundir import checkpoint as ckpt

TOPIC, PARTITIONS, BAD_FRACTION = "soak", 4, 0.05
MIB = 1024 * 1024
RSS_SLOPE_MAX = 2.0  # MiB per minute, per process, after warm-up
P99_GROWTH_MAX = 1.5
LAG_WINDOW_S, P99_WINDOW_S = 300.0, 120.0
# Ray actor classes that make up the service, by the role they play in it.
ROLES = {"RayTrainWorker": "train worker", "ServeReplica": "serve replica", "HAProxyManager": "serve proxy",
         "ProxyActor": "serve proxy", "ServeController": "serve controller", "TrainController": "train controller",
         "ScaleController": "scale controller"}
# Latency histogram: log-spaced edges from 0.1 ms to 100 s, 2 % apart, so percentiles of any
# span of the run come from summed counts and the clients' memory stays flat for hours.
EDGES = np.geomspace(1e-4, 100.0, int(np.log(1e6) / np.log(1.02)) + 1).tolist()


class Tally:
    """One client's answers since the last sample: a latency histogram and the failures."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts, self.failed_at, self.first_ok = [0] * (len(EDGES) + 1), [], None

    def add(self, seconds: float, ok: bool) -> None:
        with self.lock:
            if ok:
                self.counts[bisect.bisect(EDGES, seconds)] += 1
                self.first_ok = self.first_ok or time.time()
            else:
                self.failed_at.append(time.time())

    def take(self) -> tuple[np.ndarray, list[float]]:
        with self.lock:
            counts, failed_at = np.array(self.counts), self.failed_at
            self.counts, self.failed_at = [0] * (len(EDGES) + 1), []
        return counts, failed_at


def percentile(counts: np.ndarray, q: float) -> float | None:
    """The q-th percentile (ms) of a histogram: the upper edge of the bin that holds it."""
    total = int(counts.sum())
    if not total:
        return None
    i = int(np.searchsorted(np.cumsum(counts), q / 100 * total))
    return EDGES[min(i, len(EDGES) - 1)] * 1000


def score_forever(url: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    import httpx

    events = BankingSimulator(seed=seed).events(64)
    with httpx.Client(timeout=5) as client:
        for i in range(sys.maxsize):
            if stop.is_set():
                return
            started = time.perf_counter()
            try:
                ok = client.post(f"{url}/score", json=events[i % len(events)]).status_code == 200
            except httpx.HTTPError:
                ok = False
            tally.add(time.perf_counter() - started, ok)


class Clients:
    """The scoring clients, in a process of their own. In the driver's process they shared its GIL
    with the train driver and a generator producing 2,000 events/s (0.88 of the 2 cores together),
    so a latency counted the wait for the interpreter as much as the scorer's answer."""

    def __init__(self, url: str, n: int):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_clients_main, args=(url, n, child), daemon=True)
        self.process.start()

    def take(self) -> tuple[np.ndarray, list[float]]:
        """The latency histogram and the failure times of every client since the last take."""
        self.conn.send("take")
        return self.conn.recv()

    def stop(self) -> float | None:
        """Stop the clients; when the first answer came (epoch seconds), or None."""
        self.conn.send("stop")
        first_ok = self.conn.recv()
        self.process.join(10)
        return first_ok


def _clients_main(url: str, n: int, conn) -> None:
    stop, tallies = threading.Event(), [Tally() for _ in range(n)]
    threads = [threading.Thread(target=score_forever, args=(url, stop, tally, 100 + i), daemon=True)
               for i, tally in enumerate(tallies)]
    for t in threads:
        t.start()
    while conn.recv() == "take":
        taken = [t.take() for t in tallies]
        conn.send((sum(c for c, _ in taken), sorted(at for _, times in taken for at in times)))
    stop.set()
    for t in threads:
        t.join()
    conn.send(min((t.first_ok for t in tallies if t.first_ok), default=None))


def service_processes(dashboard: str, broker: int | None, clients: int) -> dict[int, str]:
    """pid -> role of every live process of the service (looked up each sample: restarts change
    pids). HAProxy runs as a child of Serve's proxy actor; Ray's own GCS and raylet are children
    of this driver, which started the local cluster."""
    from ray.util.state import list_actors

    found = {os.getpid(): "driver (train driver, generator)", clients: "scoring clients"}
    if broker:
        found[broker] = "kafka broker"
    for actor in list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=1000):
        role = next((r for prefix, r in ROLES.items() if actor.class_name.startswith(prefix)), None)
        if role and actor.pid:
            found[actor.pid] = role
            if role == "serve proxy":
                for child in _children(actor.pid):
                    found.setdefault(child.pid, "haproxy")
    for child in _children(os.getpid()):
        name = child.name()
        if name in ("gcs_server", "raylet"):
            found[child.pid] = f"ray {name}"
    return found


def cpu_shares(pair: list[dict]) -> str:
    """Cores each role took between two samples, the busiest first: what a slow patch ran beside."""
    if len(pair) < 2:
        return "n/a"
    (a, b), seconds = pair, pair[1]["t"] - pair[0]["t"]
    took: dict[str, float] = {}
    for name, cpu in b["cpu_s"].items():
        if name in a["cpu_s"]:
            role = name.rsplit(" ", 1)[0]
            took[role] = took.get(role, 0.0) + (cpu - a["cpu_s"][name]) / seconds
    machine = {k: (b["machine_cpu_s"][k] - a["machine_cpu_s"][k]) / seconds for k in b["machine_cpu_s"]}
    busy = sum(v for k, v in machine.items() if k not in ("idle", "iowait", "steal"))
    took["anything else"] = busy - sum(took.values())  # Ray's own processes, idle workers, the kernel
    busiest = sorted(took.items(), key=lambda kv: -kv[1])[:6]
    return (", ".join(f"{role} {share:.2f}" for role, share in busiest)
            + f"; idle {machine['idle']:.2f}, steal {machine.get('steal', 0.0):.2f}")


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def rss(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


def cpu_seconds(pid: int) -> float | None:
    """The process's CPU time so far (user + system), in seconds."""
    try:
        t = psutil.Process(pid).cpu_times()
        return round(t.user + t.system, 2)
    except psutil.Error:
        return None


def machine_cpu_seconds() -> dict[str, float]:
    """The machine's CPU time so far by kind: a slow patch shows who took the cores, or the host (steal)."""
    return {k: round(v, 1) for k, v in psutil.cpu_times()._asdict().items()
            if k in ("user", "nice", "system", "iowait", "steal", "idle")}


def jvm_heap_mib(pid: int | None) -> float | None:
    """The JVM's committed heap (survivor, eden and old spaces' capacities, `jstat -gc`), in MiB;
    None without a JDK's jstat or a JVM at `pid`."""
    jstat = shutil.which("jstat")
    if pid is None or jstat is None:
        return None
    try:
        lines = subprocess.run([jstat, "-gc", str(pid)], capture_output=True, text=True, timeout=10).stdout.split("\n")
        gc = dict(zip(lines[0].split(), map(float, lines[1].split()), strict=True))
        return round(sum(gc[k] for k in ("S0C", "S1C", "EC", "OC")) / 1024, 1)
    except (OSError, subprocess.SubprocessError, IndexError, KeyError, ValueError):
        return None


def heap_bound_mib() -> float:
    """The broker's -Xmx (streamlearn/kafka/broker.py), in MiB."""
    flag = next(f for f in JVM_FLAGS if f.startswith("-Xmx"))
    return float(flag[4:-1]) * {"m": 1, "g": 1024}[flag[-1].lower()]


def lag(settings: KafkaSettings, run_dir: Path) -> int | None:
    """Events in the topic that no checkpoint holds yet."""
    path = ckpt.newest(run_dir)
    try:
        ends = end_offsets(settings, TOPIC)
    except Exception:
        return None
    held = {int(p): o for p, o in ckpt.read_meta(path)["offsets"].items()} if path else {}
    return sum(end - held.get(p, 0) for p, end in ends.items())


def sample_forever(stop: threading.Event, every: float, started: float, dashboard: str, broker_pid: int | None,
                   settings: KafkaSettings, run_dir: Path, peak_window_s: float, clients: Clients,
                   samples: list) -> None:
    """A sample every `every` seconds; lag is read every second in between, and each sample keeps
    the peak of the last `peak_window_s` (two checkpoint intervals): lag is a sawtooth that drops
    at each checkpoint, and a reading once per sample would alias it into a false trend when the
    two periods are close (a first soak run showed a steady 47 events/s "rise" that way)."""
    lags: deque[tuple[float, int]] = deque()
    next_sample = time.time() + every
    while not stop.wait(1.0):
        if (value := lag(settings, run_dir)) is not None:
            lags.append((time.time(), value))
        while lags and lags[0][0] < time.time() - peak_window_s:
            lags.popleft()
        if time.time() < next_sample:
            continue
        next_sample += every
        counts, failed_at = clients.take()
        failed_at = [round(at - started, 2) for at in failed_at]
        failed = len(failed_at)
        try:
            procs = service_processes(dashboard, broker_pid, clients.process.pid)
        except Exception as e:  # the state API can time out on a loaded machine: no memory this sample
            print(f"process list skipped: {type(e).__name__}: {e}")
            procs = {}
        memory = {f"{role} {pid}": round(value / MIB, 1) for pid, role in procs.items()
                  if (value := rss(pid)) is not None}
        heap = {f"kafka broker {broker_pid}": value for value in [jvm_heap_mib(broker_pid)] if value is not None}
        newest = ckpt.newest(run_dir)
        samples.append({"t": round(time.time() - started, 1), "rss_mib": memory, "jvm_heap_mib": heap,
                        "lag_events": lags[-1][1] if lags else None,
                        "lag_peak_events": max(v for _, v in lags) if lags else None,
                        "learned": ckpt.read_meta(newest)["counters"]["learned"] if newest else 0,
                        # cumulative, so any two samples give the CPU each process took between them
                        "cpu_s": {f"{role} {pid}": value for pid, role in procs.items()
                                  if (value := cpu_seconds(pid)) is not None},
                        "machine_cpu_s": machine_cpu_seconds(),
                        "requests": int(counts.sum()) + failed, "failed": failed, "failed_at": failed_at,
                        "p50_ms": percentile(counts, 50), "p99_ms": percentile(counts, 99), "histogram": counts})
        s = samples[-1]
        print(f"t={s['t']:.0f}s lag={s['lag_events']} (peak {s['lag_peak_events']}) learned={s['learned']:,} "
              f"requests={s['requests']} "
              f"failed={failed} p99={s['p99_ms']} ms rss={sum(memory.values()):.0f} MiB / {len(memory)} processes "
              f"cores: {cpu_shares(samples[-2:])}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sample-every", type=float, default=10.0)
    args = parser.parse_args()
    import ray

    from streamlearn.serve import ServeConfig, deploy
    from streamlearn.serve import shutdown as serve_shutdown
    from streamlearn.train.trainer import train

    loadavg_before = round(os.getloadavg()[0], 2)
    samples: list[dict] = []
    with bench_broker({TOPIC: PARTITIONS}) as (home, broker, settings):
        ctx = start_bench_ray(include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=free_port())
        # The defaults a user gets, but for the place and an end: train until the topic is idle.
        cfg = TrainConfig(topic=TOPIC, workers=2, checkpoint_dir=str(home / "ckpt"), until_idle_s=15.0)
        url = deploy(ServeConfig(checkpoint_dir=cfg.checkpoint_dir, pipeline=cfg.pipeline, port=free_port()))
        stop, started, failure = threading.Event(), time.time(), []
        # Daemons: a Ctrl-C of the soak ends the process (and Ray with it) instead of leaving it to the threads.
        trainer = threading.Thread(target=lambda: _catching(failure, train, cfg, settings), daemon=True)
        clients = Clients(url, args.clients)
        sampler = threading.Thread(daemon=True, target=sample_forever, args=(
            stop, args.sample_every, started, f"http://{ctx.dashboard_url}", broker.pid(), settings,
            Path(cfg.checkpoint_dir) / cfg.run_name, 2 * cfg.checkpoint_every_s, clients, samples))
        for t in (trainer, sampler):
            t.start()
        produced = run_load(broker.bootstrap, TOPIC, partitions=PARTITIONS, bad_fraction=BAD_FRACTION, seed=31,
                            profile=parse_profile(f"constant:{args.rate}"), duration=args.minutes * 60)["events"]
        stop.set()
        sampler.join()
        first_served = clients.stop()
        trainer.join()
        if failure:
            raise SystemExit(f"soak: training failed: {failure[0]!r}")
        audited = audit_exactly_once(settings, cfg, produced)
        serve_shutdown()
        ray.shutdown()
    report(args, cfg, samples, first_served and first_served - started, audited, loadavg_before)


def _catching(failure: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # reported by main once the load is over
        failure.append(e)


def slope_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return float("nan")
    t, v = np.array(points).T
    return float(np.polyfit(t / 60.0, v, 1)[0])


def rise_over(points: list[tuple[float, float]], window_s: float) -> tuple[float, float]:
    """How much the fitted line rises over the window, and that rise's standard error.

    The points are lag peaks (each over two checkpoint intervals, so each holds a whole tooth of
    the sawtooth); the lag is bounded when their rise is not significantly above zero (within 2
    standard errors) and, however noisy they are, smaller than one checkpoint interval's events."""
    if len(points) < 4:
        return float("nan"), float("nan")
    t, v = np.array(points, dtype=float).T
    (slope, _), cov = np.polyfit(t, v, 1, cov=True)
    return float(slope * window_s), float(np.sqrt(cov[0, 0]) * window_s)


def memory_trends(samples: list[dict], warmup_s: float) -> list[dict]:
    """Per process: RSS at the end of warm-up and at the end, growth, and slope after warm-up; for
    a JVM with its heap sampled, the slope gated is that of its RSS outside the committed heap."""
    series: dict[str, list[tuple[float, float]]] = {}
    heaps: dict[str, dict[float, float]] = {}
    for s in samples:
        for name, mib in s["rss_mib"].items():
            series.setdefault(name, []).append((s["t"], mib))
        for name, mib in s.get("jvm_heap_mib", {}).items():
            heaps.setdefault(name, {})[s["t"]] = mib
    rows = []
    for name, points in sorted(series.items()):
        steady = [p for p in points if p[0] >= warmup_s]
        if len(steady) < 3:  # a process that lived only through warm-up (e.g. a replaced HAProxy)
            continue
        row = {"process": name, "samples": len(points), "from_s": steady[0][0], "to_s": steady[-1][0],
               "rss_start_mib": steady[0][1], "rss_end_mib": steady[-1][1],
               "rss_max_mib": max(v for _, v in points), "growth_mib": round(steady[-1][1] - steady[0][1], 1),
               "gated": not name.startswith("ray ")}
        heap = heaps.get(name, {})
        off_heap = [(t, mib - heap[t]) for t, mib in steady if t in heap]
        if len(off_heap) >= 3:  # a JVM: its heap is bounded by -Xmx; what grows outside it is judged
            row.update(judged="RSS outside the committed heap", heap_bound_mib=heap_bound_mib(),
                       heap_start_mib=heap[off_heap[0][0]], heap_end_mib=heap[off_heap[-1][0]],
                       heap_max_mib=max(heap.values()),
                       off_heap_growth_mib=round(off_heap[-1][1] - off_heap[0][1], 1))
            steady = off_heap
        slope = slope_per_min(steady)
        rows.append({**row, "slope_mib_per_min": round(slope, 2), "passed": slope <= RSS_SLOPE_MAX})
    return rows


def jvm_note(m: dict) -> str:
    if "judged" not in m:
        return ""
    return (f" (slope of the RSS outside its heap, {m['off_heap_growth_mib']:+.1f} MiB; the heap "
            f"{m['heap_start_mib']:.0f} → {m['heap_end_mib']:.0f} MiB of its {m['heap_bound_mib']:.0f} bound)")


def num(value, spec: str = ".1f") -> str:
    """A figure for the table, or "n/a" where the run produced none."""
    return "n/a" if value is None or (isinstance(value, float) and not np.isfinite(value)) else format(value, spec)


def warm_up_end(samples: list[dict], duration: float, sawtooth: float) -> tuple[float, float | None]:
    """(end of warm-up, when the start-up backlog was learned). Events produced while the first
    worker group starts pile up (a minute or more on 2 cores); learning that backlog fills the
    broker's heap and the workers' buffers once. Steady state, which the trends judge, begins a
    minute after the lag's peak is back to one checkpoint interval's events, and never before the
    first fifth of the run."""
    caught_up = next((s["t"] for s in samples if s["learned"] and s["lag_peak_events"] is not None
                      and s["lag_peak_events"] <= 1.2 * sawtooth), None)
    return max(60.0, duration / 5, (caught_up or 0.0) + 60.0), caught_up


def judge(args, cfg: TrainConfig, samples: list[dict], served_at: float | None, audited: dict) -> dict:
    duration = samples[-1]["t"] if samples else 0.0
    lag_noise = args.rate * cfg.checkpoint_every_s
    warmup, caught_up = warm_up_end(samples, duration, lag_noise)
    failed_after = [at for s in samples for at in s["failed_at"] if served_at is not None and at >= served_at]
    lags = [(s["t"], s["lag_peak_events"]) for s in samples if s["lag_peak_events"] is not None
            and s["t"] >= duration - LAG_WINDOW_S]
    lag_rise, rise_se = rise_over(lags, LAG_WINDOW_S)
    steady = [s for s in samples if s["t"] >= max(warmup, served_at or 0)]
    first = [s["histogram"] for s in steady if s["t"] <= steady[0]["t"] + P99_WINDOW_S] if steady else []
    last = [s["histogram"] for s in samples if s["t"] > duration - P99_WINDOW_S]
    p99_first, p99_last = (percentile(sum(h), 99) if h else None for h in (first, last))
    trends = memory_trends(samples, warmup)
    gates = {
        "no failed request after the first model was served": {
            "failed": len(failed_after), "first_failures_s": failed_after[:5], "first_served_s": served_at,
            "passed": served_at is not None and not failed_after},
        "lag bounded over the last 5 minutes": {
            "rise_events": lag_rise, "rise_standard_error": rise_se, "sawtooth_events": lag_noise,
            "max_events": max((v for _, v in lags), default=None),
            "passed": bool(np.isfinite(lag_rise)) and lag_rise - 2 * rise_se <= 0 and lag_rise <= lag_noise},
        f"every service process's RSS slope <= {RSS_SLOPE_MAX:g} MiB/min after warm-up": {
            "worst": max((m for m in trends if m["gated"]), key=lambda m: m["slope_mib_per_min"], default=None),
            "passed": bool(trends) and all(m["passed"] for m in trends if m["gated"])},
        f"p99 of the last 2 minutes <= {P99_GROWTH_MAX:g}x the first 2 after warm-up": {
            "first_ms": p99_first, "last_ms": p99_last,
            "passed": p99_first is not None and p99_last is not None and p99_last <= P99_GROWTH_MAX * p99_first},
        "exactly once, against an independent re-read": {**audited, "passed": audited["passed"]},
    }
    total = sum((s["histogram"] for s in samples), np.zeros(len(EDGES) + 1, dtype=np.int64))
    return {"warmup_s": warmup, "backlog_learned_s": caught_up, "duration_s": duration, "gates": gates,
            "memory": trends,
            "scoring_p50_ms": percentile(total, 50), "scoring_p99_ms": percentile(total, 99),
            "requests": sum(s["requests"] for s in samples), "failed_requests": sum(s["failed"] for s in samples)}


def plot(samples: list[dict], warmup: float, path: Path) -> None:
    from streamlearn.observe.report import plt

    t = [s["t"] for s in samples]
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    a.plot(t, [s["lag_events"] for s in samples], label="at the sample")
    a.plot(t, [s["lag_peak_events"] for s in samples], label="peak of two checkpoint intervals (gated)")
    a.set_ylabel("lag (events)")
    a.legend(fontsize=7)
    roles: dict[str, list[float]] = {}
    for i, s in enumerate(samples):  # RSS summed by role: pids change when a process restarts
        for name, mib in s["rss_mib"].items():
            roles.setdefault(name.rsplit(" ", 1)[0], [0.0] * len(samples))[i] += mib
    for role, values in sorted(roles.items()):
        b.plot(t, values, label=role)
    b.set_ylabel("RSS (MiB)")
    b.legend(fontsize=7, ncol=2)
    c.plot(t, [s["p99_ms"] for s in samples], label="p99")
    c.plot(t, [s["p50_ms"] for s in samples], label="p50")
    c.set_ylabel("scoring latency (ms)")
    c.set_xlabel("seconds since start")
    c.legend(fontsize=7)
    for ax in (a, b, c):
        ax.axvline(warmup, color="grey", linestyle=":")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(args, cfg: TrainConfig, samples: list[dict], served_at: float | None, audited: dict,
           loadavg_before: float) -> None:
    figures = judge(args, cfg, samples, served_at, audited)
    passed = all(g["passed"] for g in figures["gates"].values())
    plot(samples, figures["warmup_s"], BENCH_DIR / "soak.png")
    # Histograms kept sparse (bin: count), so the gates can be judged again from the JSON.
    kept = [{**{k: v for k, v in s.items() if k not in ("histogram", "failed_at")},
             "histogram": {int(i): int(c) for i, c in enumerate(s["histogram"]) if c}} for s in samples]
    write_json("soak", {"minutes": args.minutes, "rate": args.rate, "clients": args.clients,
                        "bad_fraction": BAD_FRACTION, "sample_every_s": args.sample_every,
                        "loadavg_1m_before": loadavg_before, "passed": passed, **figures, "samples": kept})
    g = figures["gates"]
    rows = [f"| {m['process']}{'' if m['gated'] else ' (not gated)'}{jvm_note(m)} | {m['rss_start_mib']:.0f} | "
            f"{m['rss_end_mib']:.0f} | {m['rss_max_mib']:.0f} | {m['growth_mib']:+.1f} | "
            f"{m['slope_mib_per_min']:+.2f} |"
            for m in figures["memory"]]
    text = "\n".join([
        f"`make soak`: {args.minutes:g} minutes at a steady {args.rate:,.0f} events/s ({BAD_FRACTION:.0%} malformed), "
        f"training with 2 workers and the default settings, the default Ray Serve scorer, {args.clients} clients "
        f"scoring single events back to back; a sample every {args.sample_every:g} s; trends judged after a "
        f"{figures['warmup_s']:.0f} s warm-up (the start-up backlog was learned at "
        f"{num(figures['backlog_learned_s'], '.0f')} s; warm-up ends a minute later, and not before a fifth of "
        f"the run). "
        f"1-min load average before the run: {loadavg_before}. {machine_line()}",
        "",
        "![lag, RSS by role and scoring latency over the soak](bench/soak.png)",
        "",
        "Resident memory per process after warm-up (MiB; slope by least squares; Ray's own GCS and raylet "
        "are shown, not gated):",
        "",
        "| process (role pid) | start | end | max | growth | slope MiB/min |", "|---|---:|---:|---:|---:|---:|",
        *rows,
    ])
    write_section("soak", "Soak: steady load for minutes (issue 15)", text)
    print(json.dumps({"passed": passed, "gates": g}, default=str, indent=1))
    if not passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
