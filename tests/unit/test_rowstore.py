"""The row store delayed feedback finds a late report's event in (ingest/rowstore.py): rows come
back as written, anything not whole and of the asked event is a miss, files below retention go.
Its use in a window, against re-reads: tests/unit/test_feedback_join.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from streamlearn.ingest.rowstore import ID_BYTES, MARK, SEGMENT_BITS, RowStore, row_dtype, row_ids


def _rows(n: int, width: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (row_ids([f"{seed}-{i}" for i in range(n)]), rng.integers(0, 2**32, n, dtype=np.uint32),
            rng.normal(size=(n, width)).astype(np.float32))


def test_an_id_is_kept_as_its_bytes_or_if_long_or_not_ascii_as_its_hash_the_same_in_any_batch():
    long_, other = "x" * (ID_BYTES + 1), "é-7"
    alone = [row_ids([i])[0] for i in ("a-1", long_, other)]
    assert row_ids(["a-1", long_, other]).tolist() == alone and alone[0] == b"a-1"
    assert alone[1].startswith(b"#") and alone[1] != row_ids(["x" * (ID_BYTES + 2)])[0]
    assert row_ids(["a-1", other]).tolist() == [alone[0], alone[2]]
    assert row_ids([]).shape == (0,)


def test_rows_are_a_power_of_two_so_none_straddles_a_page():
    for width in (1, 5, 43, 200):
        size = row_dtype(width, np.dtype(np.float32)).itemsize
        assert size & (size - 1) == 0 and size >= 16 + ID_BYTES + 4 * width


def test_rows_come_back_as_written_across_partitions_files_and_gaps(tmp_path):
    store = RowStore(tmp_path, 5)
    edge = 1 << SEGMENT_BITS
    offsets = np.array([0, 1, 3, edge - 1, edge, edge + 7, 10, 11], np.int64)  # 2 is dead-lettered: a gap
    partitions = np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64)
    keys, crcs, x = _rows(len(offsets))
    store.add(partitions, offsets, keys, crcs, x)
    for i, (p, o) in enumerate(zip(partitions.tolist(), offsets.tolist(), strict=True)):
        [(got, crc)] = store.get(p, [o], keys[i:i + 1])
        assert crc == crcs[i] and got.tobytes() == x[i].tobytes()  # the same bytes a re-read gives
    assert store.get(0, [2, 5, 3 * edge], row_ids(["a", "b", "c"])) == [None] * 3  # gap, unwritten, no file
    assert store.get(0, [0], keys[1:2]) == [None]  # another event's id
    assert store.get(1, [0], keys[:1]) == [None]
    assert sorted(f.name for f in store.dir.iterdir()) == ["p0-000000.rows", "p0-000001.rows", "p1-000000.rows"]
    assert store.hits == 8 and store.misses == 5


def test_a_torn_or_zeroed_row_is_a_miss(tmp_path):
    store = RowStore(tmp_path, 5)
    keys, crcs, x = _rows(3)
    store.add(np.zeros(3, np.int64), np.arange(3, dtype=np.int64), keys, crcs, x)
    store.flush()
    size = store.dtype.itemsize
    path = store.dir / "p0-000000.rows"
    with open(path, "r+b") as f:  # row 1 lost all but its offset (the mark too), row 2 is all zeros
        f.seek(size + 8)
        f.write(b"\0" * (size - 8))
        f.seek(2 * size)
        f.write(b"\0" * size)
    assert np.frombuffer(path.read_bytes()[:size], store.dtype)[0]["mark"] == MARK
    found = store.get(0, [0, 1, 2], keys)
    assert found[0] is not None and found[1:] == [None, None]


def test_files_whose_offsets_are_all_below_retention_are_deleted(tmp_path):
    store = RowStore(tmp_path, 5)
    edge = 1 << SEGMENT_BITS
    offsets = np.array([5, edge + 5, 2 * edge + 5], np.int64)
    keys, crcs, x = _rows(3)
    store.add(np.zeros(3, np.int64), offsets, keys, crcs, x)
    store.prune(0, 2 * edge - 1)  # the second file still holds offset 2 * edge - 1
    assert sorted(f.name for f in store.dir.iterdir()) == ["p0-000001.rows", "p0-000002.rows"]
    assert store.get(0, [5], keys[:1]) == [None]
    assert store.get(0, [2 * edge + 5], keys[2:]) != [None]
    store.close()


def test_the_same_window_written_again_leaves_the_same_bytes(tmp_path):
    store = RowStore(tmp_path, 5)
    keys, crcs, x = _rows(100)
    args = (np.zeros(100, np.int64), np.arange(100, dtype=np.int64), keys, crcs, x)
    store.add(*args)
    store.flush()
    first = (store.dir / "p0-000000.rows").read_bytes()
    store.close()
    (again := RowStore(tmp_path, 5)).add(*args)  # a replay of the window, or a warm hand-over's second group
    again.close()
    assert (store.dir / "p0-000000.rows").read_bytes() == first
    assert os.path.getsize(store.dir / "p0-000000.rows") == 100 * store.dtype.itemsize


def test_features_of_another_shape_or_type_find_none_of_the_old_rows(tmp_path):
    keys, crcs, x = _rows(1)
    (store := RowStore(tmp_path, 5)).add(np.zeros(1, np.int64), np.zeros(1, np.int64), keys, crcs, x)
    store.close()
    assert RowStore(tmp_path, 6).get(0, [0], keys) == [None]
    assert RowStore(tmp_path, 5, np.dtype(np.float64)).get(0, [0], keys) == [None]


def test_a_partition_with_no_reports_still_loses_its_files_below_retention(tmp_path):
    from streamlearn.ingest.decode import feature_width
    from streamlearn.ingest.feedback import ReportFeedback
    from streamlearn.pipeline import load_pipeline

    from .test_feedback_join import Topic, _batch, _events

    pipeline = load_pipeline("fraud_chargebacks")
    _, topic = _events(9, 40)
    store = RowStore(tmp_path, feature_width(pipeline))
    stale = store.dir / f"p0-{0:06d}.rows"
    feedback = ReportFeedback(pipeline.labels, Topic(topic, low={0: 2 << SEGMENT_BITS}), store)
    store.dir.mkdir(parents=True)
    stale.write_bytes(b"\0" * 64)  # rows of offsets the topic no longer has
    _batch(feedback, [m for q in sorted(topic) for m in topic[q]], [])  # no report at all
    assert not stale.exists() and (store.dir / "p1-000000.rows").exists()


def test_a_broker_that_cannot_say_where_the_topic_starts_only_delays_pruning(tmp_path):
    from confluent_kafka import KafkaException

    from streamlearn.ingest.decode import feature_width
    from streamlearn.ingest.feedback import ReportFeedback
    from streamlearn.pipeline import load_pipeline

    from .test_feedback_join import Topic, _batch, _events

    class Away(Topic):
        def watermarks(self, partitions):
            self.asked += len(partitions)
            raise KafkaException("broker transport failure")

    pipeline = load_pipeline("fraud_chargebacks")
    _, topic = _events(10, 40)
    lookup = Away(topic)
    feedback = ReportFeedback(pipeline.labels, lookup, RowStore(tmp_path, feature_width(pipeline)))
    for _ in range(3):  # the window is learned; the broker is asked once per partition, not per window
        assert _batch(feedback, [m for q in sorted(topic) for m in topic[q]], []).size == 40
    assert lookup.asked == 2


def test_a_window_is_written_by_the_stores_thread_and_its_rows_read_meanwhile_from_memory(tmp_path, monkeypatch):
    """add returns before its rows are in the file (the rank learns meanwhile); a report for one
    of them gets the same bytes from the window's rows in memory, and the next add waits for the write."""
    import threading

    from streamlearn.ingest import rowstore

    release, writes = threading.Event(), []
    real = os.pwrite

    def slow(fd, data, at):  # the disk slow: the write waits until released
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            return real(fd, data, at)  # another test's store, its thread still writing: not this one's
        release.wait(10)
        writes.append(at)
        return real(fd, data, at)

    monkeypatch.setattr(rowstore.os, "pwrite", slow)
    store = RowStore(tmp_path, 5)
    keys, crcs, x = _rows(6)
    store.add(np.zeros(4, np.int64), np.array([0, 1, 3, 4], np.int64), keys[:4], crcs[:4], x[:4])  # 2: a gap
    assert writes == []  # returned with the write still to come
    found = store.get(0, [1, 2, 4, 5], row_ids(["0-1", "x", "0-3", "y"]))
    assert [f is not None for f in found] == [True, False, True, False] and writes == []
    assert found[0][0].tobytes() == x[1].tobytes() and found[2][1] == crcs[3]
    assert store.get(0, [1], row_ids(["another event"])) == [None] and writes == []  # an id not its own
    threading.Timer(0.2, release.set).start()
    store.add(np.zeros(2, np.int64), np.array([8, 9], np.int64), keys[4:], crcs[4:], x[4:])
    # the first window's write, done before the second was laid out (which, the disk released, may be done too)
    assert writes[:1] == [0]
    store.close()
    assert writes == [0, 8 * store.dtype.itemsize]
    assert [f is not None for f in RowStore(tmp_path, 5).get(0, [1, 2, 4], row_ids(["0-1", "x", "0-3"]))] == \
        [True, False, True]  # and the file holds what memory gave


