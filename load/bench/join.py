"""Join state at a million pending events: bytes per event, the cap, and what a join costs.

    python -m load.bench.join [--pending 1000000] [--runs 3]

Issue 16 asks for join state of at most 300 bytes per pending event at 1M pending, the cap
enforced. The fraud pipeline's events (43 float32 features) are added to a `JoinState` in
8,192-event batches, as a trainer would after decoding a window; then labels for a window's
worth of them join. Memory is counted two ways: the arrays the state holds (`nbytes`) and
everything Python allocated while it was built (tracemalloc; numpy reports its buffers to it),
over the events pending. Then the cap: 20 % more events than `max_pending`, and the state
must hold `max_pending` after `expire`, the rest counted as evicted. Time per event: hashing
the ids, adding the events, joining labels; the single-process training loop of
load/bench/ingest.py spends ~10 µs per event (96.8k events/s), which is the budget a join eats
into. The ingest figure with delayed labels (the join inside the trainer) is load/bench/ingest.py's.

Then checkpoints at the cap (`--checkpoints`): four partitions' states full at the default cap
(1M events in all), labels that never come, and between two checkpoints the events of 2 s at
40k events/s (the cap evicts as many), or, with `--label-share`, labels for that share of the
waiting events too. Each checkpoint is written both ways, in the same run: the whole state in
one .npz (what checkpoints held before), and the rows new since the checkpoint before plus which
wait (ingest/join_files.py); each hashed and fsynced as `checkpoint.publish` does, 30 kept.
Figures: what a rank hands rank 0 (bytes), the time to take it on the rank, the writer's time,
and the disk 30 checkpoints hold (hard-linked files counted once).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from load.bench.common import machine_line, median, write_json, write_section
from streamlearn.ingest.join import JoinState, join_keys
from streamlearn.ingest.join_files import JoinFiles, sha256
from streamlearn.ingest.labelled import Events, LabelJoin, Labels
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint as ckpt

BATCH = 8192
TARGET_BYTES = 300
INGEST_US_PER_EVENT = 1e6 / 96_800  # the single-process baseline of docs/bench/ingest.json, 2026-11-25


def one_run(pending: int, n_features: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    ids = [f"evt-{seed}-{i:09d}" for i in range(pending)]
    features = rng.standard_normal((pending, n_features), dtype=np.float32)
    crcs = rng.integers(0, 2**32, pending, dtype=np.uint32)
    def build() -> tuple[JoinState, float, float]:
        state, hash_s, add_s = JoinState(n_features, ttl_s=1e9, max_pending=pending), 0.0, 0.0
        for start in range(0, pending, BATCH):
            stop = min(pending, start + BATCH)
            t0 = time.perf_counter()
            keys = join_keys(ids[start:stop])
            t1 = time.perf_counter()
            state.add_events(keys, features[start:stop], crcs[start:stop], t=float(start))
            hash_s, add_s = hash_s + t1 - t0, add_s + time.perf_counter() - t1
        return state, hash_s, add_s

    # Memory with tracemalloc on (it slows every allocation), time in a second build without it.
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    state, _, _ = build()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del state
    gc.collect()
    state, hash_s, add_s = build()
    held, arrays = state.pending["events"], state.nbytes

    # Labels for a random window's worth of the pending events, in label-topic batches.
    chosen = rng.choice(pending, size=min(pending // 2, BATCH * 8), replace=False)
    label_keys = join_keys(ids[i] for i in chosen)
    t0 = time.perf_counter()
    joined = 0
    for start in range(0, len(chosen), BATCH):
        part = slice(start, start + BATCH)
        n = len(label_keys[part])
        joined += state.add_labels(label_keys[part], np.ones(n, np.float32), np.zeros(n, np.int32),
                                   np.arange(n, dtype=np.int64), t=float(pending)).size
    label_s = time.perf_counter() - t0
    assert joined == len(chosen), f"{joined} of {len(chosen)} labels joined"

    # The cap: top up to 20 % more than max_pending waiting; the oldest go, counted.
    extra = pending // 5
    top_up = pending - state.pending["events"] + extra
    more = [f"more-{seed}-{i:09d}" for i in range(top_up)]
    for start in range(0, top_up, BATCH):
        stop = min(top_up, start + BATCH)
        state.add_events(join_keys(more[start:stop]), features[start % pending:start % pending + stop - start],
                         crcs[start % pending:start % pending + stop - start], t=float(pending + 1))
    gone = state.expire(now=float(pending + 2))
    return {
        "pending": held,
        "bytes_per_pending_event_arrays": arrays / held,
        "bytes_per_pending_event_traced": traced / held,
        "hash_us_per_event": 1e6 * hash_s / pending,
        "add_us_per_event": 1e6 * add_s / pending,
        "label_join_us_per_label": 1e6 * label_s / len(chosen),
        "cap": {"max_pending": pending, "added_beyond": extra, "pending_after_expire": state.pending["events"],
                "evicted": sum(e.count for e in gone["events"]), "counted": state.expired.get("events.cap", 0)},
    }


PARTITIONS, KEEP, PER_CHECKPOINT = 4, 30, 80_000  # 2 s at 40k events/s, a checkpoint's worth


def _disk(run_dir: Path) -> int:
    """Bytes the files under `run_dir` hold, each inode once (hard links share theirs)."""
    seen = {}
    for path in run_dir.rglob("*"):
        if path.is_file():
            st = path.stat()
            seen[st.st_ino] = st.st_size
    return sum(seen.values())


def _whole(run_dir: Path, version: int, snapshot: dict) -> None:
    """The checkpoints before: the whole join state in one .npz, hashed and fsynced."""
    staging = run_dir / f".staging-{version}"
    staging.mkdir()
    np.savez(staging / "join.npz", **snapshot)
    sha256(staging / "join.npz")
    fd = os.open(staging / "join.npz", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.rename(staging, run_dir / f"checkpoint_{version:09d}")
    for old in sorted(run_dir.glob("checkpoint_*"))[:-KEEP]:
        shutil.rmtree(old)


def checkpoint_run(total: int, n_features: int, label_share: float, checkpoints: int, seed: int,
                   where: str | None) -> dict:
    from streamlearn.pipeline import JoinedLabels
    from streamlearn.schema import Field, Schema

    spec = JoinedLabels(Schema("label", (Field("event_id", "str"), Field("label", "bool"))), ttl_s=1e12,
                        max_pending=total)
    rng = np.random.default_rng(seed)
    join, files, n = LabelJoin(spec, n_features, PARTITIONS), JoinFiles(), 0
    features = rng.standard_normal((BATCH, n_features), dtype=np.float32)

    def events(count: int) -> None:
        nonlocal n
        for start in range(0, count, BATCH):
            k = min(BATCH, count - start)
            keys = join_keys(f"evt-{seed}-{i:010d}" for i in range(n, n + k))
            part = np.arange(n, n + k) % PARTITIONS
            batch = {p: Events(keys[part == p], features[:k][part == p], np.zeros(int((part == p).sum()), np.uint32),
                               np.full(int((part == p).sum()), float(n)), None) for p in range(PARTITIONS)}
            join.window(batch, {})
            n += k

    def labels(share: float) -> None:
        """Labels for `share` of the events waiting in each partition, picked at random."""
        out = {}
        for p, state in join.states.items():
            side = state.events
            waiting = side.cols["key"][side.head:side.n][side.alive[side.head:side.n]]
            pick = rng.choice(waiting, int(len(waiting) * share), replace=False)
            out[p] = Labels(pick, np.ones(len(pick), np.float32), np.zeros(len(pick), np.int64),
                            np.zeros(len(pick), "S160"), np.full(len(pick), float(n)))
        join.window({}, out)

    events(total + PER_CHECKPOINT)  # full, and the cap evicting
    rows = {"whole": [], "delta": []}
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        whole_dir, delta_dir = Path(tmp, "whole"), Path(tmp, "delta")
        whole_dir.mkdir()
        delta_dir.mkdir()
        for version in range(1, checkpoints + 1):
            events(PER_CHECKPOINT)
            if label_share:
                labels(label_share)
            t = time.perf_counter()
            snapshot = join.snapshot()
            taken = time.perf_counter() - t
            t = time.perf_counter()
            _whole(whole_dir, version, snapshot)
            rows["whole"].append({"taken_s": taken, "write_s": time.perf_counter() - t,
                                  "handed_bytes": sum(a.nbytes for a in snapshot.values())})
            t = time.perf_counter()
            delta = join.delta()
            taken = time.perf_counter() - t
            t = time.perf_counter()
            ckpt.publish(delta_dir, version, {}, None, {"version": version}, join=(files, delta))
            ckpt.prune(delta_dir, KEEP)
            rows["delta"].append({"taken_s": taken, "write_s": time.perf_counter() - t,
                                  "handed_bytes": sum(a.nbytes for a in delta.values())})
        disk = {"whole": _disk(whole_dir), "delta": _disk(delta_dir)}
    steady = {how: {k: median([r[k] for r in rs[checkpoints // 2:]]) for k in rs[0]} for how, rs in rows.items()}
    return {"pending": sum(join.pending.values()), "label_share": label_share, "checkpoints": checkpoints,
            **{how: {**steady[how], "disk_bytes": disk[how]} for how in rows}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=40, help="checkpoints written at the cap (0: none)")
    parser.add_argument("--label-share", type=float, default=0.05,
                        help="share of the waiting events labelled between two checkpoints, in the second case")
    parser.add_argument("--dir", help="where the checkpoints go (default: the system's temporary directory)")
    args = parser.parse_args()
    n_features = load_pipeline("fraud").n_features
    at_cap = [checkpoint_run(args.pending, n_features, share, args.checkpoints, seed, args.dir)
              for share in (0.0, args.label_share) for seed in range(1, args.runs + 1)] if args.checkpoints else []
    for r in at_cap:
        print(r)
    runs = [one_run(args.pending, n_features, seed) for seed in range(1, args.runs + 1)]
    for r in runs:
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
    figures = {k: median([r[k] for r in runs]) for k in runs[0] if k not in ("pending", "cap")}
    join_us = figures["hash_us_per_event"] + figures["add_us_per_event"] + figures["label_join_us_per_label"]
    cap_ok = all(r["cap"]["pending_after_expire"] <= r["cap"]["max_pending"]
                 and r["cap"]["evicted"] == r["cap"]["counted"] == r["cap"]["added_beyond"] for r in runs)
    result = {
        "pending": args.pending, "n_features": n_features, "runs": runs, **figures,
        "join_us_per_event": join_us, "target_bytes": TARGET_BYTES,
        "met": figures["bytes_per_pending_event_traced"] <= TARGET_BYTES and cap_ok, "cap_enforced": cap_ok,
        "checkpoints_at_cap": _at_cap(at_cap),
    }
    write_json("join", result)
    write_section("join", "Join state for delayed labels (issue 16)", f"""
