"""Checkpoint files: model, optimizer, offsets and counters, with a checksum over all of it.

Layout of one checkpoint directory:
    model.pt     torch state of the model (unwrapped from DDP) and the optimizer
    meta.json    pipeline, version, offsets, counters, metrics (see `write`)
    join.npz     with joined labels only: the join state's clocks and which rows wait, and
    join-*.npz   the waiting rows, in segments written once and hard-linked on (join_files.py)
    evidence.npz rank 0's newest events since the checkpoint before, with the training model's
                 scores before it learned them: what the scorer's gate judges it on (evidence.py);
                 with delayed feedback, the reports held back from learning and matured negatives,
                 scored by the checkpoint's model, each report's event by partition and offset
    SHA256SUMS   sha256 of the files above; written last, so its presence means complete
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn import faults
from streamlearn.errors import CheckpointError
from streamlearn.ingest import join_files
from streamlearn.ingest.join_files import ARRAYS, JoinFiles, sha256

SUMS = "SHA256SUMS"
FILES = ("model.pt", "meta.json")  # in every checkpoint
MODEL = FILES  # what the scorer reads, and all it needs verified
META = ("meta.json",)  # what the controller, the demo and status read
EVIDENCE = "evidence.npz"


def write(directory: str | Path, model_state: dict, optimizer_state: dict | None, meta: dict[str, Any],
          join: tuple[JoinFiles, dict[str, np.ndarray]] | None = None,
          evidence: dict[str, np.ndarray] | None = None) -> Path:
    """`join`: with joined labels, the writer's `JoinFiles` and the ranks' join deltas.
    `evidence`: features, scores and targets for the scorer's gate (train/evidence.py)."""
    import torch  # here, not at the top: see load()

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model_state, "optimizer": optimizer_state}, directory / "model.pt")
    known = {}
    if join is not None:  # beside the model, not in it: the scorer loads model.pt on every swap
        listing, known = join[0].write(directory, join[1])
        meta = {**meta, "join": {**meta.get("join", {}), "segments": listing}}
    if evidence is not None:
        np.savez(directory / EVIDENCE, **evidence)
    (directory / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    faults.point("mid_checkpoint_write")
    sums = "".join(f"{known.get(name) or sha256(directory / name)}  {name}\n" for name in _files(directory))
    tmp = directory / (SUMS + ".tmp")
    tmp.write_text(sums)
    os.replace(tmp, directory / SUMS)
    return directory


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in (SUMS, SUMS + ".tmp"))


def publish(run_dir: str | Path, version: int, model_state: dict, optimizer_state: dict | None,
            meta: dict[str, Any], join: tuple[JoinFiles, dict[str, np.ndarray]] | None = None,
            evidence: dict[str, np.ndarray] | None = None) -> Path:
    """Write checkpoint `version` into the run directory, whole or not at all, and durably. (Seven
    parameters: a checkpoint's parts, each its own file; once every checkpoint, never per window.)

    Written beside its final name and renamed into place (atomic on one filesystem), then the
    files and the directory are fsynced: the caller commits Kafka offsets next, and those must
    never be ahead of a checkpoint a crash could still lose."""
    run_dir = Path(run_dir)
    final = run_dir / f"checkpoint_{version:09d}"
    if final.exists():
        raise CheckpointError(f"{final} exists already: versions only move forward; is another run "
                              f"writing this lineage?")
    staging = run_dir / f".staging-{version:09d}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    write(staging, model_state, optimizer_state, meta, join, evidence)
    for name in (*_files(staging), SUMS):
        _fsync(staging / name)  # a linked segment is durable already: its fsync finds nothing to write
    os.rename(staging, final)
    _fsync(run_dir)
    if join is not None:
        join[0].published(final)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore_point(run_dir: str | Path) -> Path | None:
    """The checkpoint training resumes from: the newest complete one, verified, or None.

    Unlike `newest` (the scorer's, which passes over a bad checkpoint to keep serving), a
    corrupt newest checkpoint raises: resuming from an older one would learn events twice.
    One without its checksum file is incomplete (a crash mid-write, or being pruned) and is
    passed over."""
    found = list_checkpoints(run_dir)
    if not found:
        return None
    path = found[-1][1]
    verify(path)
    return path


