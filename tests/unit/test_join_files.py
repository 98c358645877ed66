"""The join state in checkpoints (streamlearn/ingest/join_files.py): each checkpoint is written
with only what changed since the one before, and still restores exactly the state the join held
at it (through joins, expiry, the cap, rewrites, pruned predecessors and restores in between);
a replay from it decides as the join that never stopped; a segment gone or changed is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamlearn.errors import CheckpointError
from streamlearn.ingest import join_files
from streamlearn.ingest.join_files import JoinFiles
from streamlearn.ingest.labelled import LabelJoin
from streamlearn.pipeline import JoinedLabels
from streamlearn.rundir import checkpoint as ckpt
from tests.unit.test_labelled import SPEC, D, _events, _labels, stream

CAPPED = JoinedLabels(SPEC.schema, ttl_s=SPEC.ttl_s, max_pending=160)  # 80 a partition: the cap evicts


def publish(run_dir, version: int, files: JoinFiles, join: LabelJoin):
    return ckpt.publish(run_dir, version, {"w": torch.ones(1)}, None, {"version": version}, join=(files, join.delta()))


def restored(path) -> dict[str, np.ndarray]:
    ckpt.load(path)  # verifies every file, the segments included
    return ckpt.load_arrays(path)


def assert_same_state(from_files: dict, live: dict) -> None:
    assert {k for k in from_files if not k.endswith(".written")} == {k for k, a in live.items() if a.size}
    for name, array in live.items():  # a side with nothing waiting has no rows in the files
        assert np.array_equal(from_files[name] if name in from_files else array[:0], array), name


def windows(seed: int, partitions: int = 2):
    """Both partitions' streams, cut into windows of random sizes: (events, labels) per window."""
    rng = np.random.default_rng(seed)
    streams = [stream(seed + p) for p in range(partitions)]
    at = [[0, 0] for _ in range(partitions)]
    while any(e < len(s[0]) or lab < len(s[1]) for (e, lab), s in zip(at, streams, strict=True)):
        events, labels = {}, {}
        for p, ((t, label_ids, label_t), pos) in enumerate(zip(streams, at, strict=True)):
            e2 = min(len(t), pos[0] + int(rng.integers(0, 25)))
            l2 = min(len(label_ids), pos[1] + int(rng.integers(0, 25)))
            if e2 > pos[0]:
                events[p] = _events(t, pos[0], e2)
            if l2 > pos[1]:
                labels[p] = _labels(label_ids, label_t, pos[1], l2)
            pos[:] = e2, l2
        yield events, labels


@pytest.mark.parametrize("spec", [SPEC, CAPPED], ids=["ttl", "cap"])
@pytest.mark.parametrize("slack", [0, 10**6], ids=["rewrites", "links"])
def test_every_checkpoint_restores_the_state_it_was_taken_at(tmp_path, monkeypatch, spec, slack):
    monkeypatch.setattr(join_files, "SLACK_ROWS", slack)
    rewrites = []
    rewrite = JoinFiles._rewrite
    monkeypatch.setattr(JoinFiles, "_rewrite", lambda self, *a: rewrites.append(a[1]) or rewrite(self, *a))
    join, files, version, linked, written = LabelJoin(spec, D, 2), JoinFiles(), 0, 0, 0
    for w, (events, labels) in enumerate(windows(5)):
        join.window(events, labels)
        if w % 2:
            continue
        version += 1
        path = publish(tmp_path, version, files, join)
        ckpt.prune(tmp_path, keep=2)  # the checkpoints its segments came from are gone
        assert_same_state(restored(path), join.snapshot())
        segments = [np.load(p)["seq"] for p in path.glob("join-*.npz")]
        linked += sum(p.stat().st_nlink > 1 for p in path.glob("join-*.npz"))
        written += len(segments)
        if not slack:  # the files hold at most twice the rows that wait
            assert sum(map(len, segments)) <= 2 * sum(join.pending.values())
        if version % 7 == 0:  # a restart: a fresh join and writer, from the files
            join = LabelJoin(spec, D, 2)
            join.restore(restored(path), lambda p: True)
            files = JoinFiles(path, ckpt.read_meta(path)["join"]["segments"])
    assert version > 20 and written and linked
    assert bool(rewrites) != bool(slack)


