"""The featurized rows of the events a rank learned, on disk by (partition, offset): where a late
report's event is found before Kafka is re-read (feedback.py).

A chargeback names its event by its place in the events topic. Re-reading that place is a seek
and a fetch (~1.8 ms on two cores): at a 1.6 % fraud rate, more than learning the 1,000 events
around it. The rank that learns an event's arrival already holds its features, so it writes them
here as it decodes each window, and the report's lookup is a `pread` of one row.

A cache, never the truth. A row is used only if it holds the offset asked for, the id the
report names (its bytes, or for a long id its 64-bit hash) and the mark of a whole row; anything else
(never written, a dead-lettered event, another rank's partition before a resize, a file lost
or torn) is a miss, and the event is re-read from Kafka as before. What a hit gives is what the
re-read gives (the pipeline's features are per event, and the bytes are the same float32s), so
a replay learns the same whether its rows came from here or from Kafka.

Layout: one sparse file per partition and 2^18 offsets, a row at (offset mod 2^18) * row size,
rows a power of two in size so none straddles a page (a crash tears whole rows, which the mark
and the offset then refuse). Writing the same window again (a replay, a warm hand-over's two
groups) writes the same bytes to the same place. Memory does not grow with the delay: rows are
read with `pread`, not mapped. Disk is bounded by the topic's retention: a file whose offsets
are all below the topic's oldest is deleted (`prune`).

A window's rows are written by a thread of the store's own while the rank learns: a `pwrite`
into new pages of a sparse file cost this project's VM ~0.6 us a row (its host backs guest pages
as they are first touched), more than the rest of delayed feedback's work on a window, and a lone
rank reads its windows inline (DECISIONS §1), so written in place it was time the rank did not
learn (DECISIONS §20). One window's write at most is in flight (the next `add` waits for it),
and a row of that window is read from the window's own rows in memory: the same bytes, and no
wait for a report a few seconds late (`get` gathers them at once; `_row`, one by one, for `read`).
"""

from __future__ import annotations

import os
import struct
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from streamlearn.ingest.join import join_keys

ROWS_DIR = "feedback-rows"  # in the run directory, beside its checkpoints
SEGMENT_BITS = 18  # offsets per file: 2^18 (32 MiB at 128-byte rows, sparse until written)
MARK = 0x524F5753  # "ROWS": a whole row (a torn or never-written one reads as zeros)
OPEN_FILES = 64  # file descriptors kept open per store; the oldest closed past this
ID_BYTES = 32  # an event id's bytes in its row (a longer one is kept as its 64-bit hash)
HEAD = struct.Struct("<q4xI")  # a row's offset and mark (its crc between them), as row_dtype lays them


def row_dtype(width: int, features: np.dtype) -> np.dtype:
    """One event's row: where it is, its fingerprint, whose it is and its features (in the
    pipeline's own dtype: a hit must give the bytes a re-read would), padded to a power of two."""
    names = ["offset", "crc", "mark", "id", "x"]
    formats = [np.dtype("<i8"), np.dtype("<u4"), np.dtype("<u4"), np.dtype(f"S{ID_BYTES}"),
               (np.dtype(features), (width,))]
    size = np.dtype({"names": names, "formats": formats}).itemsize
    return np.dtype({"names": names, "formats": formats, "itemsize": 1 << (size - 1).bit_length()})


def row_ids(ids: list[str]) -> np.ndarray:
    """Event ids as the rows keep them: their bytes (an ASCII id up to ID_BYTES long, the usual
    case, converted in one numpy call: ~0.1 us an id where hashing each took ~0.3), else "#" and
    the id's 64-bit join key (join.py), which is the same for the id whatever the batch."""
    try:  # one byte wider than kept: an id that fills it is too long
        wide = np.array(ids, dtype=f"S{ID_BYTES + 1}")
        out = wide.astype(f"S{ID_BYTES}")
        if not len(ids) or not wide.view(np.uint8).reshape(len(ids), ID_BYTES + 1)[:, ID_BYTES].any():
            return out
    except UnicodeEncodeError:
        out = np.empty(len(ids), f"S{ID_BYTES}")
    for i, event_id in enumerate(ids):  # the rare long or non-ASCII id, one by one
        raw = event_id.encode()
        out[i] = raw if len(raw) <= ID_BYTES and raw.isascii() else b"#" + join_keys([event_id]).tobytes()
    return out