def test_a_write_that_failed_makes_its_rows_misses_and_the_next_add_raise(tmp_path, monkeypatch):
    from streamlearn.ingest import rowstore

    def full(fd, data, at):
        raise OSError(28, "No space left on device")

    store = RowStore(tmp_path, 5)
    keys, crcs, x = _rows(2)
    monkeypatch.setattr(rowstore.os, "pwrite", full)
    store.add(np.zeros(2, np.int64), np.arange(2, dtype=np.int64), keys, crcs, x)  # returns: the thread fails
    store.flush()
    assert store.get(0, [0, 1], keys) == [None, None] and isinstance(store.failed, OSError)
    with pytest.raises(OSError, match="No space"):
        store.add(np.zeros(2, np.int64), np.arange(2, 4, dtype=np.int64), keys, crcs, x)
    store.close()


def test_a_window_over_more_files_than_are_kept_open_writes_each_row_to_its_own_file(tmp_path, monkeypatch):
    """A file let go of (OPEN_FILES) while the window's write may still use it is closed only
    once the write is done: never a write to a closed or reused descriptor."""
    from streamlearn.ingest import rowstore

    monkeypatch.setattr(rowstore, "OPEN_FILES", 2)
    store = RowStore(tmp_path, 5)
    keys, crcs, x = _rows(10)
    partitions = np.repeat(np.arange(5, dtype=np.int64), 2)
    offsets = np.tile(np.array([0, 1], np.int64), 5)
    store.add(partitions, offsets, keys, crcs, x)
    store.close()
    reopened = RowStore(tmp_path, 5)
    for i, (p, o) in enumerate(zip(partitions.tolist(), offsets.tolist(), strict=True)):
        [(got, crc)] = reopened.get(p, [o], keys[i:i + 1])
        assert got.tobytes() == x[i].tobytes() and crc == crcs[i]
    reopened.close()
