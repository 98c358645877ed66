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
from streamlearn.ingest.raydata_source import pack
from streamlearn.ingest.raydata_stream import RayDataStream
from streamlearn.ingest.windows import Window


def _stream() -> RayDataStream:
    stream = object.__new__(RayDataStream)  # the collecting half only: no Kafka, no Dataset
    stream.world, stream._queue, stream._stash, stream._ended, stream._feed = 1, queue.Queue(), {}, False, None
    stream.label_topic = None  # inline labels: a window is complete at its offsets
    return stream


def test_a_window_waiting_half_the_stall_limit_is_logged_before_the_group_fails(monkeypatch, capsys):
    monkeypatch.setattr(raydata_stream, "STALL_S", 0.4)
    stream, window = _stream(), Window(seq=1, ranges={0: (0, 5)})
    stream._queue.put(pack([{"window": 1, "rows": 3}]))
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
    stream._queue.put(pack([{"window": 1, "rows": 3}]))  # 2 rows of the window never come
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
            stream._queue.put(pack([{"window": 1, "rows": 1}]))

    threading.Thread(target=trickle, daemon=True).start()
    assert sum(r["rows"] for r in stream._rows_of(window)) == 4


def _lanes(*afters):
    return {"windows": [], "lanes": {lane: {"after": after, "asked_s_ago": 0.1} for lane, after in enumerate(afters)}}


def _fed(stream: RayDataStream, state: dict) -> list:
    asks = []
    stream._feed = object()  # rank 0: it holds the feed (asked through feed_state only)
    stream.feed_state = lambda: asks.append(time.monotonic()) or state
    return asks


def test_a_window_every_lane_read_past_fails_long_before_the_stall_limit(monkeypatch):
    """Each lane's slice was yielded (it asked the feed for a later window), Ray Data hands a lane's
    blocks out in order, and the window still lacks rows: they are lost, so waiting on is useless."""
    monkeypatch.setattr(raydata_stream, "STALL_S", 60.0)
    monkeypatch.setattr(raydata_stream, "LOST_S", 0.4)
    monkeypatch.setattr(raydata_stream, "LOST_CHECK_S", 0.1)
    stream, window = _stream(), Window(seq=0, ranges={0: (0, 5)})
    asks = _fed(stream, _lanes(2, 1))  # both lanes past window 0
    stream._queue.put(pack([{"window": 1, "rows": 5}]))  # a later window came; window 0 never will
    started = time.monotonic()
    with pytest.raises(IngestError, match="every read lane read past it .* Ray Data lost its slices"):
        stream._rows_of(window)
    assert time.monotonic() - started < 5
    assert 2 <= len(asks) < 30  # asked only while waiting, at most every LOST_CHECK_S


@pytest.mark.parametrize("afters", [(0, None), (2, -1), (3,)])
def test_a_window_some_lane_has_not_read_past_waits_for_the_stall_limit(monkeypatch, afters):
    """A lane still reading the window (a broker outage, a slow fetch) or not heard from yet (or a
    feed that knows fewer lanes) is not a loss: only the stall limit fails the group then."""
    monkeypatch.setattr(raydata_stream, "STALL_S", 1.0)
    monkeypatch.setattr(raydata_stream, "LOST_S", 0.2)
    monkeypatch.setattr(raydata_stream, "LOST_CHECK_S", 0.05)
    stream, window = _stream(), Window(seq=0, ranges={0: (0, 5)})
    _fed(stream, _lanes(*afters))
    with pytest.raises(IngestError, match="no slice came for 1 s"):
        stream._rows_of(window)
