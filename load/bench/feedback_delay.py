"""Does the trainer's memory grow with the reports' delay? The same events, their chargebacks a
median 1 day late on one pair of topics and 30 days late on another, learned in the same run.

    python -m load.bench.feedback_delay [--days 90] [--runs 3]

Both streams are the generator's on its compressed clock (`streamlearn load --simulated-clock`: an
event every 4 s of event time, 21,600 a simulated day, Kafka timestamps in that time), each fraud's
chargeback after a log-normal delay (sigma 1, the bench's and the README's heavy tail) naming its
event's partition and offset. `fraud_chargebacks` learns every event at once and each reported
event again when its chargeback comes, finding its features in the rank's row store
(streamlearn/ingest/rowstore.py; `30d-re-read`: with `--no-feedback-rows`, re-reading the event
from Kafka, a month back into the topic). The trainer holds no event while it waits, so its
memory should not depend on the delay: each run samples the resident memory of its Ray Train
worker every 0.5 s and reads its last checkpoint's size and the row store's on disk. Runs
alternate between the contenders; defaults a user gets, 1 worker. The issue's bars: RSS within
5 % at 30 days of 1 day, checkpoint size independent of the delay, and learning >= 0.9x inline.
A bounded run reads both topics to their ends, so both streams apply every chargeback (recorded:
`reports_applied`), the 30-day one mostly after its last event.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import psutil

from load.bench.common import Sampler, bench_broker, start_bench_ray, write_json, write_section
from load.bench.ingest import PARTITIONS, pipeline_rate
from streamlearn.ingest.rowstore import ROWS_DIR
from streamlearn.kafka.admin import ensure_topics
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.labels import SIMULATED_TOPIC_CONFIG, LabelPlan, parse_label_delay
from streamlearn.rundir import checkpoint

DELAYS_DAYS = (1, 30)
EVENTS_PER_DAY = 21_600
BAR = 0.05  # the issue's: RSS at the longest delay within 5 % of the shortest's
INGEST_BAR = 0.9  # the issue's: delayed feedback learns >= 0.9x what inline labels do


def topic_for(days: int | None) -> str:
    return "bench-delay-inline" if days is None else f"bench-delay-{days}d"


def contender(days: int | None) -> str:
    return "inline" if days is None else f"{days}d"


# name -> (the reports' median delay in days, None: labels inline; the row store on). The
# re-read contender is the store's baseline: the same stream as the longest delay's, every
# report's event read again from Kafka (the way before the store, and `--no-feedback-rows`).
RE_READ = f"{DELAYS_DAYS[-1]}d-re-read"
CONTENDERS: dict[str, tuple[int | None, bool]] = {
    **{contender(d): (d, True) for d in (None, *DELAYS_DAYS)}, RE_READ: (DELAYS_DAYS[-1], False)}


class WorkerMemory(Sampler):
    """The resident memory of this process's Ray Train workers, sampled until stopped."""

    def __init__(self, every_s: float = 0.5):
        super().__init__(every_s)
        self.samples: list[int] = []
        self.times: list[float] = []

    def sample(self) -> None:
        total = 0
        for proc in psutil.Process(os.getpid()).children(recursive=True):
            try:
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::RayTrainWorker"):
                    total += proc.memory_info().rss
            except psutil.Error:  # gone between the listing and the read
                continue
        if total:
            self.samples.append(total)
            self.times.append(time.monotonic())


def rotated(names: list[str], r: int) -> list[str]:
    """Round r's order: each round starts one contender later, so that no contender always runs
    right after the same one (a run that wrote a 0.5-GB row store leaves the next its writeback)."""
    return names[r % len(names):] + names[:r % len(names)]


def dirty_kib() -> int | None:
    """The page cache's data not yet written back (Linux), as a run starts."""
    try:
        return next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("Dirty:"))
    except (OSError, StopIteration):
        return None


def disk_bytes(directory: Path) -> int:
    """What the files under `directory` take on disk (the row store's are sparse)."""
    return sum(f.stat().st_blocks * 512 for f in directory.rglob("*") if f.is_file()) if directory.is_dir() else 0


def checkpoint_size(run_dir: Path) -> dict:
    newest = checkpoint.newest(run_dir)
    files = {f.name: f.stat().st_size for f in newest.iterdir() if f.is_file()}
    meta = json.loads((newest / "meta.json").read_text())
    counters = meta.get("counters", {})
    # Every learned row past the events' own (each learned once as legitimate) is a report applied.
    # The gate's evidence (train/evidence.py) is the events matured since the checkpoint before,
    # at most its cap: its size follows when the last checkpoint fell, not the delay. The state
    # that could grow with the delay is the rest (the model, its optimizer, the join state).
    evidence = files.get("evidence.npz", 0)
    return {"bytes": sum(files.values()), "state_bytes": sum(files.values()) - evidence, "evidence_bytes": evidence,
            "files": files, "join_npz_bytes": files.get("join.npz", 0), "counters": counters,
            "reports_applied": counters.get("learned", 0) - counters.get("defaulted", 0)}


