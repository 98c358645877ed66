"""Model state is exactly-once, not just the counters.

The same topic is trained twice with the same world size and seed: once without a fault, once
with a worker SIGKILLed mid-window by an aimed fault (streamlearn/faults.py) and Ray Train
restoring the group from the newest checkpoint. Both must end at the same per-partition offsets
with the same fingerprint and the same model and optimizer state, bit for bit: a replayed window
learned twice, a step lost, or a restore that left any state behind would show as a difference.
Bitwise is the right bar: each window's shuffle is seeded by its offsets, the two ranks' gradients
are summed in a fixed order (a sum of two floats does not depend on the order), and torch runs
one thread per worker, so nothing but the restore separates the two runs.

With delayed feedback (`fraud_chargebacks`) the chargebacks on `<topic>.labels` are read across the
kill too: a report applied before the restored checkpoint must not be applied again after it (the
reported offsets are in the checkpoint), nor one after it lost.
"""

from __future__ import annotations

import pytest
import torch

from streamlearn import faults
from streamlearn.kafka.admin import ensure_topics
from streamlearn.loadgen.generator import run_load
from streamlearn.loadgen.labels import LabelPlan, parse_label_delay
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.train.trainer import run_dir, train

from .test_delayed_feedback import assert_feedback_exactly_once
from .test_training import assert_exactly_once, config

pytestmark = pytest.mark.integration


def _final_state(cfg) -> tuple[dict, dict, dict]:
    model, optimizer, meta = ckpt.load(ckpt.newest(run_dir(cfg)))
    return model, optimizer, meta


# The plain pipeline's form in `make test-all` only: fraud_chargebacks replays the same model,
# optimizer and stream, and its join and matured-label state besides.
@pytest.mark.parametrize("pipeline", [pytest.param("fraud", marks=pytest.mark.extended), "fraud_chargebacks"])
def test_a_killed_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(kafka, kafka_settings, ray_cluster,
                                                                                 topic, tmp_path, monkeypatch,
                                                                                 pipeline):
    chargebacks = None
    if pipeline == "fraud_chargebacks":  # each fraud's chargeback 0-0.5 s after it, naming its offset
        ensure_topics(kafka_settings, {f"{topic}.labels": 4})
        chargebacks = LabelPlan(parse_label_delay("uniform:0:0.5"), fraud_only=True)
    run_load(kafka.bootstrap, topic, partitions=4, count=30_000, bad_fraction=0.02, seed=21, labels=chargebacks)
    # Small windows and frequent checkpoints: the kill falls well inside the run, after a checkpoint.
    common = dict(window_events=1000, checkpoint_every_steps=8, checkpoint_every_s=3600.0, until_idle_s=1.0,
                  max_failures=3, pipeline=pipeline)
    clean = config(tmp_path / "clean", topic, run_name="clean", group_id="replay-clean", **common)
    train(clean, kafka_settings)

    # Its own dead-letter topic: a new lineage skips dead letters another one already wrote.
    killed = config(tmp_path / "killed", topic, run_name="killed", group_id="replay-killed",
                    dlq_topic=f"{topic}.dlq-killed", **common)
    # Rank 1's 90th optimizer step: mid-window. With delayed feedback also the first group's second
    # checkpoint, once durable and before its offsets are committed: the reports held back from
    # learning and the reported offsets are in it, and the group after must not apply either again.
    spec = "step@rank1#90" + (",after_publish_before_commit@rank0#2" if chargebacks else "")
    monkeypatch.setenv("STREAMLEARN_FAULT", spec)
    summary = train(killed, kafka_settings)
    for fault in spec.split(","):
        assert faults.mark_of(run_dir(killed), fault).exists(), f"the fault {fault} never fired"
    assert summary["lineage_learned"] == summary["events_learned"]

    model_a, opt_a, meta_a = _final_state(clean)
    model_b, opt_b, meta_b = _final_state(killed)
    # A restore, not a deterministic rerun from offset 0: the group after the kill started from a
    # checkpoint the first group wrote mid-run.
    assert meta_a["restored_from"] is None
    assert 0 < meta_b["restored_from"] < meta_b["version"], meta_b["restored_from"]
    assert meta_b["offsets"] == meta_a["offsets"]
    assert meta_b["counters"] == meta_a["counters"]
    if chargebacks is None:  # and both equal what is really in the topic(s)
        assert_exactly_once(kafka_settings, killed)
    else:
        assert assert_feedback_exactly_once(kafka_settings, killed)["want"]["applied"] > 100
    assert model_a.keys() == model_b.keys()
    for name in model_a:
        assert torch.equal(model_a[name], model_b[name]), f"weights differ after the replay: {name}"
    for param, state in opt_a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, opt_b["state"][param][key]), f"optimizer state differs: {param}.{key}"
