"""What a Ray Data lane hands the ranks (streamlearn/ingest/raydata_source.py): its window slices
packed into one Arrow row, and back, with everything the exactly-once bookkeeping needs: the rows to
learn, their fingerprints, both kinds of dead letters and, with joined labels, the events
expired and at a checkpoint window the lane's join state."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from streamlearn.ingest import raydata_source as source
from streamlearn.ingest.decode import Batch
from streamlearn.ingest.raydata_stream import _dead
from streamlearn.ingest.reader import Message
from streamlearn.ingest.windows import Window


def _through_arrow(row: dict) -> dict:
    return source.unpack(pa.concat_tables([source.pack([row])]))[0]


def test_a_lane_s_slices_travel_as_one_row_in_their_order():
    rows = [{"window": seq, "x": bytes([seq]) * 3} for seq in (4, 5, 6)]
    table = source.pack(rows)
    assert table.num_rows == 1 and table.column("windows").to_pylist() == [[4, 5, 6]]
    assert source.unpack(pa.concat_tables([table, source.pack(rows[:1])])) == rows + rows[:1]


def test_a_joined_checkpoint_slice_survives_the_trip_whole():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    state = {"p1/clock": np.array([5.0, 6.0]), "p1/events.key": np.array([7, 9], np.uint64),
             "p1/events.features": np.ones((2, 4), np.float32)}
    batch = Batch(Window(3, {1: (0, 10)}, checkpoint=True), x, np.array([0, 1, 0], np.float32),
                  np.array([11, 12, 13], np.uint32), [(Message(1, 4, b"{bad"), "invalid_json: ...")],
                  bad_labels=[(Message(1, 2, b'{"event_id": "x"}'), "label_without_event: ...")], expired=2,
                  join_delta=state)
    row = _through_arrow(source._decoded_row(3, batch, rows=17, read_s=0.5, decode_s=0.25))

    assert (row["window"], row["rows"], row["expired"]) == (3, 17, 2)
    assert np.array_equal(np.frombuffer(row["x"], row["x_dtype"]).reshape(3, 4), x)
    assert np.frombuffer(row["crc"], np.uint32).tolist() == [11, 12, 13]
    assert _dead(row, "bad") == batch.bad
    assert _dead(row, "bad_label") == batch.bad_labels
    back = source.read_join_state(row)
    assert back.keys() == state.keys()
    for name, array in state.items():
        assert back[name].dtype == array.dtype and np.array_equal(back[name], array)


def test_a_slice_between_checkpoints_carries_no_state_and_an_empty_one_still_counts():
    # With joined labels a lane sends a row for every window, even with nothing in it: the ranks
    # count one row per lane beyond the messages before they call the window complete.
    empty = Batch(Window(4, {}), np.empty((0, 4), np.float32), np.empty(0, np.float32), np.empty(0, np.uint32), [])
    row = _through_arrow(source._decoded_row(4, empty, rows=1, read_s=0.0, decode_s=0.0))
    assert source.read_join_state(row) is None
    assert (row["rows"], _dead(row, "bad"), _dead(row, "bad_label"), row["expired"]) == (1, [], [], 0)


def test_delayed_feedbacks_matured_rows_ride_along_and_a_rank_gets_every_lane_s():
    from streamlearn.ingest.raydata_stream import RayDataStream

    x = np.zeros((2, 4), np.float32)
    rows = []
    for lane, age in ((0, 86_400.0), (1, 90_000.0)):
        matured = np.full((lane + 2, 4), lane, np.float32)  # never learned: beside x, not in it
        batch = Batch(Window(5, {}), x, np.zeros(2, np.float32), np.array([1, 2], np.uint32), [],
                      matured=matured, matured_age_s=age)
        rows.append(_through_arrow(source._decoded_row(5, batch, rows=2, read_s=0.0, decode_s=0.0)))
    plain = _through_arrow(source._decoded_row(5, Batch(Window(5, {}), x, np.zeros(2, np.float32),
                                                        np.array([3, 4], np.uint32), []), 2, 0.0, 0.0))
    assert plain["matured"] == b"" and plain["matured_age_s"] is None
    stream = RayDataStream.__new__(RayDataStream)  # only what _batch reads
    stream._empty, stream.label_topic = (np.empty((0, 4), np.float32), np.empty(0, np.float32)), "t.labels"
    stream.stats = {"read_s": 0.0, "decode_s": 0.0, "slices": 0}
    got = stream._batch(Window(5, {}), [*rows, plain])
    assert got.size == 6 and got.matured.tolist() == [[0.0] * 4] * 2 + [[1.0] * 4] * 3
    assert got.matured_age_s == 90_000.0