def verify(directory: str | Path, only: tuple[str, ...] | None = None) -> set[str]:
    """Raise CheckpointError unless every file matches the checksum written with it, or, with
    `only`, the files a reader reads (the join state's hundreds of MB at its cap are the
    trainer's: a scorer hashing them at every swap spent a core on them); -> the files covered."""
    directory = Path(directory)
    try:
        lines = (directory / SUMS).read_text().splitlines()
    except OSError:
        raise CheckpointError(f"{directory}: no {SUMS} (incomplete or not a streamlearn checkpoint)") from None
    expected = dict(reversed(line.split("  ", 1)) for line in lines if line)
    for name in sorted({*FILES, *expected} if only is None else only):
        if name not in expected:
            raise CheckpointError(f"{directory}: {SUMS} does not cover {name}")
        try:
            actual = sha256(directory / name)
        except OSError:
            raise CheckpointError(f"{directory}: {name} is missing") from None
        if actual != expected[name]:
            raise CheckpointError(f"{directory}: {name} fails its checksum (corrupt or tampered)")
    return set(expected)


def read_meta(directory: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(directory) / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: unreadable meta.json ({e})") from None


def load(directory: str | Path, *, verify_first: bool = True) -> tuple[dict, dict | None, dict[str, Any]]:
    """-> (model_state, optimizer_state, meta). Verifies the checksum before unpickling anything."""
    # torch only where model state is read or written: the scale controller, `streamlearn status`
    # and the report read metadata alone, and the controller's process importing torch took
    # 2.9 s of a core at every run's start, beside the workers' own start (2026-11-26).
    import torch

    if verify_first:
        verify(directory)
    try:
        state = torch.load(Path(directory) / "model.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(f"{directory}: model.pt does not load ({type(e).__name__}: {e})") from None
    return state["model"], state.get("optimizer"), read_meta(directory)


def load_arrays(directory: str | Path) -> dict[str, np.ndarray]:
    """The checkpoint's arrays (the join state of joined labels), {} if it has none. Call after
    `load`, which verifies them."""
    path = Path(directory) / ARRAYS
    if not path.exists():
        return {}
    segments = read_meta(directory).get("join", {}).get("segments")
    if segments is not None:
        return join_files.load(Path(directory), segments, verify(directory, only=()))
    try:  # a checkpoint written whole, before the join state went into segments
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: {ARRAYS} does not load ({e})") from None


def load_evidence(directory: str | Path) -> dict[str, np.ndarray] | None:
    """The checkpoint's evidence for the gate, verified, or None if it has none (written by a
    trainer before evidence, or by hand). Raises CheckpointError if it fails its checksum."""
    path = Path(directory) / EVIDENCE
    if not path.exists():
        return None
    verify(directory, only=(EVIDENCE,))
    try:
        with np.load(path, allow_pickle=False) as npz:  # delayed feedback's names its reports' events too
            where = tuple(name for name in ("partition", "offset") if name in npz.files)
            return {name: npz[name] for name in ("features", "scores", "targets", *where)}
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{directory}: {EVIDENCE} does not load ({e})") from None


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


def newest(run_dir: str | Path, only: tuple[str, ...] | None = META) -> Path | None:
    """The newest checkpoint whose files `only` (by default the metadata, what most callers
    read) pass their integrity check, or None."""
    for _version, path in reversed(list_checkpoints(run_dir)):
        try:
            verify(path, only)
            return path
        except CheckpointError:
            continue
    return None


def prune(run_dir: str | Path, keep: int, hold: Collection[int] = ()) -> list[int]:
    """Delete all but the newest `keep` checkpoints and those in `hold`; return the versions deleted.

    Ours rather than Ray Train's `num_to_keep`: during a warm resize two Ray Train runs share
    the run directory, each pruning from its own list, and one failed its run deleting a
    checkpoint the other had already removed. The checksum file goes first, so a reader sees
    an incomplete checkpoint, never a half-deleted one that looks complete."""
    found = list_checkpoints(run_dir)
    gone = []
    for version, path in found[:max(0, len(found) - keep)]:
        if version in hold:
            continue
        try:
            (path / SUMS).unlink()
        except FileNotFoundError:
            continue  # pruned by someone else meanwhile
        shutil.rmtree(path, ignore_errors=True)
        gone.append(version)
    return gone