class RowStore:
    """One store per run and row layout; each rank writes the partitions it reads."""

    def __init__(self, directory: Path, width: int, features: np.dtype = np.dtype(np.float32)):
        self.dtype = row_dtype(width, features)
        self.x_dtype = np.dtype((np.dtype(features), (width,)))
        self._id_at, self._x_at = self.dtype.fields["id"][1], self.dtype.fields["x"][1]
        # A pipeline whose features change shape or type finds none of the old rows.
        self.dir = Path(directory) / f"{np.dtype(features).str.strip('<>|=')}x{width}"
        self._files: dict[tuple[int, int], int] = {}  # (partition, segment) -> fd, oldest first
        self.hits = self.misses = 0
        self.waited_s = 0.0  # time `add` waited for the window before's write: the disk behind learning
        self._writer: ThreadPoolExecutor | None = None  # started at the first add
        self._writing: Future | None = None  # the last window's write, until seen done
        # ... and its rows meanwhile: (partition, segment) -> (first offset, rows)
        self._blocks: dict[tuple[int, int], tuple[int, np.ndarray]] = {}
        self.failed: OSError | None = None  # a write that failed: raised by the next add
        self._retired: list[int] = []  # files let go of while a write may use them: closed once it is done

    def add(self, partitions: np.ndarray, offsets: np.ndarray, ids: np.ndarray, crcs: np.ndarray,
            x: np.ndarray) -> None:
        """One window's learned events (`row_ids` of their ids), each partition's together and in
        offset order (a slice as reader.read_raw gives it): one write per partition and file, the
        gaps (dead-lettered events) written as misses. Written by the store's thread: returns once
        the rows are laid out. A write that failed before is raised here (OSError): the caller
        stops keeping rows."""
        started = time.perf_counter()
        self.flush()
        self.waited_s += time.perf_counter() - started
        if self.failed is not None:
            raise self.failed
        n = len(offsets)
        if not n:
            return
        rows = np.zeros(n, self.dtype)  # zeros: the padding's bytes are the same each time
        rows["offset"], rows["crc"], rows["mark"], rows["id"], rows["x"] = offsets, crcs, MARK, ids, x
        segments = offsets >> SEGMENT_BITS
        cuts = (np.flatnonzero((partitions[1:] != partitions[:-1]) | (segments[1:] != segments[:-1])) + 1).tolist()
        writes = []
        for i, j in zip([0, *cuts], [*cuts, n], strict=True):  # each partition's rows in one file
            p, seg, lo, hi = int(partitions[i]), int(segments[i]), int(offsets[i]), int(offsets[j - 1])
            block = rows[i:j]
            if hi - lo != j - 1 - i:  # events dead-lettered between: their rows stay zeros
                block = np.zeros(hi - lo + 1, self.dtype)
                block[offsets[i:j] - lo] = rows[i:j]
            writes.append((self._fd(p, seg), block, (lo - (seg << SEGMENT_BITS)) * self.dtype.itemsize))
            self._blocks[(p, seg)] = (lo, block)
        self._writer = self._writer or ThreadPoolExecutor(1, thread_name_prefix="rows")
        self._writing = self._writer.submit(_write, writes)

    def flush(self) -> None:
        """Wait for the window being written; its failure is kept in `failed` (its rows read as misses)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            try:
                writing.result()
            except OSError as e:
                self.failed = self.failed or e
            self._blocks = {}
        for fd in self._retired:
            os.close(fd)
        self._retired.clear()

    def get(self, p: int, offsets: list[int], ids: np.ndarray) -> list[tuple[np.ndarray, int] | None]:
        """For each of partition p's `offsets`: (features, crc) if its row is here, whole, and of
        the event whose id is the matching entry of `ids` (`row_ids`); else None."""
        found: list[tuple[np.ndarray, int] | None] = [None] * len(offsets)
        asked, decided = np.asarray(offsets, np.int64), np.zeros(len(offsets), bool)
        for (q, _), (lo, block) in self._blocks.items():  # the window being written: its rows at once
            at = np.flatnonzero((asked >= lo) & (asked < lo + len(block))) if q == p else ()
            if len(at):
                rows = block[asked[at] - lo]
                whole = (rows["offset"] == asked[at]) & (rows["mark"] == MARK) & (rows["id"] == ids[at])
                for i, x, crc in zip(at[whole].tolist(), rows["x"][whole], rows["crc"][whole].tolist(), strict=True):
                    found[i] = (x, crc)
                decided[at] = True
        for i in np.flatnonzero(~decided).tolist():  # the rest from the files, a pread each
            raw = self._row(p, offsets[i])
            if raw and raw[self._id_at:self._id_at + ID_BYTES].rstrip(b"\0") == ids[i]:
                found[i] = (np.frombuffer(raw, self.x_dtype, offset=self._x_at, count=1)[0].copy(),
                            int.from_bytes(raw[8:12], "little"))
        hits = len(found) - found.count(None)
        self.hits, self.misses = self.hits + hits, self.misses + len(found) - hits
        return found

    def read(self, p: int, offsets: list[int]) -> list[np.ndarray | None]:
        """The features of partition p's `offsets` whose rows are here and whole, whatever their
        event (maturing.py samples the events learned, it does not look one up); None elsewhere."""
        return [np.frombuffer(raw, self.x_dtype, offset=self._x_at, count=1)[0].copy() if raw else None
                for raw in map(self._row, [p] * len(offsets), offsets)]

    def _row(self, p: int, o: int) -> bytes:
        """Offset o's row of partition p if it is whole and holds that offset; else b""."""
        seg, size = o >> SEGMENT_BITS, self.dtype.itemsize
        lo, block = self._blocks.get((p, seg), (0, None))
        if block is not None and 0 <= o - lo < len(block):  # a row of the window being written: its bytes here
            raw = block[o - lo:o - lo + 1].view(np.uint8).tobytes()
        elif (p, seg) not in self._files and not (self.dir / _name(p, seg)).exists():
            return b""
        else:
            try:
                raw = os.pread(self._fd(p, seg), size, (o - (seg << SEGMENT_BITS)) * size)
            except OSError:  # an unreadable file is a miss: the event is re-read from Kafka
                return b""
        # The head read as plain bytes: a numpy record's fields cost ~3 us each to reach.
        return raw if len(raw) == size and HEAD.unpack_from(raw) == (o, MARK) else b""

    def prune(self, p: int, low: int) -> None:
        """Delete partition p's files whose every offset is below `low`, the topic's oldest."""
        self.flush()  # no file closed or deleted under a write
        if not self.dir.is_dir():
            return
        for path in self.dir.glob(f"p{p}-*.rows"):
            seg = int(path.stem.split("-")[1])
            if (seg + 1) << SEGMENT_BITS <= low:
                fd = self._files.pop((p, seg), None)
                if fd is not None:
                    os.close(fd)
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def _fd(self, p: int, seg: int) -> int:
        fd = self._files.pop((p, seg), None)
        if fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / _name(p, seg), os.O_RDWR | os.O_CREAT, 0o644)
            if len(self._files) >= OPEN_FILES:  # the least used goes, closed after the write in flight
                self._retired.append(self._files.pop(next(iter(self._files))))
        self._files[(p, seg)] = fd  # re-inserted: the dict's order is the files' last use
        return fd


def _write(writes: list[tuple[int, np.ndarray, int]]) -> None:
    """In the store's thread: (fd, rows, at byte) -> the file (`pwrite` lets the GIL go)."""
    for fd, block, at_byte in writes:
        os.pwrite(fd, block.view(np.uint8), at_byte)


def _name(p: int, seg: int) -> str:
    return f"p{p}-{seg:06d}.rows"
