"""Join state (streamlearn/ingest/join.py): each event joined with its label once, whichever comes
first; what waits too long or past the cap leaves counted, with what the dead-letter topic needs;
a snapshot restores the same state; the index stays right through merges and compactions."""

from __future__ import annotations

import numpy as np
import pytest

from streamlearn.ingest import join
from streamlearn.ingest.join import JoinState, join_keys

D = 4  # features per event in these tests


def events(ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = join_keys(f"e-{i}" for i in ids)
    features = np.array([[i, i + 0.5, -i, 1.0] for i in ids], dtype=np.float32).reshape(len(ids), D)
    return keys, features, np.array(ids, dtype=np.uint32)


def labels(ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    keys = join_keys(f"e-{i}" for i in ids)
    return keys, np.array([i % 2 for i in ids], dtype=np.float32), np.zeros(len(ids), np.int32), \
        np.array(ids, dtype=np.int64) + 1000


def test_keys_are_stable_and_distinct():
    assert join_keys(["e-1"])[0] == join_keys(["e-1"])[0] != join_keys(["e-2"])[0]
    assert join_keys(["e-1"]).dtype == np.uint64


def test_an_event_joins_its_label_whichever_comes_first():
    state = JoinState(D, ttl_s=60, max_pending=100)
    assert state.add_events(*events([1, 2, 3]), t=0.0).size == 0
    joined = state.add_labels(*labels([3, 9, 1]), t=1.0)  # 9's event has not come yet
    assert sorted(joined.crcs.tolist()) == [1, 3]
    for crc, feature_row, target in zip(joined.crcs, joined.features, joined.targets, strict=True):
        assert feature_row[0] == crc and target == crc % 2  # rows stay aligned with their own label
    assert state.pending == {"events": 1, "labels": 1}
    later = state.add_events(*events([9, 4]), t=2.0)
    assert later.crcs.tolist() == [9] and later.targets.tolist() == [1.0]
    assert state.pending == {"events": 2, "labels": 0}  # 2 and 4 wait; nothing joins twice
    assert state.add_labels(*labels([3]), t=3.0).size == 0  # 3 was learned: its second label waits alone


def test_what_waits_past_the_ttl_leaves_counted_and_labels_keep_their_coordinates():
    state = JoinState(D, ttl_s=10, max_pending=100)
    state.add_events(*events([1, 2]), t=0.0)
    state.add_labels(*labels([7]), t=5.0)
    state.add_events(*events([3]), t=8.0)
    gone = state.expire(now=12.0)  # 1 and 2 waited 12 s; 7 (5 s) and 3 (4 s) stay
    assert [e.rows["crc"].tolist() for e in gone["events"]] == [[1, 2]] and gone["labels"] == []
    gone = state.expire(now=16.0)
    assert [e.rows["offset"].tolist() for e in gone["labels"]] == [[1007]]  # where the DLQ record comes from
    assert state.expired == {"events.ttl": 2, "labels.ttl": 1}
    assert state.pending == {"events": 1, "labels": 0}
    assert state.add_labels(*labels([1, 3]), t=17.0).crcs.tolist() == [3]  # 1 expired: its label waits now


def test_the_cap_evicts_the_oldest_and_counts_them():
    state = JoinState(D, ttl_s=1e9, max_pending=3)
    state.add_events(*events([1, 2, 3, 4, 5]), t=0.0)
    gone = state.expire(now=1.0)
    assert [(e.reason, e.rows["crc"].tolist()) for e in gone["events"]] == [("cap", [1, 2])]
    assert state.expired == {"events.cap": 2} and state.pending["events"] == 3


def test_the_cap_counts_what_waits_not_the_rows_that_passed_through():
    state = JoinState(D, ttl_s=1e9, max_pending=4)
    state.add_events(*events([1, 2, 3, 4]), t=0.0)
    state.add_labels(*labels([1, 3]), t=1.0)
    state.add_events(*events([5, 6]), t=2.0)
    assert state.expire(now=3.0) == {"events": [], "labels": []} and state.pending["events"] == 4
    assert state.add_labels(*labels([2, 4, 5, 6]), t=4.0).crcs.tolist() == [2, 4, 5, 6]


def test_memory_follows_what_waits():
    state = JoinState(D, ttl_s=1e9, max_pending=10**6)
    for round_ in range(20):  # 20 x 5,000 events through, never more than 5,000 waiting
        ids = list(range(round_ * 5000, (round_ + 1) * 5000))
        state.add_events(*events(ids), t=float(round_))
        assert state.add_labels(*labels(ids), t=float(round_)).size == 5000
        state.expire(now=float(round_))
    assert state.pending["events"] == 0 and len(state.events.alive) < 10_000


def test_keys_do_not_depend_on_the_batch():
    alone = join_keys(["a"])[0]
    assert join_keys(["a", "a-much-longer-event-id-" * 2])[0] == alone
    assert join_keys(["évènement-1"])[0] != join_keys(["evenement-1"])[0]
    assert join_keys([]).dtype == np.uint64


def test_two_labels_for_one_event_in_a_batch_join_it_once():
    state = JoinState(D, ttl_s=60, max_pending=100)
    state.add_events(*events([1, 2]), t=0.0)
    joined = state.add_labels(*labels([1, 2, 1]), t=1.0)
    assert joined.crcs.tolist() == [1, 2] and state.pending == {"events": 0, "labels": 1}


def test_a_pending_id_seen_again_is_refused_as_a_duplicate():
    state = JoinState(D, ttl_s=60, max_pending=100)
    state.add_events(*events([1, 2, 2]), t=0.0)
    state.add_events(*events([1]), t=1.0)
    assert state.pending["events"] == 2 and state.duplicates["events"] == 2
    assert state.add_labels(*labels([1, 2]), t=2.0).crcs.tolist() == [1, 2]


def test_a_snapshot_restores_the_same_pending_rows_and_their_clocks():
    state = JoinState(D, ttl_s=10, max_pending=100)
    state.add_events(*events([1, 2, 3]), t=0.0)
    state.add_labels(*labels([2, 8]), t=4.0)
    copy = JoinState.restore({k: v.copy() for k, v in state.snapshot().items()}, D, ttl_s=10, max_pending=100)
    assert copy.pending == state.pending == {"events": 2, "labels": 1}
    assert copy.expire(now=12.0)["events"][0].rows["crc"].tolist() == [1, 3]  # the TTL counts from the first arrival
    assert copy.add_events(*events([8]), t=13.0).targets.tolist() == [0.0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_index_agrees_with_a_plain_dict_through_merges_and_compactions(seed, monkeypatch):
    monkeypatch.setattr(join, "SMALL_INDEX_ROWS", 16)  # merge and compact often
    rng = np.random.default_rng(seed)
    state, model, t = JoinState(D, ttl_s=30, max_pending=400), {}, 0.0  # model: pending event id -> arrival
    waiting_labels: dict[int, float] = {}
    next_id, learned = 0, []
    for _ in range(400):
        t += float(rng.uniform(0, 1))
        if rng.random() < 0.6:
            ids = list(range(next_id, next_id + int(rng.integers(1, 20))))
            next_id += len(ids)
            joined = state.add_events(*events(ids), t=t)
            expect = sorted(i for i in ids if i in waiting_labels)
            for i in expect:
                del waiting_labels[i]
            model.update({i: t for i in ids if i not in expect})
        else:
            ids = [int(i) for i in rng.integers(0, next_id + 5, int(rng.integers(1, 20)))] if next_id else [0]
            ids = list(dict.fromkeys(ids))
            joined = state.add_labels(*labels(ids), t=t)
            found = [i for i in ids if i in model]
            expect = sorted(i for i in found if t - model[i] <= 30)  # a label past the TTL finds its event late
            assert sorted(int(o) - 1000 for o in joined.late.get("offset", [])) == sorted(set(found) - set(expect))
            for i in found:
                del model[i]
            waiting_labels.update({i: t for i in ids if i not in found and i not in waiting_labels})
        assert sorted(joined.crcs.tolist()) == expect
        learned += expect
        if rng.random() < 0.2:
            gone = state.expire(now=t)
            for side, pending in (("events", model), ("labels", waiting_labels)):
                dropped = {int(c) for e in gone[side] for c in e.rows["crc" if side == "events" else "offset"]}
                if side == "labels":
                    dropped = {c - 1000 for c in dropped}
                for i in dropped:
                    del pending[i]
                assert all(ts > t - 30 for ts in pending.values()), "something past its TTL still waits"
        assert state.pending == {"events": len(model), "labels": len(waiting_labels)}
    assert len(learned) == len(set(learned)), "an event was joined twice"
    assert len(learned) > 100 and state.expired.get("events.ttl") and state.expired.get("labels.ttl"), \
        (len(learned), state.expired)  # the run went through joins and expiry on both sides


def test_a_pending_fraud_event_costs_under_300_bytes():
    n_features, n = 43, 200_000  # the fraud pipeline's features; docs/bench/join.json has 1M
    state = JoinState(n_features, ttl_s=1e9, max_pending=2_000_000)
    for start in range(0, n, 8192):
        ids = range(start, min(n, start + 8192))
        state.add_events(join_keys(f"e-{i}" for i in ids), np.zeros((len(ids), n_features), np.float32),
                         np.zeros(len(ids), np.uint32), t=float(start))
    assert state.pending["events"] == n
    assert state.nbytes / n < 300, state.nbytes / n
