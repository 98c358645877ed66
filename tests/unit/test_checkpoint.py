import json
import shutil

import pytest
import torch

from streamlearn.errors import CheckpointError
from streamlearn.rundir import checkpoint as ckpt


def write(path, version):
    return ckpt.write(path, {"w": torch.ones(3) * version}, None, {"version": version})


def test_verify_catches_a_flipped_byte(tmp_path):
    d = write(tmp_path / "checkpoint_1", 1)
    ckpt.verify(d)
    blob = bytearray((d / "model.pt").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (d / "model.pt").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum"):
        ckpt.load(d)


def test_incomplete_checkpoint_is_not_listed_as_newest(tmp_path):
    write(tmp_path / "checkpoint_1", 1)
    write(tmp_path / "checkpoint_2", 2)
    (tmp_path / "checkpoint_3").mkdir()
    (tmp_path / "checkpoint_3" / "meta.json").write_text(json.dumps({"version": 3}))  # no SHA256SUMS: mid-write
    assert [v for v, _ in ckpt.list_checkpoints(tmp_path)] == [1, 2]
    (tmp_path / "checkpoint_2" / "meta.json").write_text(json.dumps({"version": 2, "tampered": True}))
    assert ckpt.newest(tmp_path).name == "checkpoint_1"


def test_prune_keeps_the_newest_and_tolerates_another_pruner(tmp_path):
    for v in range(1, 7):
        ckpt.write(tmp_path / f"checkpoint_{v:09d}", {"w": torch.ones(1)}, None, {"version": v})
    shutil.rmtree(tmp_path / "checkpoint_000000002")  # another run's pruner got there first
    assert ckpt.prune(tmp_path, keep=3) == [1, 3]
    assert [v for v, _ in ckpt.list_checkpoints(tmp_path)] == [4, 5, 6]
    assert ckpt.prune(tmp_path, keep=3) == []
