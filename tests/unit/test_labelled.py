"""The trainer's online join (streamlearn/ingest/labelled.py): what joins, expires and is
dead-lettered depends only on the messages and their Kafka timestamps, never on how windows cut
the two topics, nor on a checkpoint and restore in between: what makes a replay after a crash
decide as the lost run did. And every event and every label is accounted for."""

from __future__ import annotations

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.ingest.join import LABEL_BYTES, join_keys
from streamlearn.ingest.labelled import DUPLICATE_EVENT, DUPLICATE_LABEL, Events, LabelJoin, Labels
from streamlearn.ingest.reader import Message
from streamlearn.pipeline import JoinedLabels
from streamlearn.schema import Field, Schema

TTL = 10.0
LABEL = Schema("label", (Field("event_id", "str"), Field("label", "bool")))
SPEC = JoinedLabels(LABEL, ttl_s=TTL, max_pending=10**6)
CHARGEBACKS = JoinedLabels(LABEL, ttl_s=TTL, max_pending=10**6, unlabelled_as=0.0)  # silence means "legitimate"
D = 3


def stream(seed: int, n: int = 600):
    """One partition's events (time-ordered) and labels (ordered by their own times): delays
    mostly within the TTL, some past it, a share never labelled, a few duplicate labels."""
    rng = np.random.default_rng(seed)
    t_events = np.cumsum(rng.exponential(0.2, n))
    delay = np.where(rng.random(n) < 0.1, rng.uniform(TTL, 3 * TTL, n), rng.exponential(2.0, n))
    labelled = rng.random(n) >= 0.2
    ids = np.flatnonzero(labelled)
    dup = rng.choice(ids, 10, replace=False)
    label_ids = np.concatenate([ids, dup])
    label_t = np.concatenate([t_events[ids] + delay[ids], t_events[dup] + delay[dup] + rng.uniform(0, 1, 10)])
    order = np.argsort(label_t, kind="stable")
    return t_events, label_ids[order], label_t[order]


def _events(t, lo, hi) -> Events:
    ids = list(range(lo, hi))
    return Events(join_keys(f"e{i}" for i in ids), np.array([[i, 0, 1] for i in ids], np.float32).reshape(-1, D),
                  np.array(ids, np.uint32) + 1, t[lo:hi], [Message(0, i, f"e{i}".encode()) for i in ids].__getitem__)


def _labels(label_ids, label_t, lo, hi) -> Labels:
    ids = label_ids[lo:hi]
    return Labels(join_keys(f"e{i}" for i in ids), (ids % 2).astype(np.float32), np.arange(lo, hi, dtype=np.int64),
                  np.array([f"L{i}".encode() for i in ids], dtype=f"S{LABEL_BYTES}"), label_t[lo:hi])


def run(seed: int, cut_seed: int, restore_at: int | None = None, spec: JoinedLabels = SPEC) -> dict:
    """Join the partition's stream in windows cut at random (each topic on its own), optionally
    checkpointing and restoring into a fresh join after window `restore_at`. `joined`: the learned
    events' (fingerprint, target)."""
    t, label_ids, label_t = stream(seed)
    rng = np.random.default_rng(cut_seed)
    join, e, lab, w = LabelJoin(spec, D, 1), 0, 0, 0
    joined, dead, expired, defaulted = [], [], 0, 0
    while e < len(t) or lab < len(label_ids):
        e2 = min(len(t), e + int(rng.integers(0, 80)))
        l2 = min(len(label_ids), lab + int(rng.integers(0, 80)))
        out = join.window({0: _events(t, e, e2)} if e2 > e else {},
                          {0: _labels(label_ids, label_t, lab, l2)} if l2 > lab else {})
        joined += _learned(out)
        # A second label for one event is dead-lettered whichever way the windows fall: refused as a
        # duplicate while the first still waits, or left alone without an event once the first joined.
        dead += [(m.offset, reason.split(":")[0].replace("duplicate_label", "label_without_event"))
                 for m, reason in out.dead_labels + out.dead_events]
        expired += out.expired
        defaulted += out.defaulted
        e, lab, w = e2, l2, w + 1
        if w == restore_at:
            fresh = LabelJoin(spec, D, 1)
            fresh.restore({k: v.copy() for k, v in join.snapshot().items()}, lambda p: True)
            join = fresh
    pending = join.pending
    # Time moves on (an event and a label of other ids, far later): whatever still waits leaves.
    # Until then a second label for one event may still wait where another cut refused it already.
    out = join.window({0: Events(join_keys(["later"]), np.zeros((1, D), np.float32), np.zeros(1, np.uint32),
                                 np.array([1e9]), [Message(0, -1, b"")].__getitem__)},
                      {0: Labels(join_keys(["other"]), np.zeros(1, np.float32), np.array([-1]),
                                 np.array([b""], dtype=f"S{LABEL_BYTES}"), np.array([1e9]))})
    dead += [(m.offset, reason.split(":")[0].replace("duplicate_label", "label_without_event"))
             for m, reason in out.dead_labels]
    return {"joined": sorted(joined + _learned(out)), "dead": sorted(dead), "expired": expired + out.expired,
            "defaulted": defaulted + out.defaulted, "pending": pending, "n": (len(t), len(label_ids))}


def _learned(out) -> list[tuple[int, float]]:
    return list(zip(np.concatenate([np.empty(0, np.uint32), *out.crcs]).tolist(),
                    np.concatenate([np.empty(0, np.float32), *out.targets]).tolist(), strict=True))


