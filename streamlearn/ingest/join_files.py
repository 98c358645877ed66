"""The join state in checkpoints (issue 16): each waiting row written once, then linked.

A bank's labels come weeks late and most never come, so the join state sits at its cap (1M
events, ~250 MB) in normal operation, and a checkpoint every 2 s that wrote it whole cost
2.4 s of rank 0's checkpoint phase and ~130 MB of disk a checkpoint (30 kept: ~7 GB), measured
in a run at the cap. Between two checkpoints only the rows that arrived since are new; the
rest is the same rows, fewer of them. So a checkpoint holds, per partition and side:

    join-p<p>-<side>-<lo>-<hi>.npz  a segment: the rows that arrived in [lo, hi) and waited at
                                    the checkpoint that wrote it, in arrival order (`seq`)
    join.npz                        every partition's clock, and per side which arrival numbers
                                    still wait (bits over [oldest waiting, next]) and how many

and meta.json's `join.segments` lists the segments with their checksums. A segment is written
by the first checkpoint its rows wait at and hard-linked into each later one while any of its
rows waits: every checkpoint directory stays whole on its own (pruning one never touches
another's files), and its SHA256SUMS covers its segments, so a restore verifies all it reads.
When the segments of a partition's side hold more than twice the rows that wait (plus
SLACK_ROWS), the checkpoint rewrites them as one: disk stays within about twice the state, and
each row is rewritten a bounded number of times on average.

The ranks send `LabelJoin.delta()` (the new rows, the bits), not their whole state; rank 0's
writer thread keeps the listing of the checkpoint before (`JoinFiles`), in order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np

from streamlearn.errors import CheckpointError
from streamlearn.ingest.join import by_partition

ARRAYS = "join.npz"
SIDES = ("events", "labels")
SLACK_ROWS = 65_536  # per partition and side: a small state is not worth rewriting


@dataclass(frozen=True)
class Segment:
    file: str
    lo: int
    hi: int
    rows: int
    sha256: str


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _alive(bits: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.unpackbits(bits, count=hi - lo).astype(bool)


def _waiting(directory: Path, segments: list[Segment], alive: np.ndarray, lo: int) -> list[dict[str, np.ndarray]]:
    """Each segment's rows that still wait, by their arrival numbers (bits `alive` from `lo`)."""
    out = []
    for s in segments:
        rows = _read(directory, s.file)
        at = rows["seq"] - lo
        ok = (at >= 0) & (at < len(alive))
        ok[ok] = alive[at[ok]]
        out.append({n: a[ok] for n, a in rows.items()})
    return out


