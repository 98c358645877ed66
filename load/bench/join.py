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
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np

from load.bench.common import machine_line, median, write_json, write_section
from streamlearn.ingest.join import JoinState, join_keys
from streamlearn.pipeline import load_pipeline

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n_features = load_pipeline("fraud").n_features
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
    print(f"bytes/pending event {figures['bytes_per_pending_event_traced']:.0f}, join {join_us:.2f} µs/event, "
          f"cap {'held' if cap_ok else 'BROKEN'}")


if __name__ == "__main__":
    main()
