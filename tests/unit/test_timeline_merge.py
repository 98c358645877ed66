"""`streamlearn timeline merge`: per-rank traces into one Chrome trace, live or crashed files included."""

from __future__ import annotations

import json

import pytest

from streamlearn.errors import StreamlearnError
from streamlearn.observe.timeline import merge, read_trace
from streamlearn.phases import Phases


def test_merge_keeps_each_rank_and_reads_an_unfinished_file(tmp_path):
    for rank in (0, 1):
        phases = Phases(rank, str(tmp_path / "tl"))
        with phases("fetch", window=1):
            pass
        with phases("train", events=10):
            with phases("forward"):
                pass
        phases.record("allreduce", 1_795_000_000.0, 0.002, tid="allreduce", bytes=64)
        if rank == 0:
            phases.close()
        else:
            phases._file.flush()  # rank 1 is still running (or was killed): no closing bracket yet
    live = (tmp_path / "tl.rank1.json").read_text()
    assert not live.rstrip().endswith("]")
    assert len(read_trace(tmp_path / "tl.rank1.json")) == 5
    json.loads((tmp_path / "tl.rank0.json").read_text())  # a closed file is plain JSON as it is

    out = tmp_path / "merged.json"
    assert merge([tmp_path / "tl.rank0.json", tmp_path / "tl.rank1.json"], out) == 10
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"rank 0", "rank 1"}
    for rank in (0, 1):
        assert {e["name"] for e in events if e["ph"] == "X" and e["pid"] == rank} == {
            "fetch", "train", "forward", "allreduce"}
    totals = Phases(0)
    totals.record("allreduce", 0.0, 0.25, tid="allreduce")
    assert totals.take() == {"allreduce": 0.25}


def test_merge_without_files_says_how():
    with pytest.raises(StreamlearnError, match="timeline merge"):
        merge([], "out.json")