def one_run(bootstrap: str, events: int, home: Path, name: str) -> dict:
    days, rows = CONTENDERS[name]
    pipeline = "fraud" if days is None else "fraud_chargebacks"
    with WorkerMemory() as memory:
        # No standby: a failure standby started during one run (autoscale/warmpool.py) becomes the
        # next run's worker, and its RSS would carry that run's history into this one's figures.
        result = pipeline_rate(bootstrap, events, 1, home, topic=topic_for(days), pipeline=pipeline, warm_pool=False,
                               feedback_rows=rows)
    run_dir = Path(result["checkpoint_dir"]) / result["run_name"]
    return {"contender": name, "events_per_s": result["steady_events_per_s"], "learned": result["learned"],
            "rss_peak_mib": max(memory.samples) / 2**20, "rss_median_mib": statistics.median(memory.samples) / 2**20,
            "rss_last_mib": memory.samples[-1] / 2**20, "rss_samples": len(memory.samples),
            # Where a peak falls: (seconds since the first sample, MiB), every 4th sample.
            "rss_timeline_mib": [(round(t - memory.times[0], 1), round(v / 2**20)) for t, v in
                                 zip(memory.times[::4], memory.samples[::4], strict=True)],
            "checkpoint": checkpoint_size(run_dir), "rows_disk_bytes": disk_bytes(run_dir / ROWS_DIR),
            "rank0_phases_s": {k: round(v, 3) for k, v in result["rank0_phases_s"].items()}}


def produce(bootstrap: str, settings, events: int, only: int | None | str = "all") -> dict[str, int]:
    """The same events (seed 11) on each contender's topics (or `only` one's); chargebacks -> how
    many were sent."""
    wanted = (None, *DELAYS_DAYS) if only == "all" else (only,)
    names = [topic_for(d) for d in wanted]
    # Simulated times start at 2026-01-01: the broker's time retention would delete them.
    ensure_topics(settings, {t: PARTITIONS for n in names for t in (n, f"{n}.labels")}, SIMULATED_TOPIC_CONFIG)
    ensure_topics(settings, {f"{t}.dlq": 1 for n in names for t in (n, f"{n}.labels")})
    if None in wanted:
        run_load(bootstrap, topic_for(None), partitions=PARTITIONS, count=events, seed=11)
    sent = {}
    for d in (d for d in wanted if d is not None):
        plan = LabelPlan(parse_label_delay(f"lognormal:{d}d:1"), fraud_only=True, simulated=True)
        sent[contender(d)] = run_load(bootstrap, topic_for(d), partitions=PARTITIONS, count=events, seed=11,
                                      labels=plan)["labels"]["sent"]
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=90.0, help="simulated days of events")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", choices=list(CONTENDERS),
                        help="only produce and run this contender once, printing its phases (writes nothing)")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return
    import ray

    events = int(args.days * EVENTS_PER_DAY)
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    loadavg_before = os.getloadavg()[0]
    with bench_broker() as (home, broker, settings):
        sent = produce(broker.bootstrap, settings, events)
        start_bench_ray()
        previous = None
        for r in range(args.runs):  # alternating: this machine's speed drifts within minutes
            for name in rotated(list(CONTENDERS), r):
                dirty = dirty_kib()
                runs[name].append({**one_run(broker.bootstrap, events, home, name), "round": r, "after": previous,
                                   "dirty_kib_at_start": dirty})
                previous = name
                print(json.dumps({k: v for k, v in runs[name][-1].items() if k != "checkpoint"}), flush=True)
        ray.shutdown()
    figures = {**summarize(runs), "days": args.days, "events": events, "runs": args.runs,
               "delays_days": list(DELAYS_DAYS), "reports_sent": sent, "loadavg_before": loadavg_before}
    write_json("feedback_delay", figures)
    write_doc(figures)