def test_a_replay_from_files_decides_as_the_join_that_never_stopped(tmp_path):
    def run(restore_at: int | None) -> tuple:
        join, files, out = LabelJoin(CAPPED, D, 2), JoinFiles(), []
        for w, (events, labels) in enumerate(windows(9)):
            result = join.window(events, labels)
            out.append((sorted(np.concatenate([np.empty(0, np.uint32), *result.crcs]).tolist()),
                        sorted((m.partition, m.offset, r) for m, r in result.dead_labels), result.expired))
            if w % 4 == 0:
                path = publish(tmp_path / str(restore_at), w + 1, files, join)
                if w == restore_at:
                    join = LabelJoin(CAPPED, D, 2)
                    join.restore(restored(path), lambda p: True)
                    files = JoinFiles(path, ckpt.read_meta(path)["join"]["segments"])
        return out, join.pending

    straight = run(None)
    assert straight == run(12) == run(24)
    assert sum(len(o[0]) for o in straight[0]) > 300 and straight[1]["events"]


def test_a_segment_gone_or_changed_is_refused_and_the_scorer_does_not_read_them(tmp_path):
    join, files = LabelJoin(SPEC, D, 2), JoinFiles()
    for version, (events, labels) in enumerate(windows(3), start=1):
        join.window(events, labels)
        path = publish(tmp_path, version, files, join)
        if version == 4:
            break
    segment = max(path.glob("join-*.npz"), key=lambda p: p.stat().st_size)
    segment.unlink()
    np.savez(segment, seq=np.arange(3))  # a new file, not the linked one: the older checkpoints keep theirs
    with pytest.raises(CheckpointError, match=f"{segment.name} fails its checksum"):
        ckpt.load(path)
    ckpt.verify(path, ckpt.MODEL)  # a scorer verifies what it loads, not the trainer's join state
    assert ckpt.newest(tmp_path) == path
    segment.unlink()
    with pytest.raises(CheckpointError, match=f"{segment.name} is missing"):
        ckpt.load(path)


def test_a_delta_that_disagrees_with_the_files_is_refused(tmp_path):
    join, files = LabelJoin(SPEC, D, 1), JoinFiles()
    t, _, _ = stream(1)
    join.window({0: _events(t, 0, 40)}, {})
    publish(tmp_path, 1, files, join)
    join.window({0: _events(t, 40, 80)}, {})
    with pytest.raises(CheckpointError, match="wait in no checkpoint file"):
        publish(tmp_path, 2, JoinFiles(), join)  # a writer that lost the listing
    behind = LabelJoin(SPEC, D, 1)
    behind.window({0: _events(t, 0, 20)}, {})
    with pytest.raises(CheckpointError, match="behind what is on disk"):
        publish(tmp_path, 3, files, behind)


def test_a_checkpoint_written_whole_before_segments_restores_and_the_next_writes_every_row(tmp_path):
    """An upgrade mid-lineage: the newest checkpoint holds the whole state in join.npz (the format
    before segments, no arrival numbers); the restored join numbers its rows afresh, and the first
    checkpoint after writes them all, since none is in a segment yet."""
    join = LabelJoin(SPEC, D, 2)
    for _, (events, labels) in zip(range(6), windows(4), strict=False):
        join.window(events, labels)
    old = {k: v for k, v in join.snapshot().items() if not k.endswith((".seq", ".next"))}
    path = tmp_path / "checkpoint_000000001"
    ckpt.write(path, {"w": torch.ones(1)}, None, {"version": 1})
    np.savez(path / ckpt.ARRAYS, **old)
    (path / ckpt.SUMS).write_text("".join(f"{join_files.sha256(path / n)}  {n}\n" for n in ckpt._files(path)))
    back = LabelJoin(SPEC, D, 2)
    back.restore(restored(path), lambda p: True)
    assert back.pending == join.pending and back.pending["events"]
    new = publish(tmp_path, 2, JoinFiles(path, None), back)
    assert_same_state({k: v for k, v in restored(new).items() if not k.endswith(".seq")},
                      {k: v for k, v in back.snapshot().items() if not k.endswith(".seq")})
    assert all(p.stat().st_nlink == 1 for p in new.glob("join-*.npz"))  # all written, nothing to link
