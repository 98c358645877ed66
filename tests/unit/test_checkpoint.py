import json

import pytest
import torch

from streamlearn.errors import CheckpointError
from streamlearn.train import checkpoint as ckpt


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
