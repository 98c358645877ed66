"""Checkpoints load only after their checksum verifies, on the training side's restore path too."""

from __future__ import annotations

import pytest
import torch

from streamlearn.config import TrainConfig
from streamlearn.errors import CheckpointError
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.train.loop import _restore


def restore(tmp_path):
    """The restore path as rank 0 runs it, over the run directory."""
    return _restore(TrainConfig(checkpoint_dir=str(tmp_path / "runs")), 0)


def write(path, version=1):
    return ckpt.write(path, {"w": torch.ones(3)}, {"state": {}}, {"version": version, "counters": {"learned": 3}})


RUN = ("runs", "fraud")  # TrainConfig's default run name is the pipeline's


def test_restore_loads_the_newest_verified_checkpoint(tmp_path):
    assert restore(tmp_path) is None  # a new lineage
    write(tmp_path.joinpath(*RUN, "checkpoint_000000001"))
    write(tmp_path.joinpath(*RUN, "checkpoint_000000002"), version=2)
    model, optimizer, meta, arrays, _path = restore(tmp_path)
    assert torch.equal(model["w"], torch.ones(3)) and optimizer == {"state": {}} and meta["version"] == 2
    assert arrays == {}  # no join state: a pipeline with inline labels


def test_a_join_state_travels_in_the_checkpoint_under_its_checksum(tmp_path):
    import numpy as np

    from streamlearn.ingest.join_files import JoinFiles
    from streamlearn.ingest.labelled import LabelJoin
    from tests.unit.test_labelled import SPEC, D, _events, stream

    run = tmp_path.joinpath(*RUN)
    run.mkdir(parents=True)
    join = LabelJoin(SPEC, D, 4)
    join.window({3: _events(stream(1)[0], 0, 5)}, {})
    path = ckpt.publish(run, 1, {"w": torch.ones(2)}, None, {"version": 1}, join=(JoinFiles(), join.delta()))
    *_, arrays, _path = restore(tmp_path)
    assert arrays["p3/events.key"].tolist() == join.snapshot()["p3/events.key"].tolist()
    np.savez(path / ckpt.ARRAYS, nothing=np.zeros(1))  # the join state's clocks and waiting rows rewritten
    with pytest.raises(CheckpointError, match="join.npz fails its checksum"):
        restore(tmp_path)


@pytest.mark.parametrize("tamper", ["weights", "meta", "sums", "missing"])
def test_restore_refuses_a_tampered_checkpoint(tmp_path, tamper):
    """A corrupt newest checkpoint stops the restore: the older one beside it would replay events."""
    write(tmp_path.joinpath(*RUN, "checkpoint_000000001"))
    path = write(tmp_path.joinpath(*RUN, "checkpoint_000000002"), version=2)
    if tamper == "weights":  # a well-formed torch file with other weights: only the checksum can tell
        torch.save({"model": {"w": torch.zeros(3)}, "optimizer": None}, path / "model.pt")
    elif tamper == "meta":  # rewinding offsets would replay (or skip) events
        (path / "meta.json").write_text('{"version": 2, "counters": {"learned": 0}}')
    elif tamper == "sums":
        (path / ckpt.SUMS).write_text("0" * 64 + "  model.pt\n")
    else:
        (path / "model.pt").unlink()
    with pytest.raises(CheckpointError):
        restore(tmp_path)


def test_restore_passes_over_an_incomplete_checkpoint(tmp_path):
    """No checksum file: a crash mid-write, or a checkpoint being pruned. Not a checkpoint yet."""
    write(tmp_path.joinpath(*RUN, "checkpoint_000000001"))
    half = write(tmp_path.joinpath(*RUN, "checkpoint_000000002"), version=2)
    (half / ckpt.SUMS).unlink()
    assert restore(tmp_path)[2]["version"] == 1


def test_publish_renames_a_whole_checkpoint_into_place_and_never_overwrites(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    path = ckpt.publish(run, 7, {"w": torch.ones(2)}, None, {"version": 7})
    assert path.name == "checkpoint_000000007" and ckpt.restore_point(run) == path
    assert [p.name for p in run.iterdir()] == [path.name]  # no staging directory left behind
    with pytest.raises(CheckpointError, match="versions only move forward"):
        ckpt.publish(run, 7, {"w": torch.zeros(2)}, None, {"version": 7})
