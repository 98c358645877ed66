"""Checkpoints load only after their checksum verifies, on the training side's restore path too."""

from __future__ import annotations

import pytest
import torch
from ray.train import Checkpoint

from streamlearn.config import TrainConfig
from streamlearn.errors import CheckpointError
from streamlearn.train import checkpoint as ckpt
from streamlearn.train.loop import _restore


def restore(tmp_path, checkpoint):
    """The restore path as rank 0 runs it, with no newer checkpoint in the run directory."""
    return _restore(TrainConfig(checkpoint_dir=str(tmp_path / "runs")), checkpoint, 0)


def write(path):
    return ckpt.write(path, {"w": torch.ones(3)}, {"state": {}}, {"version": 1, "counters": {"learned": 3}})


def test_restore_loads_a_verified_checkpoint(tmp_path):
    model, optimizer, meta = restore(tmp_path, Checkpoint.from_directory(str(write(tmp_path / "checkpoint_1"))))
    assert torch.equal(model["w"], torch.ones(3)) and optimizer == {"state": {}} and meta["version"] == 1


@pytest.mark.parametrize("tamper", ["weights", "meta", "sums", "missing"])
def test_restore_refuses_a_tampered_checkpoint(tmp_path, tamper):
    path = write(tmp_path / "checkpoint_1")
    if tamper == "weights":  # a well-formed torch file with other weights: only the checksum can tell
        torch.save({"model": {"w": torch.zeros(3)}, "optimizer": None}, path / "model.pt")
    elif tamper == "meta":  # rewinding offsets would replay (or skip) events
        (path / "meta.json").write_text('{"version": 1, "counters": {"learned": 0}}')
    elif tamper == "sums":
        (path / ckpt.SUMS).write_text("0" * 64 + "  model.pt\n")
    else:
        (path / "model.pt").unlink()
    with pytest.raises(CheckpointError):
        restore(tmp_path, Checkpoint.from_directory(str(path)))
