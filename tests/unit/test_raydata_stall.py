"""A Ray Data stream whose window never completes fails the group (which Ray Train restarts from
its last checkpoint) instead of waiting forever; slices that keep coming keep it waiting."""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest

from streamlearn.errors import IngestError
from streamlearn.ingest import raydata_stream
from streamlearn.ingest.raydata_stream import RayDataStream
from streamlearn.ingest.windows import Window


class _Table:
    def __init__(self, rows):
        self.rows = rows

    def to_pylist(self):
        return self.rows


def _stream() -> RayDataStream:
    stream = object.__new__(RayDataStream)  # the collecting half only: no Kafka, no Dataset
    stream.world, stream._queue, stream._stash, stream._ended, stream._feed = 1, queue.Queue(), {}, False, None
    stream.label_topic = None  # inline labels: a window is complete at its offsets
    return stream


def test_a_window_waiting_half_the_stall_limit_is_logged_before_the_group_fails(monkeypatch, capsys):
    monkeypatch.setattr(raydata_stream, "STALL_S", 0.4)
    stream, window = _stream(), Window(seq=1, ranges={0: (0, 5)})
    stream._queue.put(_Table([{"window": 1, "rows": 3}]))
    stream._stash[2] = [{"window": 2, "rows": 1}]
    with pytest.raises(IngestError):
        stream._rows_of(window)
    waiting = [json.loads(line) for line in capsys.readouterr().err.splitlines() if "ray_data_window_waiting" in line]
    assert len(waiting) == 1  # once per window, not once per poll
    assert waiting[0]["level"] == "warning"
    assert (waiting[0]["window"], waiting[0]["arrived"], waiting[0]["size"], waiting[0]["stash"]) == (1, 3, 5, [2])


def test_a_window_missing_rows_with_no_slice_coming_fails_after_the_stall_limit(monkeypatch):
    monkeypatch.setattr(raydata_stream, "STALL_S", 0.3)
    stream, window = _stream(), Window(seq=1, ranges={0: (0, 5)})
    stream._queue.put(_Table([{"window": 1, "rows": 3}]))  # 2 rows of the window never come
    started = time.monotonic()
    with pytest.raises(IngestError, match="3 of its 5 rows arrived and no slice came"):
        stream._rows_of(window)
    assert time.monotonic() - started < 5


def test_slices_that_keep_coming_are_waited_for(monkeypatch):
    monkeypatch.setattr(raydata_stream, "STALL_S", 0.5)
    stream, window = _stream(), Window(seq=1, ranges={0: (0, 4)})

    def trickle():  # one row every 0.3 s: slower than nothing, never 0.5 s without a slice
        for _ in range(4):
            time.sleep(0.3)
            stream._queue.put(_Table([{"window": 1, "rows": 1}]))

    threading.Thread(target=trickle, daemon=True).start()
    assert sum(r["rows"] for r in stream._rows_of(window)) == 4