class JoinFiles:
    """Rank 0's writer thread: what the last checkpoint holds of the join state, so that the next
    one writes only what is new. Starts from the checkpoint the group restored (or none)."""

    def __init__(self, previous: Path | None = None, listing: dict | None = None):
        self.previous = previous
        self.segments = {key: [Segment(*s) for s in segs] for key, segs in (listing or {}).items()}
        self._staged: dict[str, list[Segment]] = {}  # the checkpoint being written, until published

    def write(self, directory: Path, delta: dict[str, np.ndarray]) -> tuple[dict, dict[str, str]]:
        """Write `delta`'s join state into a checkpoint being staged at `directory`: -> (meta's
        `join.segments`, checksums of the segments linked from the checkpoint before, which need
        no hashing again). Call `published` once the checkpoint is in place."""
        small, listing, known = {}, {}, {}
        self._staged = {}
        for p, arrays in sorted(by_partition(delta).items()):
            part = f"p{p}"
            small[f"{part}/clock"] = arrays["clock"]
            for side in SIDES:
                key = f"{part}/{side}"
                lo, hi, written, pending = (int(v) for v in arrays[f"{side}.range"])
                new = {n[len(side) + 5:]: a for n, a in arrays.items() if n.startswith(f"{side}.new.")}
                alive = _alive(arrays[f"{side}.alive"], lo, hi)
                segs = self._kept(key, alive, lo, written)
                if sum(s.rows for s in segs) + len(new["seq"]) > 2 * pending + SLACK_ROWS:
                    segs = [self._rewrite(directory, key, segs, new, alive, lo, hi, pending)]
                else:
                    for s in segs:
                        _link(self.previous / s.file, directory / s.file)
                        known[s.file] = s.sha256
                    if len(new["seq"]):
                        segs.append(self._segment(directory, key, new, written, hi))
                small[f"{part}/{side}.range"] = arrays[f"{side}.range"]
                small[f"{part}/{side}.alive"] = arrays[f"{side}.alive"]
                self._staged[key] = segs
                listing[key] = [list(astuple(s)) for s in segs]
        np.savez(directory / ARRAYS, **small)
        return listing, known

    def published(self, directory: Path) -> None:
        self.previous, self.segments = directory, self._staged

    def _kept(self, key: str, alive: np.ndarray, lo: int, written: int) -> list[Segment]:
        """The last checkpoint's segments of `key` that still hold waiting rows; raises if a row
        that arrived before `written` waits in none of them (a rank's delta and this listing
        disagree: writing on would lose it)."""
        covered = np.zeros(max(0, written - lo), dtype=bool)
        kept = []
        for s in self.segments.get(key, []):
            if s.hi > written:
                raise CheckpointError(f"join state {key}: the last checkpoint holds rows up to #{s.hi}, the "
                                      f"rank's state says #{written}: it is behind what is on disk")
            a, b = max(s.lo, lo), min(s.hi, written)
            if a < b:
                covered[a - lo:b - lo] = True
                if alive[a - lo:b - lo].any():
                    kept.append(s)
        if (alive[:len(covered)] & ~covered).any():
            raise CheckpointError(f"join state {key}: rows that arrived before #{written} wait in no checkpoint "
                                  f"file the last checkpoint ({self.previous}) holds")
        return kept

    def _segment(self, directory: Path, key: str, rows: dict[str, np.ndarray], lo: int, hi: int) -> Segment:
        part, side = key.split("/")
        name = f"join-{part}-{side}-{lo:012d}-{hi:012d}.npz"
        np.savez(directory / name, **rows)
        return Segment(name, lo, hi, len(rows["seq"]), sha256(directory / name))

    def _rewrite(self, directory: Path, key: str, segs: list[Segment], new: dict[str, np.ndarray],
                 alive: np.ndarray, lo: int, hi: int, pending: int) -> Segment:
        """The waiting rows of `segs` and the new ones, as one segment. (Eight parameters: the one
        side's whole state as `write` unpacked it, passed on rather than packed again.)"""
        parts = _waiting(self.previous, segs, alive, lo)
        rows = {n: np.concatenate([p[n] for p in parts] + [a]) for n, a in new.items()}
        if len(rows["seq"]) != pending:
            raise CheckpointError(f"join state {key}: {len(rows['seq'])} rows found for {pending} waiting")
        return self._segment(directory, key, rows, segs[0].lo if segs else lo, hi)


class WholeArrays:
    """`JoinFiles` for a state small enough to write whole each checkpoint (delayed feedback's
    reported offsets): one join.npz, no segments, restored by `checkpoint.load_arrays` as is."""

    def write(self, directory: Path, arrays: dict[str, np.ndarray]) -> tuple[None, dict[str, str]]:
        np.savez(directory / ARRAYS, **arrays)
        return None, {}

    def published(self, directory: Path) -> None:
        pass


def _link(source: Path, target: Path) -> None:
    """A hard link; a copy where the filesystem has none (the bytes are the same, the disk not)."""
    try:
        os.link(source, target)
    except FileNotFoundError:
        raise CheckpointError(f"{source} is gone: the checkpoint before was pruned or moved while this one "
                              f"was written") from None
    except OSError:
        shutil.copyfile(source, target)


def _read(directory: Path, name: str) -> dict[str, np.ndarray]:
    try:
        with np.load(directory / name, allow_pickle=False) as npz:
            return {n: npz[n] for n in npz.files}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: {name} does not load ({e})") from None


def load(directory: Path, listing: dict, covered) -> dict[str, np.ndarray]:
    """A checkpoint's join state, as `LabelJoin.snapshot()` names it, plus per side `next` and
    `written` (every waiting row is in a file already). Call after the checksums are verified;
    `covered` is the files they cover: a segment outside them is refused."""
    small = _read(directory, ARRAYS)
    out = {}
    for p, arrays in by_partition(small).items():
        part = f"p{p}"
        out[f"{part}/clock"] = arrays["clock"]
        for side in SIDES:
            key = f"{part}/{side}"
            lo, hi, _written, pending = (int(v) for v in arrays[f"{side}.range"])
            alive = _alive(arrays[f"{side}.alive"], lo, hi)
            segments = [Segment(*s) for s in listing.get(key, [])]
            if unchecked := [s.file for s in segments if s.file not in covered]:
                raise CheckpointError(f"{directory}: {unchecked[0]} is not covered by its checksums")
            if parts := _waiting(directory, segments, alive, lo):
                out.update({f"{key}.{n}": np.concatenate([p[n] for p in parts]) for n in parts[0]})
            found = len(out.get(f"{key}.seq", ()))
            if found != pending:
                raise CheckpointError(f"{directory}: join state {key} has {found} of its {pending} waiting rows")
            out[f"{key}.next"] = out[f"{key}.written"] = np.array(hi, np.int64)
    return out
