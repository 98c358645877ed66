"""Quality of what was served (issue 16): the answers callers got, joined with the labels that
came later, per served model version.

The trainer's online metric is measured on its own batches; what an operator trusts is how the
answers callers acted on turned out. Those answers (event id, model version, score, time) meet
their labels, hours or weeks later, in the same join state as the trainer's (`ingest/join.py`:
both sides wait, bounded by a TTL and a cap, expiry counted), and each joined pair lands in the
sliding window of the version that gave the answer. An event scored twice (a client's retry)
counts once, with its first answer. Where the pipeline learns silence as an answer
(`JoinedLabels.unlabelled_as`: only frauds are ever reported), an answer with no label within the
TTL is judged against that target too, as the trainer learned it; without it, it leaves unjudged.

Delayed feedback (`matured_only`, issue 45): the TTL is the attribution window, weeks long, and an
answer counts only once its label matured: its report came, or the TTL ended with none. An answer
pushed out by the cap before then leaves unjudged (counted as `answers.cap`), never as a
legitimate payment it may not be. What fits the cap over weeks is a share of the answers:
`sample` keeps the answers, and the reports, of that share of event ids (by their join key, so
both sides keep the same events).

Besides each version's window, one window holds the newest answers of every version: versions
follow each other every few seconds, so what an operator watches over time is that one; the
per-version windows say which version did better. Only the newest `keep_versions` versions keep a
window. The evaluator (`evaluator.py`) feeds this from the two topics.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from streamlearn.ingest.join import Joined, JoinState, join_keys
from streamlearn.prequential import SlidingWindow, summarize

SAMPLE_SLOTS = 1 << 16  # the sample's grain: a share of event ids, in steps of 1/65,536


class ServedQuality:
    def __init__(self, task: str, window: int = 5_000, ttl_s: float = 7 * 86_400.0, max_pending: int = 1_000_000,
                 keep_versions: int = 20, unlabelled_as: float | None = None, matured_only: bool = False,
                 sample: float = 1.0):
        self.task, self.window, self.keep_versions = task, window, keep_versions
        self.unlabelled_as, self.matured_only = unlabelled_as, matured_only
        self._sample = np.uint64(round(sample * SAMPLE_SLOTS))  # join keys below this, mod the slots, are kept
        # An answer waits as an "event" whose two features are its score and its version.
        self.join = JoinState(2, ttl_s, max_pending)
        self.overall = SlidingWindow(window)
        self.windows: dict[int, SlidingWindow] = {}
        self.joined: dict[int, int] = {}  # version -> answers joined with their label, ever
        self.joined_total = 0
        self.unlabelled_total = 0  # answers judged against `unlabelled_as`: no label within the TTL

    def add_answers(self, ids: Iterable[str], versions: np.ndarray, scores: np.ndarray, t) -> int:
        """Answers given at `t` (seconds, one or one per answer); returns how many met a waiting label."""
        keys = join_keys(ids)
        answers = np.column_stack([np.asarray(scores, np.float32), np.asarray(versions, np.float32)])
        keys, answers = self._sampled(keys, answers)
        return self._record(self.join.add_events(keys, answers.reshape(len(keys), 2),
                                                 np.zeros(len(keys), np.uint32), t))

    def add_labels(self, ids: Iterable[str], targets: np.ndarray, t) -> int:
        """Labels that came at `t`; returns how many met a waiting answer."""
        keys, targets = self._sampled(join_keys(ids), np.asarray(targets, np.float32))
        n = len(keys)
        return self._record(self.join.add_labels(keys, targets, np.zeros(n, np.int32),
                                                 np.zeros(n, np.int64), t))

    def expire(self, now: float) -> dict[str, int]:
        """Drop answers and labels that waited past the TTL or the cap; the counts so far, by side and reason."""
        for gone in self.join.expire(now)["events"]:  # as the trainer learned them, the cap's too ...
            if gone.reason == "ttl" or not self.matured_only:  # ... but for an answer whose label has not matured
                self._unlabelled(gone.rows["features"])
        return dict(self.join.expired)

    def _sampled(self, keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys (and their rows) of the sampled share of event ids: the same ids on both sides."""
        if self._sample >= SAMPLE_SLOTS:
            return keys, rows
        kept = keys % np.uint64(SAMPLE_SLOTS) < self._sample
        return keys[kept], rows[kept]

    def _record(self, joined: Joined) -> int:
        self._unlabelled(joined.late_events["features"])  # its label came after the TTL
        return self._judge(joined.features, joined.targets)

    def _unlabelled(self, answers: np.ndarray) -> None:
        if self.unlabelled_as is not None and len(answers):
            self._judge(answers, np.full(len(answers), self.unlabelled_as, np.float32), labelled=False)
            self.unlabelled_total += len(answers)

    def _judge(self, answers: np.ndarray, targets: np.ndarray, labelled: bool = True) -> int:
        """Answers and what they turned out to be, into the windows; `joined` counts those whose label came."""
        scores, versions = answers[:, 0].astype(np.float64), answers[:, 1].astype(np.int64)
        self.overall.add(scores, targets)
        self.joined_total += len(targets) if labelled else 0
        for version in np.unique(versions).tolist():
            mine = versions == version
            self.windows.setdefault(version, SlidingWindow(self.window)).add(scores[mine], targets[mine])
            self.joined[version] = self.joined.get(version, 0) + (int(mine.sum()) if labelled else 0)
        for old in sorted(self.windows)[:-self.keep_versions]:
            del self.windows[old], self.joined[old]
        return len(targets)

    def summary(self, newest: int | None = None) -> dict[int, dict]:
        """Per version (the `newest` few, or all kept): the task's metrics over its window of labelled
        answers, and how many joined ever."""
        kept = sorted(self.windows)[-newest:] if newest else sorted(self.windows)
        return {version: {**summarize(self.task, *self.windows[version].arrays()), "joined": self.joined[version]}
                for version in kept}

    def overall_summary(self) -> dict:
        """The task's metrics over the newest `window` labelled answers, whichever version gave them."""
        return summarize(self.task, *self.overall.arrays())