@pytest.mark.parametrize("seed", [1, 2])
def test_decisions_do_not_depend_on_how_windows_cut_the_two_topics(seed):
    first = run(seed, cut_seed=100)
    for cut in (101, 102, 103):
        again = run(seed, cut_seed=cut)
        assert {k: v for k, v in again.items() if k != "pending"} == {k: v for k, v in first.items() if k != "pending"}
    assert len(first["joined"]) > 300 and first["expired"] > 0 and first["dead"]  # all three paths taken


def test_a_restored_checkpoint_decides_as_the_join_that_never_stopped():
    assert run(3, cut_seed=7, restore_at=5) == run(3, cut_seed=7)
    assert run(3, cut_seed=8, restore_at=11) == run(3, cut_seed=8)


def test_every_event_and_every_label_is_accounted_for_once():
    out = run(4, cut_seed=9)
    events, labels = out["n"]
    assert len(out["joined"]) == len(set(out["joined"]))  # no event learned twice
    assert out["pending"]["events"] > 0  # the last events still waited before time moved on
    assert len(out["joined"]) + out["expired"] == events
    assert len(out["joined"]) + len(out["dead"]) == labels
    assert {r for _, r in out["dead"]} == {"label_without_event"}


def test_duplicates_are_dead_lettered_with_their_reason():
    join = LabelJoin(SPEC, D, 1)
    t = np.array([0.0, 0.1, 0.2])
    events = Events(join_keys(["a", "a", "b"]), np.zeros((3, D), np.float32), np.array([1, 2, 3], np.uint32), t,
                    [Message(0, i, b"x") for i in range(3)].__getitem__)
    out = join.window({0: events}, {})
    assert [(m.offset, r) for m, r in out.dead_events] == [(1, DUPLICATE_EVENT)]
    labels = Labels(join_keys(["c", "c"]), np.ones(2, np.float32), np.array([0, 1]),
                    np.array([b"c0", b"c1"], dtype=f"S{LABEL_BYTES}"), np.array([0.3, 0.4]))
    out = join.window({}, {0: labels})
    assert [(m.offset, m.value, r) for m, r in out.dead_labels] == [(1, b"c1", DUPLICATE_LABEL)]


def test_a_rank_restores_only_its_own_partitions():
    join = LabelJoin(SPEC, D, 4)
    for p in range(4):
        t, label_ids, label_t = stream(p, n=50)
        join.window({p: _events(t, 0, 50)}, {})
    mine = LabelJoin(SPEC, D, 4)
    mine.restore(join.snapshot(), lambda p: p % 2 == 1)
    assert sorted(mine.states) == [1, 3] and mine.pending["events"] == 100


def test_with_unlabelled_as_every_event_is_learned_once_and_the_unlabelled_as_its_target():
    """A bank that hears only of fraud (chargebacks): an event with no label within the TTL is
    learned as legitimate, by the same decisions whatever the windows and restores, and exactly
    the events the plain join would have expired are the ones learned so."""
    plain = run(5, cut_seed=21)
    first = run(5, cut_seed=21, spec=CHARGEBACKS)
    for cut, restore_at in ((22, None), (23, 4), (24, 9)):
        assert run(5, cut_seed=cut, restore_at=restore_at, spec=CHARGEBACKS) == first
    events, labels = first["n"]
    learned = [crc for crc, _ in first["joined"]]
    assert sorted(learned) == list(range(1, events + 1))  # every event, once (crc = its index + 1)
    assert first["expired"] == 0 and first["defaulted"] == plain["expired"] > 50
    labelled = set(plain["joined"])  # (crc, its label): learned with it as before
    assert labelled <= set(first["joined"])
    unlabelled = [x for x in first["joined"] if x not in labelled]
    assert len(unlabelled) == first["defaulted"] and {target for _, target in unlabelled} == {0.0}
    # every label is joined once or dead-lettered, exactly as without the default
    assert first["dead"] == plain["dead"] and len(labelled) + len(first["dead"]) == labels


def test_an_event_the_cap_pushes_out_is_learned_as_unlabelled_and_its_later_label_dead_lettered():
    """Labels weeks late keep the state at its cap, so every event leaves through it: left
    unlearned, the model would see the reported class alone. The cap shortens the window."""
    spec = JoinedLabels(LABEL, ttl_s=TTL, max_pending=4, unlabelled_as=0.0)
    join = LabelJoin(spec, D, 1)
    out = join.window({0: _events(np.linspace(0.0, 1.0, 10), 0, 10)}, {})
    assert (out.expired, out.defaulted, join.pending["events"]) == (0, 6, 4)
    assert _learned(out) == [(c, 0.0) for c in range(1, 7)]  # the six oldest (crc = index + 1)
    label = Labels(join_keys(["e0"]), np.ones(1, np.float32), np.array([0]),
                   np.array([b"L0"], dtype=f"S{LABEL_BYTES}"), np.array([2.0]))
    out = join.window({}, {0: label})  # e0's fraud report, after the cap pushed e0 out
    assert out.defaulted == 0 and not out.targets and join.pending["labels"] == 1
    out = join.window({0: _events(np.full(11, 100.0), 10, 11)}, {0: _labels(np.array([99]), np.array([100.0]), 0, 1)})
    assert [(m.value, r.split(":")[0]) for m, r in out.dead_labels] == [(b"L0", "label_without_event")]
    assert out.defaulted == 4  # time moved past the four's TTL


def test_unlabelled_as_must_be_a_number():
    with pytest.raises(ConfigError, match="unlabelled_as"):
        JoinedLabels(LABEL, unlabelled_as=float("nan"))
