"""Aimed faults: a worker killed exactly where exactly-once usually breaks, not where a timer falls.

Each case trains a topic with bad events in it while one named fault point (streamlearn/faults.py)
SIGKILLs a worker; Ray Train restarts the group from the newest checkpoint on disk, and the run
must end learned == produced − dead-lettered with the fingerprint of the topic, every bad event in
the dead-letter topic exactly once, and the consumer group's offsets equal to the checkpoint's.
"""

from __future__ import annotations

import pytest

from load.generator import run_load
from streamlearn.train.trainer import run_dir, train

from .test_training import assert_exactly_once, config

CASES = {
    # The checkpoint is durable, the group's offsets are not committed: the restart must resume
    # from that checkpoint (not from the committed offsets) and commit them itself.
    "after_publish_before_commit@rank0#2": "after publish, before commit",
    # model.pt and meta.json written, the checksum file (completion mark) not: the restore must
    # pass over the torn checkpoint and replay from the one before.
    "mid_checkpoint_write@rank0#2": "mid checkpoint write",
    # Queued for the writer, nothing on disk: the windows since the last checkpoint are replayed.
    "before_checkpoint_write@rank0#2": "before the checkpoint write",
    # Rank 1's dead letters sent but not flushed: a replay must not write any of them twice.
    "before_dead_letter_flush@rank1#2": "before the dead-letter flush",
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault,ingest", [
    *((fault, "direct") for fault in CASES),
    # The checkpoint writer is the same code in both modes; what Ray Data changes is where dead
    # letters are written (its decode stage, a window ahead) and who commits after a publish.
    *((fault, "ray-data") for fault in CASES if fault.startswith(("after_publish", "before_dead_letter"))),
], ids=lambda v: CASES.get(v, v))
def test_exactly_once_through_an_aimed_kill(kafka, kafka_settings, ray_cluster, topic, tmp_path, monkeypatch, fault,
                                            ingest):
    run_load(kafka.bootstrap, topic, partitions=4, count=16_000, bad_fraction=0.03, seed=31)
    cfg = config(tmp_path, topic, window_events=1000, checkpoint_every_steps=8, checkpoint_every_s=3600.0,
                 until_idle_s=3.0, max_failures=2, ingest=ingest)
    monkeypatch.setenv("STREAMLEARN_FAULT", fault)
    summary = train(cfg, kafka_settings)
    fired = run_dir(cfg) / ".faults" / fault.replace("@", "-").replace("#", "-")
    assert fired.exists(), f"the fault {fault} never fired"
    meta = assert_exactly_once(kafka_settings, cfg)
    assert summary["lineage_learned"] == meta["counters"]["learned"]