`python -m load.bench.join`: the fraud pipeline's events ({n_features} float32 features) added to a
`JoinState` in {BATCH:,}-event batches until {args.pending:,} wait for their labels; then {BATCH * 8:,}
labels (or half the events, if fewer) join; then events until 20 % more than the cap wait.
Medians of {args.runs} runs. {machine_line()}

**Bytes per pending event: {figures['bytes_per_pending_event_traced']:.0f}** (everything Python
allocated while the state was built, tracemalloc, over the events pending; target ≤ {TARGET_BYTES}:
{'met' if figures['bytes_per_pending_event_traced'] <= TARGET_BYTES else 'not met'}). Cap: after
`expire`, every run held exactly `max_pending` and counted each evicted event
({'held' if cap_ok else 'BROKEN'}).

Time per event: hashing its id {figures['hash_us_per_event']:.2f} µs, adding it
{figures['add_us_per_event']:.2f} µs, joining its label {figures['label_join_us_per_label']:.2f} µs:
{join_us:.2f} µs in all, against ~{INGEST_US_PER_EVENT:.1f} µs per event for the whole
single-process training loop (load/bench/ingest.py's baseline). That bounds the join's share of
ingest; the ingest figure with delayed labels, the join inside the trainer, is in
load/bench/ingest.py's section.
""")
    if at_cap:
        write_section("join_checkpoints", "Join state in checkpoints, at the cap (issue 16)", _at_cap_text(
            result["checkpoints_at_cap"], args))
    print(f"bytes/pending event {figures['bytes_per_pending_event_traced']:.0f}, join {join_us:.2f} µs/event, "
          f"cap {'held' if cap_ok else 'BROKEN'}")


def _at_cap(runs: list[dict]) -> dict:
    """Medians over the runs of each case (labels that never come; a share labelled)."""
    out = {}
    for share in sorted({r["label_share"] for r in runs}):
        case = [r for r in runs if r["label_share"] == share]
        out[f"label_share_{share:g}"] = {"runs": case, "pending": case[0]["pending"], **{
            how: {k: median([r[how][k] for r in case]) for k in case[0][how]} for how in ("whole", "delta")}}
    return out


def _at_cap_text(cases: dict, args) -> str:
    lines = ["| labels between checkpoints | written as | handed to rank 0 | taken on the rank | "
             f"writer (write, hash, fsync) | disk, {KEEP} kept |", "|---|---|---|---|---|---|"]
    for name, case in cases.items():
        share = float(name.rsplit("_", 1)[1])
        for how in ("whole", "delta"):
            f = case[how]
            labels = "none" if not share else f"{share:.0%} of those waiting"
            written = "whole state" if how == "whole" else "new rows + bits"
            lines.append(f"| {labels} | {written} | {f['handed_bytes'] / 1e6:.1f} MB | {1e3 * f['taken_s']:.0f} ms | "
                         f"{1e3 * f['write_s']:.0f} ms | {f['disk_bytes'] / 1e9:.2f} GB |")
    return f"""
`python -m load.bench.join` (`--checkpoints {args.checkpoints}`): {PARTITIONS} partitions' join states
at the default cap ({args.pending:,} events in all), then {PER_CHECKPOINT:,} events between two
checkpoints (2 s at 40k events/s; the cap evicts as many), written both ways in the same run: the
whole state in one .npz, hashed and fsynced (how checkpoints held it before), and
`ingest/join_files.py`'s new rows plus the bits of which wait, segments hard-linked on, through
`checkpoint.publish`. Medians over the second half of the checkpoints, then over {args.runs} runs.
{machine_line()}

{chr(10).join(lines)}

{(chr(10) * 2).join(_ratios(cases))}

Disk with {KEEP} kept is what those {KEEP} checkpoints reference between
them: with labels that never come, the cap evicts the oldest, so the oldest kept checkpoint
still holds rows that arrived {KEEP - 1} intervals before the newest (1M + {KEEP - 1} × 80k rows in all), each
once; written whole, each checkpoint held its own copy of all 1M.
"""


def _ratios(cases: dict) -> list[str]:
    out = []
    for name, case in cases.items():
        w, d = case["whole"], case["delta"]
        share = float(name.rsplit("_", 1)[1])
        out.append(f"{'Labels that never come' if not share else f'{share:.0%} labelled'}: "
                   f"{w['handed_bytes'] / d['handed_bytes']:.0f}× less handed to rank 0, taken "
                   f"{w['taken_s'] / d['taken_s']:.0f}× faster, written {w['write_s'] / d['write_s']:.1f}× faster, "
                   f"{w['disk_bytes'] / d['disk_bytes']:.1f}× less disk.")
    return out


if __name__ == "__main__":
    main()
