"""Rank 0's checkpoint writer: the model is snapshotted in memory at the window boundary and
written, fsynced, hashed, published, committed and pruned in a background thread, while the
next windows train.

The contract is the synchronous one's: checkpoints publish strictly in version order (one
thread), and a checkpoint's consumer-group offsets are committed only after it is durable
on disk. A write that fails is raised at the next checkpoint (the worker fails and Ray
Train restores the newest checkpoint that did land), and a group never ends, nor hands over
to the next one, before everything it saved is published.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from streamlearn import faults
from streamlearn.ingest.join_files import JoinFiles, WholeArrays
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.rundir.ledger import held_versions  # what serving needs kept

MAX_PENDING = 2  # a writer slower than the cadence makes training wait rather than pile up copies


def snapshot(state: dict) -> dict:
    """A copy that the next optimizer step cannot change (state dicts hold live tensors; a deep
    copy clones each one)."""
    return copy.deepcopy(state)


class CheckpointWriter:
    def __init__(self, run_dir: Path, keep: int, commit: Callable[[dict[int, int]], None],
                 resumed_from: Path | None = None, whole_join: bool = False):
        self.run_dir, self.keep, self._commit = run_dir, keep, commit
        # The join state's files in the checkpoint the group restored, which its next links on;
        # delayed feedback's state (a few bytes a report) is written whole each time.
        listing = ckpt.read_meta(resumed_from).get("join", {}).get("segments") if resumed_from else None
        self._join = WholeArrays() if whole_join else JoinFiles(resumed_from if listing is not None else None, listing)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._pending: deque[Future] = deque()

    def submit(self, version: int, model_state: dict, optimizer_state: dict | None, meta: dict,
               offsets: dict[int, int], then: Callable[[], None], join: dict | None = None,
               evidence: dict | None = None) -> None:
        """Queue checkpoint `version` (eight parameters: `checkpoint.publish`'s parts, the offsets to
        commit after it, and what to run then). Everything is copied here, before returning: the training
        thread moves on and changes the model, the optimizer and the lineage's offsets (a meta
        that still referred to the live offsets claimed windows its model had not learned: the
        aimed kill after publish found it as events skipped after a restore)."""
        self._reap(block=len(self._pending) >= MAX_PENDING)
        states = snapshot(model_state), snapshot(optimizer_state) if optimizer_state is not None else None
        # `join` is the ranks' join deltas and `evidence` arrays taken for this checkpoint: copies
        # no one changes.
        self._pending.append(self._pool.submit(self._write, version, *states, copy.deepcopy(meta), dict(offsets),
                                               then, join, evidence))

    def _write(self, version, model_state, optimizer_state, meta, offsets, then, join=None, evidence=None) -> None:
        # `submit`'s parameters, in the writer's thread.
        faults.point("before_checkpoint_write")
        ckpt.publish(self.run_dir, version, model_state, optimizer_state, meta,
                     None if join is None else (self._join, join), evidence)
        faults.point("after_publish_before_commit")
        self._commit(offsets)  # only now: the checkpoint holding them is durable
        ckpt.prune(self.run_dir, self.keep, hold=held_versions(self.run_dir))
        then()

    def drain(self) -> None:
        """Wait until every queued checkpoint is published and committed; raise the first failure."""
        self._reap(block=True, everything=True)

    def _reap(self, *, block: bool, everything: bool = False) -> None:
        while self._pending and (self._pending[0].done() or block):
            self._pending.popleft().result()  # re-raises a failed write here, in the training thread
            block = everything

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Reporter:
    """`ray.train.report` (metrics for Ray's Train view; the checkpoints are ours) from a thread of
    its own on every rank. Each call waits on a barrier across ranks through a Ray actor (0.6 s a
    checkpoint measured on the training thread), so a group reports its first checkpoint, then one
    in `every`, and its last: Ray's view lags ours by `every` checkpoints at most. A fault test with
    a report per 2-s checkpoint took 139 s (its Train workers 73.5 s of CPU), one in five 126 s
    (64.2 s). Every rank submits the same sequence and counts alike, so the barrier still pairs
    them up; `close` delivers what is queued before the worker ends."""

    def __init__(self, report: Callable[[dict], None], every: int = 1):
        self._report, self._every, self._queue = report, max(int(every), 1), queue.Queue()
        self._submitted, self._held = 0, None
        self._thread = threading.Thread(target=self._run, name="train-report", daemon=True)
        self._thread.start()

    def submit(self, metrics: dict) -> None:
        self._submitted += 1
        if self._submitted == 1 or self._submitted % self._every == 0:
            self._queue.put(metrics)
            self._held = None
        else:
            self._held = metrics  # sent by `close` if it is the group's last

    def _run(self) -> None:
        while (metrics := self._queue.get()) is not None:
            self._report(metrics)

    def close(self, wait: bool = True) -> None:
        if self._thread.is_alive():
            if wait and self._held is not None:  # a failing worker (wait=False) skips the barrier
                self._queue.put(self._held)
                self._held = None
            self._queue.put(None)
            if wait:
                self._thread.join()
