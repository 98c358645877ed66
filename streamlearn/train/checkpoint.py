"""Checkpoint files: model, optimizer, offsets and counters, with a checksum over all of it.

Layout of one checkpoint directory:
    model.pt     torch state of the model (unwrapped from DDP) and the optimizer
    meta.json    pipeline, version, offsets, counters, metrics (see `write`)
    SHA256SUMS   sha256 of the two files above; written last, so its presence means complete
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from streamlearn.errors import CheckpointError

SUMS = "SHA256SUMS"
FILES = ("model.pt", "meta.json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write(directory: str | Path, model_state: dict, optimizer_state: dict | None, meta: dict[str, Any]) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model_state, "optimizer": optimizer_state}, directory / "model.pt")
    (directory / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    sums = "".join(f"{_sha256(directory / name)}  {name}\n" for name in FILES)
    tmp = directory / (SUMS + ".tmp")
    tmp.write_text(sums)
    os.replace(tmp, directory / SUMS)
    return directory


def verify(directory: str | Path) -> None:
    """Raise CheckpointError unless every file matches the checksum written with it."""
    directory = Path(directory)
    try:
        lines = (directory / SUMS).read_text().splitlines()
    except OSError:
        raise CheckpointError(f"{directory}: no {SUMS} (incomplete or not a streamlearn checkpoint)") from None
    expected = dict(reversed(line.split("  ", 1)) for line in lines if line)
    for name in FILES:
        if name not in expected:
            raise CheckpointError(f"{directory}: {SUMS} does not cover {name}")
        try:
            actual = _sha256(directory / name)
        except OSError:
            raise CheckpointError(f"{directory}: {name} is missing") from None
        if actual != expected[name]:
            raise CheckpointError(f"{directory}: {name} fails its checksum (corrupt or tampered)")


def read_meta(directory: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(directory) / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: unreadable meta.json ({e})") from None


def load(directory: str | Path, *, verify_first: bool = True) -> tuple[dict, dict | None, dict[str, Any]]:
    """-> (model_state, optimizer_state, meta). Verifies the checksum before unpickling anything."""
    if verify_first:
        verify(directory)
    try:
        state = torch.load(Path(directory) / "model.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(f"{directory}: model.pt does not load ({type(e).__name__}: {e})") from None
    return state["model"], state.get("optimizer"), read_meta(directory)


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(version, path) of every complete-looking checkpoint under a run directory, oldest first."""
    found = []
    for path in Path(run_dir).glob("checkpoint_*"):
        if (path / SUMS).exists():
            try:
                found.append((int(read_meta(path)["version"]), path))
            except (CheckpointError, KeyError, ValueError):
                continue
    return sorted(found)


def newest(run_dir: str | Path) -> Path | None:
    """The newest checkpoint that passes its integrity check, or None."""
    for _version, path in reversed(list_checkpoints(run_dir)):
        try:
            verify(path)
            return path
        except CheckpointError:
            continue
    return None