def write_doc(figures: dict) -> None:
    """The BENCHMARKS section: the table from the JSON, then how it was measured and what it says."""
    write_section("feedback_delay", "Delayed feedback at a bank's delays: trainer memory and speed",
                  f"`python -m load.bench.feedback_delay --days {figures['days']:g} --runs {figures['runs']}`: "
                  f"{figures['events']:,} events ({figures['days']:g} simulated days) on the generator's compressed "
                  "clock, each fraud's chargeback after a log-normal delay (sigma 1) of median 1 or 30 simulated "
                  "days, learned by `fraud_chargebacks` on 1 worker with the defaults (the row store on); "
                  f"`{RE_READ}` is the 30-day stream with `--no-feedback-rows` (every chargeback's event re-read from "
                  "Kafka: the way before the row store); `inline` is `fraud` on the same events carrying their label. "
                  "Contenders alternate, each round starting one contender later. Resident memory: the Ray Train "
                  "worker's, sampled every 0.5 s; the row store: "
                  "its files' blocks on disk at the run's end. Each run reads both topics to their ends: every "
                  "chargeback is applied, the 30-day stream's mostly after its last event.\n\n" + NOTES)


def profile(args: argparse.Namespace) -> None:
    days = CONTENDERS[args.profile][0]
    with bench_broker() as (home, broker, settings):
        produce(broker.bootstrap, settings, int(args.days * EVENTS_PER_DAY), only=days)
        start_bench_ray()
        print(json.dumps(one_run(broker.bootstrap, int(args.days * EVENTS_PER_DAY), home, args.profile), indent=1))


NOTES = ("What the figures say. Memory: the worker's RSS is flat from its first seconds and the same at either "
         "delay, and so is the checkpoint but for the gate's evidence (the events matured since the checkpoint "
         "before, at most its cap: its size follows where the run's last checkpoint fell): no event waits, the "
         "features of the events learned are on disk (streamlearn/ingest/rowstore.py, read with pread, so not in "
         "the RSS), and the state is the reported offsets. Speed: each chargeback's event is one row read from the"
         " rank's own store, checked by offset and id; the price is every learned event's row (256 bytes, one "
         "write per partition a window, by the store's own thread while the rank learns: a write into new pages "
         "costs this VM ~0.6 us a row) and the disk, which grows with the events topic's retention, not with "
         "the delay. The re-read contender shows what the store replaced: a seek and a fetch of Kafka per "
         "chargeback, about 16 a 1,000 events at the generator's fraud rate, more than learning the 1,000 events. "
         "These topics are read as a catch-up (both produced before the run): the planner takes the reports' "
         "backlog at the events' pace, which puts a report a median delay ahead of its event; such a report waits "
         "for the window that learns its event (held in the checkpoint's join state), where the first version of "
         "the store missed and re-read it.\n")


def summarize(runs: dict[str, list[dict]]) -> dict:
    med = {name: {"rss_peak_mib": statistics.median(r["rss_peak_mib"] for r in rs),
                  "rss_median_mib": statistics.median(r["rss_median_mib"] for r in rs),
                  "checkpoint_bytes": statistics.median(r["checkpoint"]["bytes"] for r in rs),
                  "state_bytes": statistics.median(r["checkpoint"]["state_bytes"] for r in rs),
                  "evidence_bytes": statistics.median(r["checkpoint"]["evidence_bytes"] for r in rs),
                  "join_npz_bytes": statistics.median(r["checkpoint"]["join_npz_bytes"] for r in rs),
                  "reports_applied": statistics.median(r["checkpoint"]["reports_applied"] for r in rs),
                  "events_per_s": statistics.median(r["events_per_s"] for r in rs),
                  "rows_disk_bytes": statistics.median(r.get("rows_disk_bytes", 0) for r in rs)}
           for name, rs in runs.items()}
    short, long_ = med[contender(DELAYS_DAYS[0])], med[contender(DELAYS_DAYS[-1])]
    rss_ratio = long_["rss_peak_mib"] / short["rss_peak_mib"]
    # The peak falls in a run's first ~25 s (start-up and the backlog's first windows); after
    # that each run's RSS stays flat at about its median.
    median_ratio = long_["rss_median_mib"] / short["rss_median_mib"]
    vs_inline = {name: m["events_per_s"] / med["inline"]["events_per_s"] for name, m in med.items()}
    return {"medians": med, "rss_peak_ratio": rss_ratio, "rss_median_ratio": median_ratio, "bar": BAR,
            "met": abs(rss_ratio - 1) <= BAR, "met_on_median": abs(median_ratio - 1) <= BAR,
            "vs_inline": vs_inline, "ingest_bar": INGEST_BAR,
            "ingest_met": all(v >= INGEST_BAR for name, v in vs_inline.items() if name not in ("inline", RE_READ)),
            "per_run": runs}


if __name__ == "__main__":
    main()
