"""The opt-in timeline: a Chrome trace per rank that separates ingest, compute and communication."""

from __future__ import annotations

import json

import pytest

from streamlearn.config import TrainConfig
from streamlearn.loadgen.generator import run_load
from streamlearn.observe.report import render_report
from streamlearn.train.trainer import run_dir, train

pytestmark = pytest.mark.integration

PHASES = {"plan", "wait_data", "fetch", "decode", "sync", "train", "forward", "backward", "step", "checkpoint"}
# How the ranks stay one model, as each shows: DDP's gradient buckets on their own track, or the
# window's one average of weights and moments on the training thread.
COMMUNICATION = {"step": "allreduce", "window": "average"}


@pytest.mark.parametrize("sync", ["window", "step"])
def test_timeline_has_every_phase_on_every_rank_and_the_run_reports(kafka, kafka_settings, ray_cluster, topic,
                                                                    tmp_path, sync):
    run_load(kafka.bootstrap, topic, partitions=4, count=6_000, bad_fraction=0.01, seed=11)
    phases = PHASES | {COMMUNICATION[sync]}
    cfg = TrainConfig(topic=topic, workers=2, sync=sync, cpus_per_worker=0.5, checkpoint_dir=str(tmp_path / "ckpt"),
                      run_name=f"timeline-{topic}", checkpoint_every_s=2.0, checkpoint_every_steps=10,
                      window_events=1000, batch_size=128, max_events=6_000, timeline=str(tmp_path / "trace"))
    summary = train(cfg, kafka_settings)
    assert summary["events_learned"] + summary["dead_lettered"] == 6_000

    for rank in (0, 1):
        events = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())  # Chrome's JSON array format
        spans = [e for e in events if e["ph"] == "X"]
        assert spans and all(e["pid"] == rank and e["dur"] >= 0 and isinstance(e["ts"], int) for e in spans)
        names = {e["name"] for e in spans}
        assert phases <= names, f"rank {rank} lacks {phases - names}"
        assert not (set(COMMUNICATION.values()) - {COMMUNICATION[sync]}) & names, "the other mode's spans"
        # DDP's communication on its own track; ingest on the reader thread; compute on the main thread.
        if sync == "step":
            assert {e["tid"] for e in spans if e["name"] == "allreduce"} == {"allreduce"}
            assert all(e["args"]["bytes"] > 0 for e in spans if e["name"] == "allreduce")
        reader_threads = {e["tid"] for e in spans if e["name"] in ("fetch", "decode")}
        compute_threads = {e["tid"] for e in spans if e["name"] in ("forward", "backward", "step")}
        assert reader_threads and compute_threads and not reader_threads & compute_threads
        # Every step does one forward, one backward and one optimizer step.
        counts = {n: sum(e["name"] == n for e in spans) for n in ("forward", "backward", "step")}
        assert counts["forward"] == counts["backward"] == counts["step"] > 0

    history = [json.loads(line) for line in (run_dir(cfg) / "history.jsonl").read_text().splitlines()]
    recorded = set().union(*(row["phases_s"] for row in history))  # per-phase seconds in history.jsonl too
    assert {"fetch", "decode", "forward", "backward", "step", COMMUNICATION[sync]} <= recorded
    paths = render_report(run_dir(cfg), tmp_path / "report")
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
