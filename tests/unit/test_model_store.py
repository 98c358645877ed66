"""The serving model store without Ray: integrity, quality gate, weight sanity, pin, order."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from streamlearn.errors import CheckpointError, ConfigError
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint
from streamlearn.serve.config import ServeConfig
from streamlearn.serve.gate import metric_problem, weights_problem
from streamlearn.serve.model_store import ModelStore, pin_version, read_pin, unpin
from tests import trained

FRAUD = load_pipeline("fraud")
AMOUNT = load_pipeline("amount")


def write_checkpoint(run_dir: Path, version: int, *, pipeline=FRAUD, metric: float | None = 0.8,
                     scale: float = 1.0, fill: float | None = None, quality: str | None = None) -> Path:
    """`quality` ("good" or "bad"): a really trained fraud model (tests/trained.py) with the evidence the
    trainer writes, fresh events it scored; without, random weights and no evidence."""
    torch.manual_seed(version)
    state = pipeline.build_model().state_dict() if quality is None else trained.state(quality)
    state = {k: (torch.full_like(v, fill) if fill is not None and k.endswith("weight") else v * scale)
             for k, v in state.items()}
    evidence = trained.evidence(state, seed=version) if quality is not None else None
    name, _ = ("auc", True) if pipeline.task == "classification" else ("mae", False)
    online = {"window": 1000} | ({name: metric} if metric is not None else {})
    meta = {"version": version, "offsets": {"0": 100 * version}, "counters": {"learned": 100 * version},
            "metrics": {"online": online, "train_loss": 0.3}, "pipeline": pipeline.describe(),
            "written_at": time.time(), "topic": "transactions"}
    return checkpoint.write(run_dir / f"checkpoint_{version:09d}", state, None, meta, evidence=evidence)


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "fraud"


@pytest.fixture
def store(run_dir) -> ModelStore:
    return ModelStore(FRAUD, run_dir)


def test_no_checkpoint_means_no_model(store):
    assert store.poll_once() is False
    assert store.current is None


def test_first_good_checkpoint_serves_and_scores(store, run_dir):
    write_checkpoint(run_dir, 1)
    assert store.poll_once() is True
    served = store.current
    assert served.version == 1 and served.trained_through == {"0": 100}
    x = torch.from_numpy(FRAUD.features([]).reshape(0, FRAUD.n_features))
    assert served.model(x).shape == (0,)
    assert not any(p.requires_grad for p in served.model.parameters())


def test_a_lucky_approved_metric_is_no_ratchet(store, run_dir):
    """Issue 44: v1 was approved on a lucky window (0.99); the candidates after it score 0.93 on
    windows of their own. Judged on the same events as v1, none is worse, so each is served; the
    metric-against-metric gate refused every one of them."""
    write_checkpoint(run_dir, 1, quality="good", metric=0.99)
    assert store.poll_once() and store.current.version == 1
    for version in range(2, 6):
        write_checkpoint(run_dir, version, quality="good", metric=0.93)
        assert store.poll_once(), store.last_rejection
        assert store.current.version == version
        evidence = store.ledger.read(version).evidence
        assert evidence["hold"] is False and evidence["events"] == 4096 and evidence["positives"] >= 30
        assert evidence["metric"] == "auc" and evidence["candidate"] > 0.8
    assert store.rejections == {}


def test_a_truly_worse_candidate_is_held(store, run_dir):
    """Learned on shuffled labels: its own window even reports a fine metric, the same events show it."""
    write_checkpoint(run_dir, 1, quality="good")
    store.poll_once()
    write_checkpoint(run_dir, 2, quality="bad", metric=0.95)
    assert store.poll_once() is False and store.current.version == 1
    rejected = store.ledger.read(2)
    assert rejected.kind == "quality" and rejected.compared_with == 1
    assert rejected.evidence["hold"] is True and rejected.evidence["better_by"] < -0.2
    assert "on the same 4096 events" in rejected.reason and "worse by more than 0.02" in rejected.reason
    write_checkpoint(run_dir, 3, quality="good")
    assert store.poll_once() and store.current.version == 3  # judged against v1, not the refused v2
    assert store.ledger.read(3).compared_with == 1


def test_a_stale_served_model_is_replaced_on_fresh_events(store, run_dir):
    """A resumed lineage serving a model the stream has left behind (here: one that learned nothing,
    approved as the lineage's first) is judged again by every candidate, on the candidate's events."""
    write_checkpoint(run_dir, 1, quality="bad", metric=0.99)
    assert store.poll_once()
    write_checkpoint(run_dir, 2, quality="good", metric=0.9)
    assert store.poll_once() and store.current.version == 2
    assert store.ledger.read(2).evidence["better_by"] > 0.2


def test_a_served_version_that_fails_callers_is_replaced(store, run_dir):
    """The evaluator's served quality counts: v1's answers score 0.55 for callers, below the floor,
    so a candidate that would be held against v1's score on the trainer's events is served."""
    write_checkpoint(run_dir, 1, quality="good")
    store.poll_once()
    (run_dir / "served.jsonl").write_text(json.dumps(
        {"t": time.time(), "versions": {"1": {"window": 3000, "auc": 0.55}}, "overall": {}}) + "\n")
    write_checkpoint(run_dir, 2, quality="bad")
    assert store.poll_once() and store.current.version == 2
    assert "below the floor 0.7: replaced" in store.ledger.read(2).evidence["why"]


def test_a_lineage_without_evidence_is_judged_on_integrity_and_weights(store, run_dir):
    """Checkpoints of a trainer before evidence (or gate_evidence=0): no paired test, no ratchet."""
    write_checkpoint(run_dir, 1, metric=0.99)
    store.poll_once()
    write_checkpoint(run_dir, 2, metric=0.5)
    assert store.poll_once() and store.ledger.read(2).evidence is None


def test_the_regression_gate_compares_errors_on_the_same_events(tmp_path):
    """Lower MAE is better: a candidate whose answers are off by 1 more than the served model's on
    the same events is held; one off by less is served."""
    run_dir = tmp_path / AMOUNT.name
    store = ModelStore(AMOUNT, run_dir)
    write_checkpoint(run_dir, 1, pipeline=AMOUNT)
    store.poll_once()
    served = store.current.model
    x = np.random.default_rng(0).normal(size=(500, AMOUNT.n_features)).astype(np.float32)
    with torch.inference_mode():
        truth = served(torch.from_numpy(x)).numpy()

    def candidate(version: int, error: float) -> None:
        path = write_checkpoint(run_dir, version, pipeline=AMOUNT)
        scores = (truth + error).astype(np.float32)
        checkpoint.write(path, torch.load(path / "model.pt")["model"], None, checkpoint.read_meta(path),
                         evidence={"features": x, "scores": scores, "targets": truth.astype(np.float32)})

    candidate(2, 1.0)  # the served model is exact on these events: the candidate is off by 1
    assert not store.poll_once() and store.ledger.read(2).evidence["metric"] == "mae"
    assert store.ledger.read(2).evidence["hold"] is True
    candidate(3, 0.0)
    assert store.poll_once() and store.current.version == 3


def test_gate_edge_cases():
    meta = lambda auc: {"metrics": {"online": {"auc": auc}}}  # noqa: E731
    assert metric_problem(meta(0.5), "classification") is None
    assert metric_problem(meta(None), "classification") is None  # AUC undefined yet
    assert "nan" in metric_problem(meta(float("nan")), "classification")
    assert metric_problem(meta("junk"), "classification")


@pytest.mark.parametrize("kwargs", [{"scale": 1e6}, {"fill": float("nan")}, {"fill": float("inf")}])
def test_garbage_weights_rejected(store, run_dir, kwargs):
    write_checkpoint(run_dir, 1)
    store.poll_once()
    write_checkpoint(run_dir, 2, metric=0.99, **kwargs)  # meta looks great; the tensors do not
    assert store.poll_once() is False
    assert store.current.version == 1
    assert store.last_rejection.kind == "weights"
    assert weights_problem({"w": torch.ones(3)}, 1e4) is None


def test_corrupt_checkpoint_is_never_loaded(store, run_dir, monkeypatch):
    write_checkpoint(run_dir, 1)
    store.poll_once()
    flip_bytes(write_checkpoint(run_dir, 2, metric=0.9) / "model.pt")
    loaded = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loaded.append(str(f)) or real_load(f, *a, **k))
    for _ in range(3):  # remembered: neither loaded nor re-hashed on later polls
        assert store.poll_once() is False
    assert store.current.version == 1
    assert not any("checkpoint_000000002" in p for p in loaded)
    assert store.last_rejection.kind == "integrity" and "checksum" in store.last_rejection.reason
    assert store.rejections == {"integrity": 1}


def test_fresh_store_falls_back_past_a_corrupt_newest(store, run_dir):
    write_checkpoint(run_dir, 1)
    flip_bytes(write_checkpoint(run_dir, 2) / "meta.json")
    assert store.poll_once() is True
    assert store.current.version == 1


def test_checkpoint_rewritten_in_place_is_judged_again(store, run_dir):
    write_checkpoint(run_dir, 1)
    store.poll_once()
    write_checkpoint(run_dir, 2, scale=1e6)
    assert store.poll_once() is False
    time.sleep(0.01)  # a new SHA256SUMS mtime
    write_checkpoint(run_dir, 2)
    assert store.poll_once() is True and store.current.version == 2


def test_wrong_pipeline_rejected(store, run_dir):
    write_checkpoint(run_dir, 1, pipeline=AMOUNT)
    assert store.poll_once() is False
    assert store.last_rejection.kind == "pipeline"


def test_version_only_moves_forward(store, run_dir):
    write_checkpoint(run_dir, 3)
    store.poll_once()
    old = store.current
    write_checkpoint(run_dir, 2, metric=0.99)
    assert store.poll_once() is False and store.current is old
    write_checkpoint(run_dir, 5)
    write_checkpoint(run_dir, 4)
    assert store.poll_once() is True and store.current.version == 5
    # the replaced object is untouched: a request that read it before the swap finishes on it
    assert old.version == 3 and old.model is not store.current.model


def test_pin_and_unpin(store, run_dir):
    for v in (1, 2, 3):
        write_checkpoint(run_dir, v, metric=0.8 + v / 100)
    store.poll_once()
    assert store.current.version == 3
    pin_version(run_dir.parent, run_dir.name, 1)  # a rollback bypasses the quality gate
    assert read_pin(run_dir) == 1
    assert store.poll_once() is True and store.current.version == 1
    assert store.status()["serving_pinned"] is True
    write_checkpoint(run_dir, 4, metric=0.9)
    assert store.poll_once() is False and store.current.version == 1  # pinned: newer ones wait
    assert unpin(run_dir.parent, run_dir.name) is True
    assert unpin(run_dir.parent, run_dir.name) is False
    assert store.poll_once() is True and store.current.version == 4
    assert store.status()["pinned"] is None


def test_pin_checks_the_checkpoint(store, run_dir):
    write_checkpoint(run_dir, 1)
    with pytest.raises(CheckpointError, match="no checkpoint version 7"):
        pin_version(run_dir.parent, run_dir.name, 7)
    flip_bytes(write_checkpoint(run_dir, 2) / "model.pt")
    with pytest.raises(CheckpointError, match="checksum"):
        pin_version(run_dir.parent, run_dir.name, 2)
    (run_dir / "PINNED").write_text("v1")  # a hand-edited pin is reported, not obeyed blindly
    with pytest.raises(CheckpointError, match="not a version"):
        read_pin(run_dir)
    assert store.poll_once() is True and store.current.version == 1


def test_pinned_corrupt_checkpoint_is_not_loaded(store, run_dir):
    write_checkpoint(run_dir, 1)
    store.poll_once()
    path = write_checkpoint(run_dir, 2)
    pin_version(run_dir.parent, run_dir.name, 2)
    flip_bytes(path / "model.pt")  # corrupted after pinning
    assert store.poll_once() is False
    assert store.current.version == 1 and store.last_rejection.kind == "integrity"


def test_background_thread_swaps_within_two_seconds(run_dir):
    store = ModelStore(FRAUD, run_dir, poll_interval_s=0.1)
    store.start()
    try:
        assert store.alive
        write_checkpoint(run_dir, 1)
        written = time.monotonic()
        while store.current is None and time.monotonic() - written < 2:
            time.sleep(0.02)
        assert store.current is not None and store.current.version == 1
    finally:
        store.stop()
    assert not store.alive


def test_config_validation(monkeypatch):
    monkeypatch.delenv("STREAMLEARN_SERVE_TOKEN", raising=False)
    cfg = ServeConfig(checkpoint_dir="/tmp/ckpt", pipeline="pkg.mod:obj")
    assert cfg.run_name == "pkg-mod-obj" and cfg.app_name == "score-pkg-mod-obj" and cfg.auth_token is None
    assert cfg.run_dir == Path("/tmp/ckpt/pkg-mod-obj")
    with pytest.raises(ConfigError, match="poll_interval_s"):
        ServeConfig(poll_interval_s=5)
    with pytest.raises(ConfigError, match="max_replicas"):
        ServeConfig(min_replicas=3, max_replicas=2)
    with pytest.raises(ConfigError, match="max_ongoing_requests"):
        ServeConfig(target_ongoing_requests=32)
    with pytest.raises(ConfigError, match="8 characters"):
        ServeConfig(auth_token="short")
    monkeypatch.setenv("STREAMLEARN_SERVE_TOKEN", "from-the-environment")
    cfg = ServeConfig()
    assert cfg.auth_token.get_secret_value() == "from-the-environment"
    assert "from-the-environment" not in repr(cfg)


def test_timeline_traces_each_swap_and_rejection(run_dir, tmp_path):
    """`serve up --timeline`: a swap span per model swapped in, a rejected span per refused one,
    in a trace file of the replica's own that `streamlearn timeline merge` reads."""
    import json
    import os

    from streamlearn.observe.timeline import merge, read_trace

    store = ModelStore(FRAUD, run_dir, timeline=str(tmp_path / "tl"))
    write_checkpoint(run_dir, 1, quality="good")
    assert store.poll_once()
    write_checkpoint(run_dir, 2, quality="bad")  # the quality gate turns it away
    assert not store.poll_once()
    write_checkpoint(run_dir, 3, quality="good")
    assert store.poll_once()
    path = tmp_path / f"tl.scorer-{os.getpid()}.json"
    live = read_trace(path)  # flushed as it goes: readable while the replica runs
    store.stop()

    events = read_trace(path)
    assert events == live
    assert json.loads(path.read_text())  # closed: one valid Chrome trace array
    spans = [(e["name"], e["args"].get("version"), e["args"].get("kind")) for e in events if e["ph"] == "X"]
    assert spans == [("swap", 1, None), ("rejected", 2, "quality"), ("swap", 3, None)]
    assert all(e["pid"] == os.getpid() and e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert [e["args"]["name"] for e in events if e["ph"] == "M"] == [f"scorer {os.getpid()}"]
    assert merge([path], tmp_path / "merged.json") == len(events)


# ---- one decision per version, followed by every replica (issue 14) ----------------------

def test_a_later_replica_follows_the_recorded_decision_not_its_own(run_dir):
    """The demo's bug: a replica that started later had no serving model to compare with, so it
    took a version the first replica had refused, and callers saw the two versions alternate."""
    first = ModelStore(FRAUD, run_dir, quality_tolerance=0.02)
    write_checkpoint(run_dir, 1, quality="good")
    assert first.poll_once()
    write_checkpoint(run_dir, 2, quality="bad")  # worse than v1 on the same events
    assert not first.poll_once() and first.last_rejection.kind == "quality"

    later = ModelStore(FRAUD, run_dir, quality_tolerance=0.02)
    assert later.poll_once()
    assert later.current.version == first.current.version == 1
    assert later.last_rejection.version == 2 and later.rejections == {"quality": 1}
    decisions = sorted(p.name for p in (run_dir / "decisions").glob("v*.json"))
    assert decisions == ["v000000001.json", "v000000002.json"]
    recorded = json.loads((run_dir / "decisions" / "v000000002.json").read_text())
    assert recorded["approved"] is False and recorded["kind"] == "quality" and recorded["compared_with"] == 1
    assert "worse by more than 0.02" in recorded["reason"] and recorded["by"].endswith(f":{os.getpid()}")


def test_the_gate_compares_with_the_last_approved_version(run_dir):
    store = ModelStore(FRAUD, run_dir, quality_tolerance=0.02)
    write_checkpoint(run_dir, 1, quality="good")
    store.poll_once()
    write_checkpoint(run_dir, 2, quality="bad")  # refused against v1
    write_checkpoint(run_dir, 3, quality="bad")  # refused against v1 too, not judged against the refused v2
    store.poll_once()
    assert store.current.version == 1
    assert sorted(store.ledger.read(v).approved for v in (2, 3)) == [False, False]
    assert store.ledger.read(3).compared_with == 1


def test_one_decision_when_replicas_judge_the_same_version_at_once(run_dir):
    write_checkpoint(run_dir, 1)
    stores = [ModelStore(FRAUD, run_dir) for _ in range(6)]
    barrier = threading.Barrier(len(stores))

    def poll(store):
        barrier.wait()
        store.poll_once()

    threads = [threading.Thread(target=poll, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {s.current.version for s in stores} == {1}
    assert len(list((run_dir / "decisions").glob("v*.json"))) == 1
    assert not list((run_dir / "decisions").glob(".*.tmp"))  # the losers' temp files are gone


def test_replicas_switch_at_the_announced_moment(run_dir):
    a, b = (ModelStore(FRAUD, run_dir, swap_delay_s=0.6, poll_interval_s=0.1) for _ in range(2))
    write_checkpoint(run_dir, 1)
    a.poll_once()  # decides v1; b has not looked yet
    first = a.ledger.read(1).serve_at
    # Even the lineage's first model waits for its moment: served at once, it answered 200 here
    # while b, yet to poll, answered 503 (CI saw 6 such answers from two replicas).
    assert first > time.time() and a.serving() is None
    b.poll_once()
    assert b.serving() is None
    time.sleep(max(0.0, first - time.time()) + 0.01)
    assert a.serving().version == b.serving().version == 1
    write_checkpoint(run_dir, 2)
    a.poll_once()  # decides v2 and announces its moment
    moment = a.ledger.read(2).serve_at
    b.poll_once()  # loads it too, ahead of the moment
    assert moment > time.time() and a.serving().version == b.serving().version == 1
    assert a.status()["next"] == [{"version": 2, "serve_at": moment}]
    late = ModelStore(FRAUD, run_dir, swap_delay_s=0.6, poll_interval_s=0.1)  # started meanwhile
    late.poll_once()
    assert late.serving().version == 1  # what the others serve, not the version announced for later
    time.sleep(max(0.0, moment - time.time()) + 0.01)
    assert [s.serving().version for s in (a, b, late)] == [2, 2, 2]  # on the request path, no poll needed
    assert a.late_swaps == b.late_swaps == late.late_swaps == 0


def _two_replicas_serving_v1(run_dir, swap_delay_s: float) -> tuple[ModelStore, ModelStore]:
    """Two replicas that both serve v1, its moment passed."""
    a, b = (ModelStore(FRAUD, run_dir, swap_delay_s=swap_delay_s, poll_interval_s=0.1) for _ in range(2))
    write_checkpoint(run_dir, 1)
    a.poll_once()
    b.poll_once()
    time.sleep(max(0.0, a.ledger.read(1).serve_at - time.time()) + 0.01)
    assert a.serving().version == b.serving().version == 1
    return a, b


def test_two_approvals_judged_at_once_are_served_in_turn(run_dir, monkeypatch):
    """Replica a judges v2 while b, which listed v3 too, judges v3: two approvals, two moments.
    b read no decision on v2 before judging and queued v3 alone, so between the two moments it
    answered v1 while a answered v2 (CI: a caller saw v36, then v35). Every step is served in turn."""
    a, b = _two_replicas_serving_v1(run_dir, swap_delay_s=1.5)
    held = {a: threading.Event(), b: threading.Event()}
    judging = {a: threading.Event(), b: threading.Event()}
    for store in (a, b):
        load = store._load

        def slow(version, path, gate, store=store, load=load):
            if gate:  # a judgement: hold it until the test lets it record
                judging[store].set()
                held[store].wait(10)
            return load(version, path, gate)
        monkeypatch.setattr(store, "_load", slow)
    write_checkpoint(run_dir, 2)
    a_polls = threading.Thread(target=a.poll_once)
    a_polls.start()
    assert judging[a].wait(10)  # a judges v2, v3 not written yet
    write_checkpoint(run_dir, 3)
    b_polls = threading.Thread(target=b.poll_once)
    b_polls.start()
    assert judging[b].wait(10)  # b judges v3, having read no decision on v2
    held[a].set()
    a_polls.join(10)
    time.sleep(0.5)  # the two moments apart
    held[b].set()
    b_polls.join(10)
    second, third = a.ledger.read(2).serve_at, b.ledger.read(3).serve_at
    assert a.ledger.read(2).approved and b.ledger.read(3).approved and time.time() < second < third
    for store in (a, b):
        store.poll_once()
    time.sleep(max(0.0, second - time.time()) + 0.01)
    assert a.serving().version == b.serving().version == 2
    time.sleep(max(0.0, third - time.time()) + 0.01)
    assert a.serving().version == b.serving().version == 3
    assert a.late_swaps == b.late_swaps == 0


def test_a_starting_replica_waits_for_the_first_moment_before_traffic(run_dir):
    """What Scorer.__init__ does: a service deployed beside a checkpoint serves it when ready."""
    write_checkpoint(run_dir, 1)
    store = ModelStore(FRAUD, run_dir, swap_delay_s=0.5, poll_interval_s=0.1)
    store.poll_once()
    assert store.serving() is None
    started = time.monotonic()
    store.await_first_moment()
    assert store.serving().version == 1 and time.monotonic() - started <= 0.6
    started = time.monotonic()
    store.await_first_moment()  # something served: no wait
    assert time.monotonic() - started < 0.05


def test_a_replica_started_before_two_moments_follows_both(run_dir):
    """Started after v1 and v2 were announced but before either moment: 503 like the others, then
    v1, then v2 — never v2 early, never v1 after v2."""
    a = ModelStore(FRAUD, run_dir, swap_delay_s=2.0, poll_interval_s=0.1)
    write_checkpoint(run_dir, 1)
    a.poll_once()
    time.sleep(0.5)  # the two moments apart (a delay of 2 s: room for a loaded machine's polls)
    write_checkpoint(run_dir, 2)
    a.poll_once()
    first, second = a.ledger.read(1).serve_at, a.ledger.read(2).serve_at
    late = ModelStore(FRAUD, run_dir, swap_delay_s=2.0, poll_interval_s=0.1)
    late.poll_once()
    assert time.time() < first < second and late.serving() is None and a.serving() is None
    time.sleep(max(0.0, first - time.time()) + 0.01)
    assert late.serving().version == a.serving().version == 1
    time.sleep(max(0.0, second - time.time()) + 0.01)
    assert late.serving().version == a.serving().version == 2


def test_a_pin_switches_every_replica_at_the_same_moment(run_dir):
    a, b = (ModelStore(FRAUD, run_dir, swap_delay_s=0.5, poll_interval_s=0.1) for _ in range(2))
    for v in (1, 2):
        write_checkpoint(run_dir, v)
    for s in (a, b):
        s.poll_once()
    time.sleep(0.55)
    assert a.serving().version == b.serving().version == 2
    pin_version(run_dir.parent, run_dir.name, 1)
    moment = (run_dir / "PINNED").stat().st_mtime + 0.5
    a.poll_once()
    b.poll_once()
    assert a.serving().version == b.serving().version == 2
    time.sleep(max(0.0, moment - time.time()) + 0.01)
    assert a.serving().version == b.serving().version == 1
    unpin(run_dir.parent, run_dir.name)
    a.poll_once()  # back to the newest approved version at once: no moment to wait for
    assert a.serving().version == 2 and a.late_swaps == 0


def test_decisions_of_pruned_checkpoints_are_dropped(run_dir):
    store = ModelStore(FRAUD, run_dir)
    for v in range(1, 5):
        write_checkpoint(run_dir, v)
        store.poll_once()
    checkpoint.prune(run_dir, keep=1)
    write_checkpoint(run_dir, 5)
    store.poll_once()
    assert store.current.version == 5
    assert sorted(p.name for p in (run_dir / "decisions").glob("v*.json")) == ["v000000004.json",
                                                                               "v000000005.json"]


def _write_through_trainer(writer, version: int, quality: str) -> None:
    """A checkpoint as the trainer writes it: through its background writer, which prunes."""
    meta = {"version": version, "offsets": {"0": 100 * version}, "counters": {"learned": 100 * version},
            "metrics": {"online": {"window": 1000, "auc": 0.9}, "train_loss": 0.3},
            "pipeline": FRAUD.describe(), "written_at": time.time(), "topic": "transactions"}
    state = trained.state(quality)
    writer.submit(version, state, None, meta, {0: 100 * version}, then=lambda: None,
                  evidence=trained.evidence(state, seed=version))
    writer.drain()


def test_retention_keeps_what_a_new_replica_must_serve(run_dir):
    """The gate refuses more candidates in a row than the trainer keeps: the approved version
    stays on disk, so a replica started now serves what the others serve, not 503; a pin holds
    its version the same way. Without the hold, keep=2 deletes v1 at the third refusal."""
    from streamlearn.train.writer import CheckpointWriter

    writer = CheckpointWriter(run_dir, keep=2, commit=lambda offsets: None)
    first = ModelStore(FRAUD, run_dir, quality_tolerance=0.02, swap_delay_s=0)
    _write_through_trainer(writer, 1, "good")
    first.poll_once()
    for version in range(2, 7):  # each much worse than v1: refused
        _write_through_trainer(writer, version, "bad")
        first.poll_once()
    assert first.current.version == 1
    assert [v for v, _ in checkpoint.list_checkpoints(run_dir)] == [1, 5, 6]
    started_later = ModelStore(FRAUD, run_dir, quality_tolerance=0.02, swap_delay_s=0)
    started_later.poll_once()
    assert started_later.serving().version == 1

    pin_version(run_dir.parent, run_dir.name, 5)
    for version in range(7, 10):
        _write_through_trainer(writer, version, "bad")
    writer.close()
    assert [v for v, _ in checkpoint.list_checkpoints(run_dir)] == [1, 5, 8, 9]


def test_a_replica_whose_poller_is_late_still_switches_at_the_moment(run_dir):
    """A replica's poll thread starved past the moment (a loaded host: CI saw one answer v38 after
    the other had answered v39) must not answer with the old version: the request reads the ledger."""
    a, b = _two_replicas_serving_v1(run_dir, swap_delay_s=0.4)
    b.poll_once()
    write_checkpoint(run_dir, 2)
    a.poll_once()  # decides v2; b's poller never runs again in this test
    polls = b.request_polls
    moment = a.ledger.read(2).serve_at
    assert moment - time.time() > 0.4 * 0.7  # stamped at the write: the delay is not eaten by the judging
    time.sleep(max(0.0, moment - time.time()) + 0.01)
    assert a.serving().version == 2
    assert b.serving().version == 2 and b.request_polls == polls + 1 == b.status()["request_polls"]


def test_a_request_does_not_poll_while_the_poller_keeps_up(run_dir):
    store = ModelStore(FRAUD, run_dir, swap_delay_s=0.4, poll_interval_s=0.1)
    write_checkpoint(run_dir, 1)
    store.poll_once()
    for _ in range(5):
        time.sleep(0.1)
        store.poll_once()
        store.serving()
    assert store.serving().version == 1 and store.request_polls == 0


def test_an_approval_is_stamped_again_when_its_write_stalls(run_dir, monkeypatch):
    """The moment must be at most STAMP_SLACK of the delay older than the link: a replica that read
    the ledger just before it counts on the rest of the delay."""
    from streamlearn.rundir import ledger as gate

    ledger = gate.Ledger(run_dir)
    decision = gate.Decision(1, True, None, None, 0.8, None, time.time(), 0.0, "test", None)
    writes = []
    real = Path.write_text

    def slow_first_write(path, text, *args, **kwargs):
        writes.append(json.loads(text)["serve_at"])
        if len(writes) == 1:
            time.sleep(0.3)  # more than a quarter of the 1 s delay
        return real(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", slow_first_write)
    standing, ours = ledger.record(decision, swap_delay_s=1.0)
    linked = time.time()
    assert ours and len(writes) == 2 and standing.serve_at == writes[1] > writes[0]
    assert standing.serve_at - linked >= 1.0 * (1 - gate.STAMP_SLACK)
    assert ledger.read(1).serve_at == standing.serve_at


def test_a_request_poll_that_fails_is_not_retried_by_every_request(run_dir, monkeypatch):
    """Storage failing under the checkpoint directory: the answer goes out on the loaded model, and
    the requests after it do not each poll (and log) again until a poll interval has passed."""
    store = ModelStore(FRAUD, run_dir, swap_delay_s=0.4, poll_interval_s=0.1)
    write_checkpoint(run_dir, 1)
    store.poll_once()
    time.sleep(max(0.0, store.ledger.read(1).serve_at - time.time()) + 0.01)
    assert store.serving().version == 1
    calls = []

    def broken(*_args, **_kwargs):
        calls.append(time.monotonic())
        raise OSError("stale file handle")

    monkeypatch.setattr(checkpoint, "list_checkpoints", broken)
    time.sleep(0.35)  # the poller (not running here) is now late
    for _ in range(50):
        assert store.serving().version == 1
    assert len(calls) == 1
    time.sleep(0.12)
    assert store.serving().version == 1 and len(calls) == 2


def test_how_far_serving_is_behind_and_why(store, run_dir):
    """Issue 44's bound on staleness: GET /model (and so `streamlearn status` and the gauges the
    StreamlearnServingStale alert reads) says how far the served version trails and why."""
    write_checkpoint(run_dir, 1, quality="good")
    store.poll_once()
    assert store.status()["behind"] | {"bound": None} == {"versions": 0, "seconds": 0.0, "newest": 1, "why": None,
                                                           "bound": None}
    write_checkpoint(run_dir, 2, quality="bad")
    write_checkpoint(run_dir, 3, quality="bad")
    store.poll_once()
    behind = store.status()["behind"]
    assert behind["versions"] == 2 and behind["newest"] == 3 and behind["seconds"] >= 0
    assert behind["why"].startswith("holding v1: v3 refused (quality): auc ")
    assert behind["bound"] == {"versions": 10, "seconds": 300.0}
    pin_version(run_dir.parent, run_dir.name, 1)
    store.poll_once()
    assert store.status()["behind"]["why"].startswith("pinned to v1")


def test_delayed_feedbacks_evidence_is_the_candidates_own_without_reports_the_served_version_never_learned(
        run_dir):
    """Pooled evidence (reports held back from learning, each naming its event) is judged alone: the
    versions between hold the same reports. A report whose event came after the served checkpoint
    (offset 100 on partition 0 for v1) is left out: the served model never learned that event."""
    from streamlearn.serve.gate import gather_evidence

    x = np.random.default_rng(3).random((6, FRAUD.n_features)).astype(np.float32)
    pooled = {"features": x, "scores": np.linspace(0.1, 0.6, 6).astype(np.float32),
              "targets": np.array([1, 1, 1, 1, 0, 0], np.float32),
              "partition": np.array([0, 0, 1, 0, -1, -1]), "offset": np.array([40, 99, 5, 100, -1, -1])}
    paths = {v: write_checkpoint(run_dir, v) for v in (1, 2, 3)}  # v1 learned partition 0 below offset 100
    for v in (2, 3):
        checkpoint.write(paths[v], torch.load(paths[v] / "model.pt")["model"], None, checkpoint.read_meta(paths[v]),
                         evidence=pooled)
    got = gather_evidence(paths, 3, 1, set(), lambda targets: False)  # never "enough": still v3's alone
    assert got["features"].tolist() == x[[0, 1, 4, 5]].tolist()  # partition 1: v1 stood at 0 there
    assert got["targets"].tolist() == [1, 1, 0, 0] and got["scores"].tolist() == pooled["scores"][[0, 1, 4, 5]].tolist()
