"""Join state: events waiting for their labels, labels waiting for their events (issue 16).

A fraud label comes from a chargeback or an analyst hours to weeks after the transaction, many
never come, and on replay a label can be read before its event. So both sides wait, in columns
(numpy arrays in arrival order, not a Python object per event: 241 bytes a pending fraud event
at 1M pending, load/bench/join.py), behind a sorted index of 64-bit keys:

- an entry waits until its other half comes (joined: handed back to be learned), its TTL passes
  (expired) or the side holds `max_pending` rows (the oldest evicted). Expiry and eviction are
  counted per side and returned, never silent: an event expired is "never labelled", a label
  expired is "a label for no known event" and goes to the dead-letter topic with that reason;
- `snapshot()` is every array of the state and `JoinState.restore` rebuilds it, so a checkpoint
  can carry the state beside the offsets of both topics (exactly-once across two topics);
  `delta()` is what changed since a checkpoint wrote it: rows carry an arrival number (`seq`,
  never reused in a partition's side), so a checkpoint writes the rows that arrived since the
  last one and, for the rest, which arrival numbers still wait (ingest/join_files.py).

Keys are 64-bit hashes of the event id's UTF-8 bytes, computed over a whole batch at once in
numpy (blake2b per id cost 6 µs an event, more than half the training loop's budget):
stable across processes (Python's hash is salted per process), and at a million pending ids a
collision has odds of ~1 in 10^7; a key already pending on a side is refused as a duplicate
rather than overwriting it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

GROWTH = 1.25  # spare rows allocated when a side grows: bounds the slack in bytes per pending entry
SMALL_INDEX_ROWS = 65_536  # keys added since the last merge sit in a small sorted index (cheap inserts)


FNV_OFFSET, FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)
MIX1, MIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)  # murmur3's 64-bit finalizer
S33 = np.uint64(33)


def join_keys(ids: Iterable[str]) -> np.ndarray:
    """Event ids -> uint64 join keys, the same in every process and batch: FNV-1a over the UTF-8
    bytes 8 at a time (little-endian words, the last zero-padded), the length mixed in, then
    murmur3's finalizer so that every input bit reaches every key bit."""
    raw = np.array(list(map(str.encode, ids)), dtype=bytes)
    if not len(raw):
        return np.empty(0, np.uint64)
    lengths = np.char.str_len(raw).astype(np.uint64)
    words = -(-raw.dtype.itemsize // 8)
    padded = np.zeros(len(raw), dtype=f"S{8 * words}")
    padded[:] = raw
    columns = padded.view("<u8").reshape(len(raw), words)
    used = (lengths + np.uint64(7)) // np.uint64(8)
    keys = np.full(len(raw), FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(words):  # a short id stops at its own last word, whatever the batch's widest
            keys = np.where(used > j, (keys ^ columns[:, j]) * FNV_PRIME, keys)
        keys = (keys ^ lengths) * FNV_PRIME
        keys ^= keys >> S33
        keys *= MIX1
        keys ^= keys >> S33
        keys *= MIX2
        keys ^= keys >> S33
    return keys


def by_partition(arrays: dict[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    """Arrays named `p<partition>/<name>` (a checkpoint's join state), grouped by partition."""
    out: dict[int, dict[str, np.ndarray]] = {}
    for name, array in arrays.items():
        head, rest = name.split("/", 1)
        out.setdefault(int(head[1:]), {})[rest] = array
    return out


@dataclass
class Expired:
    """Entries that left a side without their other half; `rows` holds their columns."""

    reason: str  # "ttl" or "cap"
    rows: dict[str, np.ndarray]

    @property
    def count(self) -> int:
        return len(self.rows["key"])


class Side:
    """One side of the join: rows in arrival order, a FIFO for expiry, a sorted index for lookups."""

    def __init__(self, columns: dict[str, tuple[np.dtype, tuple[int, ...]]], ttl_s: float, max_pending: int):
        spec = {"key": (np.dtype(np.uint64), ()), "t": (np.dtype(np.float64), ()), "seq": (np.dtype(np.int64), ()),
                **columns}
        self.ttl_s, self.max_pending = ttl_s, max_pending
        self.cols = {name: np.empty((0, *shape), dtype) for name, (dtype, shape) in spec.items()}
        self.alive = np.empty(0, dtype=bool)
        self.base = 0  # global row number of cols[...][0]
        self.n = 0  # rows used (alive or not) from base
        self.head = 0  # rows before base + head are all gone
        self.pending = 0
        self.next_seq = 0  # arrival number of the next row taken
        self._big = (np.empty(0, np.uint64), np.empty(0, np.int64))  # sorted keys, their global rows
        self._small = (np.empty(0, np.uint64), np.empty(0, np.int64))

    # -- writes --
    def add(self, rows: dict[str, np.ndarray]) -> np.ndarray:
        """Append rows (columns by name, `key` and `t` included; `seq` given only by a restore);
        returns the mask of rows taken (False: the key is already pending here, a duplicate)."""
        keys = rows["key"]
        _, hit = self.find(keys)
        taken = ~hit
        if len(keys) > 1:  # a duplicate within the batch: the first one waits, the later are refused
            order = np.argsort(keys, kind="stable")
            repeat = np.zeros(len(keys), dtype=bool)
            repeat[order[1:]] = keys[order[1:]] == keys[order[:-1]]
            taken &= ~repeat
        count = int(taken.sum())
        self._reserve(count)
        lo = self.n
        for name, col in self.cols.items():
            if name == "seq" and "seq" not in rows:  # new arrivals: numbered on
                col[lo:lo + count] = np.arange(self.next_seq, self.next_seq + count)
            else:
                col[lo:lo + count] = rows[name][taken]
        if count:
            self.next_seq = max(self.next_seq, int(self.cols["seq"][lo + count - 1]) + 1)
        self.alive[lo:lo + count] = True
        self.n += count
        self.pending += count
        self._index(rows["key"][taken], np.arange(self.base + lo, self.base + lo + count, dtype=np.int64))
        return taken

    def take(self, keys: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Remove the pending rows with these keys: (mask of keys found, their rows in the keys'
        order). A key given twice takes its row once: the first occurrence."""
        rows, found = self.find(keys)
        if found.sum() > 1:
            hits = np.flatnonzero(found)
            _, first = np.unique(rows[hits], return_index=True)
            found[:] = False
            found[np.sort(hits[first])] = True
        local = rows[found] - self.base
        out = {name: col[local] for name, col in self.cols.items()}
        self.alive[local] = False
        self.pending -= len(local)
        return found, out

    def expire(self, now: float) -> list[Expired]:
        """Drop what waited past the TTL, then the oldest while more than `max_pending` wait."""
        out = []
        t = self.cols["t"]
        end = self.head + int(np.searchsorted(t[self.head:self.n], now - self.ttl_s, side="left"))
        if end > self.head:
            out.append(self._drop(end, "ttl"))
        if self.pending > self.max_pending:
            alive = np.flatnonzero(self.alive[self.head:self.n]) + self.head
            out.append(self._drop(int(alive[self.pending - self.max_pending - 1]) + 1, "cap"))
        self._compact()
        return [e for e in out if e.count]

    # -- reads --
    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global rows, found mask) of pending rows with these keys."""
        rows = np.full(len(keys), -1, dtype=np.int64)
        for sorted_keys, sorted_rows in (self._big, self._small):
            if not len(sorted_keys):
                continue
            at = np.searchsorted(sorted_keys, keys)
            at[at == len(sorted_keys)] = 0
            candidate = sorted_rows[at]
            ok = (sorted_keys[at] == keys) & self._pending(candidate)
            rows[ok] = candidate[ok]
        return rows, rows >= 0

    @property
    def nbytes(self) -> int:
        """Bytes this side holds (allocated columns and index), what the memory figure counts."""
        return (sum(c.nbytes for c in self.cols.values()) + self.alive.nbytes
                + sum(a.nbytes for a in (*self._big, *self._small)))

    def snapshot(self) -> dict[str, np.ndarray]:
        """The pending rows, oldest first."""
        keep = np.flatnonzero(self.alive[self.head:self.n]) + self.head
        return {name: col[keep].copy() for name, col in self.cols.items()}

    def delta(self, written: int) -> dict[str, np.ndarray]:
        """What a checkpoint needs when every row that arrived before `written` is on disk
        already: the pending rows that arrived since (`new.<column>`), and which arrival numbers
        wait (`alive`: bits over `range` = [oldest pending, next], packed), with `written` and the
        pending count. Rows that came and went between two checkpoints are never written."""
        keep = np.flatnonzero(self.alive[self.head:self.n]) + self.head
        seqs = self.cols["seq"][keep]
        lo = int(seqs[0]) if len(seqs) else self.next_seq
        bits = np.zeros(self.next_seq - lo, dtype=bool)
        bits[seqs - lo] = True
        new = keep[np.searchsorted(seqs, written):]
        return {"range": np.array([lo, self.next_seq, written, len(keep)], np.int64), "alive": np.packbits(bits),
                **{f"new.{name}": col[new].copy() for name, col in self.cols.items()}}

    # -- internals --
    def _drop(self, end: int, reason: str) -> Expired:
        gone = np.flatnonzero(self.alive[self.head:end]) + self.head
        rows = {name: col[gone] for name, col in self.cols.items()}
        self.alive[self.head:end] = False
        self.pending -= len(gone)
        self.head = end
        return Expired(reason, rows)

    def _reserve(self, count: int) -> None:
        need = self.n + count
        if need <= len(self.alive):
            return
        if self.pending + count <= len(self.alive) and self.pending < 3 * self.n // 4:
            self._compact(force=True)  # room enough once what is gone is dropped
            if self.n + count <= len(self.alive):
                return
        need = self.n + count  # again: a compaction moved n
        size = max(need, int(len(self.alive) * GROWTH), 1024)
        for name, col in self.cols.items():
            grown = np.empty((size, *col.shape[1:]), col.dtype)
            grown[:self.n] = col[:self.n]
            self.cols[name] = grown
        alive = np.zeros(size, dtype=bool)
        alive[:self.n] = self.alive[:self.n]
        self.alive = alive

    def _compact(self, force: bool = False) -> None:
        """Move the pending rows to the front, in order, once a quarter of the rows in use are
        gone (joined, expired) or when growing would be needed: memory follows what is pending,
        not what passed through. The index is rebuilt (rows moved), a cost spread over at least
        a quarter of the rows' departures."""
        used = self.n
        if not used or (not force and self.pending > 3 * used // 4):
            return
        if force and self.pending == used and self.head == 0:
            return
        keep = np.flatnonzero(self.alive[self.head:self.n]) + self.head
        for col in self.cols.values():
            col[:len(keep)] = col[keep]
        self.alive[:len(keep)] = True
        self.alive[len(keep):] = False
        self.base, self.n, self.head = self.base + used, len(keep), 0  # new global rows: nothing stale matches
        order = np.argsort(self.cols["key"][:self.n], kind="stable")
        self._big = (self.cols["key"][:self.n][order], order.astype(np.int64) + self.base)
        self._small = (np.empty(0, np.uint64), np.empty(0, np.int64))

    def _index(self, keys: np.ndarray, rows: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        small_keys, small_rows = self._small
        at = np.searchsorted(small_keys, keys)
        self._small = (np.insert(small_keys, at, keys), np.insert(small_rows, at, rows))
        if len(self._small[0]) > max(SMALL_INDEX_ROWS, len(self._big[0]) // 8):
            self._merge()

    def _merge(self) -> None:
        """Fold the small index into the big one (both sorted: one insert, no sort), dropping
        entries of rows no longer pending."""
        (big_keys, big_rows), (small_keys, small_rows) = self._pending_only(self._big), self._pending_only(self._small)
        at = np.searchsorted(big_keys, small_keys)
        self._big = (np.insert(big_keys, at, small_keys), np.insert(big_rows, at, small_rows))
        self._small = (np.empty(0, np.uint64), np.empty(0, np.int64))

    def _pending_only(self, index: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        keys, rows = index
        ok = self._pending(rows)
        return keys[ok], rows[ok]

    def _pending(self, rows: np.ndarray) -> np.ndarray:
        """Which global rows still wait (index entries of rows gone or moved are stale)."""
        local = rows - self.base
        ok = (local >= self.head) & (local < self.n)
        ok[ok] &= self.alive[local[ok]]
        return ok


@dataclass
class Joined:
    """Events whose labels came: what the trainer learns (features, targets, event fingerprints).
    `late` holds the labels that found their event but more than the TTL after it (`late_events`:
    those events, never labelled in time), `duplicate` the labels refused because one for the
    same event already waits: both go to the dead-letter topic, as do the events refused because
    one with the same id already waits (`refused_events`, their rows in the input)."""

    features: np.ndarray
    targets: np.ndarray
    crcs: np.ndarray
    keys: np.ndarray
    late: dict[str, np.ndarray] = field(default_factory=dict)
    late_events: dict[str, np.ndarray] = field(default_factory=dict)  # the events of `late`: key, features, crc
    duplicate: dict[str, np.ndarray] = field(default_factory=dict)
    refused_events: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # input rows: id already waits

    @property
    def size(self) -> int:
        return len(self.targets)


LABEL_BYTES = 160  # a label message kept for its dead letter; longer ones are refused when decoded


def _pick(column, index: np.ndarray, dtype) -> np.ndarray:
    """Rows `index` of a column given as an array, a function of the rows, or None (zeros)."""
    if column is None:
        return np.zeros(len(index), dtype)
    return np.asarray(column(index) if callable(column) else column[index], dtype)


@dataclass
class JoinState:
    """Both sides of the join of `<topic>` (events) and `<topic>.labels` (labels), bounded by
    `ttl_s` and `max_pending` rows per side.

    Times are whatever clock the caller keeps, per row; the trainer uses the messages' own Kafka
    timestamps, so a replay of the same offsets makes the same decisions. An event and its
    label join only if the label is at most `ttl_s` after the event, whichever is read first."""

    n_features: int
    ttl_s: float
    max_pending: int
    events: Side = field(init=False)
    labels: Side = field(init=False)
    expired: dict[str, int] = field(default_factory=dict)  # "events.ttl", "labels.cap", ...: counts
    duplicates: dict[str, int] = field(default_factory=lambda: {"events": 0, "labels": 0})
    _last_t: dict[str, float] = field(default_factory=lambda: {"events": float("-inf"), "labels": float("-inf")})

    def __post_init__(self):
        self.events = Side({"features": (np.dtype(np.float32), (self.n_features,)), "crc": (np.dtype(np.uint32), ())},
                           self.ttl_s, self.max_pending)
        self.labels = Side({"target": (np.dtype(np.float32), ()), "partition": (np.dtype(np.int32), ()),
                            "offset": (np.dtype(np.int64), ()), "value": (np.dtype(f"S{LABEL_BYTES}"), ())},
                           self.ttl_s, self.max_pending)

    def add_events(self, keys: np.ndarray, features: np.ndarray, crcs: np.ndarray, t) -> Joined:
        """Decoded events arrived at `t` (one time, or one per event): those whose label already
        waits are joined now, the rest wait."""
        t = self._arrival("events", t, len(keys))
        found, labels = self.labels.take(keys)
        on_time = labels["t"] - t[found] <= self.ttl_s
        late = np.flatnonzero(found)[~on_time]
        joined = Joined(features[found][on_time], labels["target"][on_time], crcs[found][on_time],
                        keys[found][on_time], late=self._late({name: c[~on_time] for name, c in labels.items()}),
                        late_events={"key": keys[late], "features": features[late], "crc": crcs[late]})
        rest = ~found
        taken = self.events.add({"key": keys[rest], "t": t[rest], "features": features[rest], "crc": crcs[rest]})
        self.duplicates["events"] += int((~taken).sum())
        joined.refused_events = np.flatnonzero(rest)[~taken]
        return joined

    def add_labels(self, keys: np.ndarray, targets: np.ndarray, partitions: np.ndarray, offsets, t,
                   values=None) -> Joined:
        """Labels arrived at `t` (one time, or one per label): those whose event waits are joined
        now, the rest wait for theirs. `offsets` and `values` (the label's bytes, for its dead
        letter) are arrays, or functions of the rows wanted: most labels join at once and never
        need theirs (building them for every label was a fifth of the join's time, measured)."""
        t = self._arrival("labels", t, len(keys))
        found, events = self.events.take(keys)
        on_time = t[found] - events["t"] <= self.ttl_s
        hit = np.flatnonzero(found)

        def rows(index: np.ndarray) -> dict[str, np.ndarray]:
            return {"key": keys[index], "t": t[index], "target": targets[index], "partition": partitions[index],
                    "offset": _pick(offsets, index, np.int64), "value": _pick(values, index, f"S{LABEL_BYTES}")}

        joined = Joined(events["features"][on_time], targets[found][on_time], events["crc"][on_time],
                        keys[found][on_time], late=self._late(rows(hit[~on_time])),
                        late_events={name: events[name][~on_time] for name in ("key", "features", "crc")})
        rest = rows(np.flatnonzero(~found))
        taken = self.labels.add(rest)
        self.duplicates["labels"] += int((~taken).sum())
        joined.duplicate = {name: column[~taken] for name, column in rest.items()}
        return joined

    def _late(self, labels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Labels found more than the TTL after their events: each event counts as expired."""
        if n := len(labels["key"]):
            self.expired["events.late"] = self.expired.get("events.late", 0) + n
        return labels

    def _arrival(self, side: str, t, n: int) -> np.ndarray:
        # Expiry walks each side oldest first, so a side's arrival times must not go back (a
        # clock step, a producer's timestamp a little behind the one before it). Per side: the
        # labels topic may be read well ahead of the events, or behind them.
        t = np.maximum.accumulate(np.maximum(np.broadcast_to(np.asarray(t, np.float64), (n,)), self._last_t[side]))
        if n:
            self._last_t[side] = float(t[-1])
        return t

    def expire(self, now: float) -> dict[str, list[Expired]]:
        """Drop what waited too long or past the cap, counted; labels dropped here belong in the
        dead-letter topic (their coordinates are in the rows), events dropped were never labelled."""
        out = {"events": self.events.expire(now), "labels": self.labels.expire(now)}
        for side, gone in out.items():
            for e in gone:
                self.expired[f"{side}.{e.reason}"] = self.expired.get(f"{side}.{e.reason}", 0) + e.count
        return out

    @property
    def pending(self) -> dict[str, int]:
        return {"events": self.events.pending, "labels": self.labels.pending}

    @property
    def nbytes(self) -> int:
        return self.events.nbytes + self.labels.nbytes

    def snapshot(self) -> dict[str, np.ndarray]:
        """Every pending row of both sides as flat arrays (what a checkpoint stores)."""
        return {f"{side}.{name}": array for side in ("events", "labels")
                for name, array in {**getattr(self, side).snapshot(),
                                    "next": np.array(getattr(self, side).next_seq, np.int64)}.items()}

    @classmethod
    def restore(cls, snapshot: dict[str, np.ndarray], n_features: int, ttl_s: float, max_pending: int) -> JoinState:
        state = cls(n_features, ttl_s, max_pending)
        for side in ("events", "labels"):
            rows = {name.split(".", 1)[1]: a for name, a in snapshot.items() if name.startswith(side + ".")}
            next_seq = rows.pop("next", None)
            if len(rows.get("key", ())):
                getattr(state, side).add(rows)
                state._last_t[side] = float(rows["t"][-1])
            if next_seq is not None:  # arrival numbers go on from where the checkpoint's left off
                getattr(state, side).next_seq = max(getattr(state, side).next_seq, int(next_seq))
        return state

    def delta(self, written: dict[str, int]) -> dict[str, np.ndarray]:
        """Both sides' `Side.delta`, as flat arrays `<side>.<name>`."""
        return {f"{side}.{name}": array for side in ("events", "labels")
                for name, array in getattr(self, side).delta(written.get(side, 0)).items()}
