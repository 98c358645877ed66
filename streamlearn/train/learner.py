"""How one rank learns its slice of a window: predict-then-learn, in exactly as many steps as every
other rank (DDP's allreduce a step, or with `--sync window` steps of its own and one average at the
window's end), each event's score kept (before it is learned) for the prequential metrics, the
drift detectors and the gate's evidence."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from streamlearn import faults
from streamlearn.ingest.decode import FINGERPRINT_MOD, Batch
from streamlearn.ingest.feedback import Pool
from streamlearn.phases import Phases
from streamlearn.pipeline import DelayedFeedback, Pipeline
from streamlearn.train.averaging import average
from streamlearn.train.drift import Watch
from streamlearn.train.feedback import fake_negative_weights
from streamlearn.train.optim import plain_step


@dataclass(frozen=True)
class Shuffled:
    """One rank's window in its shuffled order, cut into the steps every rank takes together."""

    features: torch.Tensor
    targets: torch.Tensor
    crcs: np.ndarray
    ends: list[int]  # step s learns rows [ends[s-1], ends[s])
    totals: list[int]  # the rows step s's loss is the mean over: every rank's (DDP) or this rank's
    world: int  # the ranks whose gradients DDP averages: 1 when each rank steps on its own


@dataclass
class Learner:
    model: torch.nn.Module  # DDP-wrapped in a group of several
    optimizer: torch.optim.Optimizer
    pipeline: Pipeline
    device: torch.device
    recent: Watch  # the prequential window (and on rank 0 the drift monitor and the evidence)
    phases: Phases
    per_window: bool = False  # --sync window: steps of its own, the group averaged once a window
    # optimizer.step() without its wrappers: 79 -> 44 us a step of the fraud MLP (train/optim.py)
    step: Callable[[], None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.step = plain_step(self.optimizer)

    @property
    def fake_negatives(self) -> bool:
        spec = self.pipeline.labels
        return isinstance(spec, DelayedFeedback) and spec.correction == "fnw"

    def learn(self, batch: Batch, sizes: list[int], batch_size: int, seed: int, rank: int) -> tuple[int, float, int]:
        """Predict-then-learn over this rank's slice (`sizes`: every rank's, by rank), in exactly as
        many steps as every other rank. Returns (steps, summed loss, fingerprint of the rows learned)."""
        steps = max(math.ceil(n / batch_size) for n in sizes)
        if steps == 0:
            return 0, 0.0, 0
        # Seeded by the window's offsets, not the clock: a window replayed after a crash is
        # learned in the same order, so a resumed lineage ends with the same weights (bitwise).
        rng = np.random.default_rng([seed, rank, *(o for r in sorted(batch.window.ranges.items()) for o in r[1])])
        order = rng.permutation(batch.size)  # local shuffle across partitions
        # The window is put in its shuffled order once, and each step takes a contiguous slice of it:
        # gathering each step's rows of features, targets and fingerprints cost 60-100 us of a
        # 0.7-1.0 ms step (fraud MLP, one thread; measured).
        ends = np.cumsum([split_size(batch.size, steps, s) for s in range(steps)]).tolist()
        own = self.per_window and len(sizes) > 1
        totals = [sum(split_size(n, steps, s) for n in ([batch.size] if own else sizes)) for s in range(steps)]
        window = Shuffled(torch.from_numpy(batch.features[order]), torch.from_numpy(batch.targets[order]),
                          batch.crcs[order], ends, totals, 1 if own else len(sizes))
        with self.phases("train", events=batch.size, steps=steps):
            loss_sum, learned_fp = self.steps(window)
        if own:
            with self.phases("average"):
                average(self.model, self.optimizer, batch.size / sum(sizes))
        return steps, loss_sum, learned_fp

    def judge_matured(self, batch: Batch) -> None:
        """Delayed feedback, every rank, before its slice is learned: the slice's reports and the events
        that matured unreported in it (never learned: ingest/maturing.py), scored together by the
        model as it stands, to the signals that judge on matured labels (drift.Watch: the matured
        metric, which a checkpoint gathers from every rank; on rank 0 the drift detectors too)."""
        reported = batch.targets != self.recent.silent  # a report's label is final as it comes
        matured = batch.matured if batch.matured is not None else batch.features[:0]
        features = np.concatenate([batch.features[reported], matured])
        targets = np.r_[batch.targets[reported], np.full(len(matured), self.recent.silent, batch.targets.dtype)]
        with self.phases("matured", events=len(features)):
            scores = self.score(features)
        self.recent.observe_matured(scores, targets, features, batch.matured_age_s)

    def judge_pool(self, pool: Pool | None) -> None:
        """Delayed feedback, rank 0, at a checkpoint: the gate's evidence. Its frauds are the
        reports every rank holds back from learning (ingest/feedback.py, `hold_events`), which no
        version has learned, so the candidate and the served model are judged alike on hundreds
        of them; its legitimate events the newest that matured unreported. All scored by the model
        as it is checkpointed: the candidate itself."""
        negatives = self.recent.gate_negatives()
        parts = [(pool.x, pool.y, pool.partition, pool.offset)] if pool is not None else []
        if negatives is not None:  # matured: learned by every version, long ago (-1: nowhere to check)
            none = np.full(len(negatives), -1, np.int64)
            parts.append((negatives, np.full(len(negatives), self.recent.silent, np.float32), none, none))
        if not parts:
            return
        features, targets, partition, offset = (np.concatenate([part[i] for part in parts]) for i in range(4))
        with self.phases("pool", events=len(features)):
            scores = self.score(features)
        # Where each report's event is (partition, offset): the gate leaves out those the served
        # version never learned, even as legitimate (serve/gate.py).
        self.recent.pooled({"features": features.astype(np.float32, copy=False),
                            "scores": scores.astype(np.float32, copy=False),
                            "targets": targets.astype(np.float32, copy=False), "partition": partition,
                            "offset": offset})

    def score(self, features: np.ndarray) -> np.ndarray:
        """The model's scores of `features`, as the scorer gives them: the module itself, not DDP's
        wrapper (whose forward may sync buffers with ranks that are not scoring), in eval mode."""
        if not len(features):
            return np.empty(0, np.float32)
        module = getattr(self.model, "module", self.model)
        training = module.training
        with torch.no_grad():
            module.eval()
            try:
                return self.pipeline.score(module(torch.from_numpy(features).to(self.device))).cpu().numpy()
            finally:
                module.train(training)

    def steps(self, window: Shuffled) -> tuple[float, int]:
        """Step s learns rows [ends[s-1], ends[s]) of the shuffled window."""
        model, optimizer, pipeline, phases = self.model, self.optimizer, self.pipeline, self.phases
        fake_negatives = self.fake_negatives
        loss_sum, learned_fp, start = 0.0, 0, 0
        for end, total in zip(window.ends, window.totals, strict=True):
            rows, y_rows = window.features[start:end], window.targets[start:end]
            x, y = rows.to(self.device), y_rows.to(self.device)
            with phases("forward"):
                output = model(x)
                scores = pipeline.score(output.detach())  # once a step: FNW's p and the metrics' score
                per_event = pipeline.loss(output, y)
                if fake_negatives:  # delayed feedback: each reported event is also in as a fake negative
                    per_event = per_event * fake_negative_weights(scores, y)
                # Sum, scaled so DDP's mean over ranks equals the mean over the global batch,
                # however unevenly the window split (an empty rank still joins the allreduce).
                loss = per_event.sum() * (window.world / max(total, 1))  # a rank's own empty step: 0
            optimizer.zero_grad(set_to_none=True)
            with phases("backward"):  # DDP's allreduce overlaps this; the timeline shows it on its own track
                loss.backward()
            with phases("step"):
                self.step()
            faults.point("step")
            if end > start:
                # Into the fingerprint only once the step that used them is taken: a row trained
                # twice, or skipped, shows in the lineage's fingerprint.
                learned_fp += int(window.crcs[start:end].sum(dtype=np.uint64))
                self.recent.observe(scores.cpu().numpy(), y_rows.numpy(), rows.numpy)
                loss_sum += float(per_event.detach().sum())
            start = end
        return loss_sum, learned_fp % FINGERPRINT_MOD


def split_size(n: int, parts: int, index: int) -> int:
    """Size of part `index` when np.array_split cuts n items into `parts`."""
    return n // parts + (1 if index < n % parts else 0)
