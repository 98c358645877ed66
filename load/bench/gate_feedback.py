"""The quality gate under delayed feedback (issue 45): candidates judged on matured labels (the
trainer's evidence since ingest/maturing.py) beside the same candidates judged on the window's own
targets, fake negatives included (its evidence before), in the same run.

    python -m load.bench.gate_feedback [--runs 3] [--candidates 120] [--events 4000]

A run learns the generator's stream (no drift) as `DelayedFeedback` makes the trainer learn it:
each event at once as legitimate, each fraud again when its report comes, a log-normal delay of
median `--median-delay` events (sigma 1, capped below the attribution window of `--ttl` events),
the loss weighted by FNW (train/feedback.py). Time is counted in events: 4,000 events between
checkpoints stand for the trainer's 2 s. Two evidences are kept per checkpoint, each the newest
4,096 rows of its kind with the scores the training model gave them:

- `fake negatives` (the trainer's evidence before): every learned row with the target it was
  learned with (an unreported fraud counts as legitimate), scored just before it was learned;
- `matured` (now): the reports (final as they come) and one in 16 of the events an interval whose
  attribution window ended unreported, scored together, before each window is learned, by the
  model as it stands (the trainer: train/learner.py, `judge_matured`).

Each evidence goes to a real ModelStore of its own (the scorer's defaults); every checkpoint is
submitted to both. As in load/bench/gate.py, every 5th interval a truly worse candidate comes
first, in turn a lineage learning shuffled labels or the good model with noise in its weights at
least 0.05 AUC worse on 20,000 held-out events. What the gate is for: holding the worse, never the
good. A judgement with too few of either class ("too little evidence") lets the candidate through.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from load.bench.common import median, write_json, write_section
from load.bench.gate import BATCH, EVIDENCE, WORSE_EVERY, noisy, scored_by
from streamlearn.ingest.maturing import DENSITY, SAMPLE
from streamlearn.loadgen.generator import BankingSimulator
from streamlearn.pipeline import load_pipeline
from streamlearn.prequential import roc_auc
from streamlearn.rundir import checkpoint
from streamlearn.serve.model_store import ModelStore
from streamlearn.train.evidence import EvidenceSampler
from streamlearn.train.feedback import fake_negative_weights

FRAUD = load_pipeline("fraud")
KINDS = ("fake negatives", "matured")
WINDOWS = 8  # windows a checkpoint interval (the trainer: ~8k-event windows, a checkpoint every 2 s)


class Learner:
    """Delayed feedback's learning on one interval's rows, keeping both kinds of evidence."""

    def __init__(self, seed: int, shuffled: bool = False):
        torch.manual_seed(seed)
        self.model = FRAUD.build_model()
        self.optimizer = FRAUD.make_optimizer(self.model.parameters())
        self.evidence = {kind: EvidenceSampler(EVIDENCE) for kind in KINDS}
        self.rng = np.random.default_rng(seed)
        self.shuffled = shuffled

    def learn(self, arrivals: np.ndarray, reports: np.ndarray, matured: np.ndarray) -> None:
        """One checkpoint interval, in WINDOWS windows as the trainer reads it: before each window is
        learned, its reports and its share of the matured events are scored together by the model as
        it stands (one model for both classes); then its rows are learned in one shuffled order,
        arrivals as legitimate, reports as frauds, each row scored just before its step."""
        parts = [np.array_split(a, WINDOWS) for a in (arrivals, reports, matured)]
        for new, reported, negatives in zip(*parts, strict=True):
            final = np.concatenate([reported, negatives])
            if len(final):
                y_final = np.r_[np.ones(len(reported), np.float32), np.zeros(len(negatives), np.float32)]
                self.evidence["matured"].add(scored_by(self.state(), final), y_final, lambda final=final: final)
            self._steps(new, reported)

    def _steps(self, arrivals: np.ndarray, reports: np.ndarray) -> None:
        x = np.concatenate([arrivals, reports])
        y = np.r_[np.zeros(len(arrivals), np.float32), np.ones(len(reports), np.float32)]
        order = self.rng.permutation(len(y))
        x, y = torch.from_numpy(x[order]), torch.from_numpy(y[order])
        learned = y[torch.from_numpy(self.rng.permutation(len(y)))] if self.shuffled else y
        for start in range(0, len(y), BATCH):
            rows, y_rows, y_learned = x[start:start + BATCH], y[start:start + BATCH], learned[start:start + BATCH]
            output = self.model(rows)
            loss = (FRAUD.loss(output, y_learned) * fake_negative_weights(FRAUD.score(output), y_learned)).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.evidence["fake negatives"].add(FRAUD.score(output.detach()).numpy(), y_rows.numpy(), rows.numpy)

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


class Stream:
    """The generator's events, each fraud's report `delay` events after it, and the events whose
    attribution window (`ttl` events) ended with none."""

    def __init__(self, seed: int, median_delay: int, ttl: int, events: int):
        self.sim, self.rng = BankingSimulator(seed, drift_at=None), np.random.default_rng(seed + 7)
        self.median_delay, self.ttl = median_delay, ttl
        # As the trainer draws them (ingest/maturing.py): one in DENSITY of as many matured events as
        # an interval learns, at most SAMPLE a window.
        self.sample = min(SAMPLE * WINDOWS, events // DENSITY)
        self.due: list[tuple[int, np.ndarray]] = []  # (event index it is reported at, its features)
        self.past: list[tuple[int, np.ndarray, np.ndarray]] = []  # (first index, features, truth), oldest first
        self.n = 0

    def interval(self, events: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(arrivals, reports due in this interval, a sample of the events that matured unreported)."""
        batch = self.sim.events(events)
        x, truth = FRAUD.features(batch), FRAUD.targets(batch)
        start, end = self.n, self.n + events
        frauds = np.flatnonzero(truth > 0.5)
        delays = np.minimum(self.rng.lognormal(np.log(self.median_delay), 1.0, len(frauds)), self.ttl - 1)
        self.due += [(start + int(i) + int(d), x[i]) for i, d in zip(frauds, delays, strict=True)]
        now = [row for at, row in self.due if at < end]
        self.due = [(at, row) for at, row in self.due if at >= end]
        reports = np.stack(now) if now else np.empty((0, x.shape[1]), np.float32)
        self.past.append((start, x, truth))
        self.n = end
        return x, reports, self._matured(start - self.ttl, end - self.ttl)

    def _matured(self, lo: int, hi: int) -> np.ndarray:
        """Up to `sample` of the events with index in [lo, hi), legitimate (every fraud is
        reported within the window), spread evenly; intervals past the window are dropped."""
        rows = [x[i] for first, x, truth in self.past
                for i in np.unique(np.linspace(max(lo, first) - first, min(hi, first + len(x)) - first - 1,
                                               self.sample).astype(int))
                if max(lo, first) < min(hi, first + len(x)) and truth[i] < 0.5]
        self.past = [p for p in self.past if p[0] + len(p[1]) > hi]
        return np.stack(rows[:self.sample]) if rows else np.empty((0, FRAUD.features([]).shape[1]), np.float32)


def run(seed: int, candidates: int, events: int, median_delay: int, ttl: int) -> dict:
    stream = Stream(seed, median_delay, ttl, events)
    good, shuffled = Learner(seed), Learner(seed + 1, shuffled=True)
    rng = np.random.default_rng(seed)
    held_out_events = BankingSimulator(seed + 100, drift_at=None).events(20_000)
    held_out = FRAUD.features(held_out_events), FRAUD.targets(held_out_events)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {kind: Path(tmp) / str(i) / FRAUD.name for i, kind in enumerate(KINDS)}
        stores = {kind: ModelStore(FRAUD, dirs[kind]) for kind in KINDS}
        rows: list[dict] = []
        version = 0

        def submit(state: dict, evidence: dict, kind: str) -> None:
            nonlocal version
            version += 1
            row = {"version": version, "kind": kind}
            for name, store in stores.items():
                meta = {"version": version, "offsets": {"0": version}, "counters": {}, "pipeline": FRAUD.describe(),
                        "metrics": {"online": {"auc": 0.9}}, "written_at": time.time()}
                checkpoint.publish(dirs[name], version, state, None, meta, evidence=evidence[name])
                store.poll_once()
                decision = store.ledger.read(version)
                judged = (decision.evidence or {}).get("hold") is not None
                row[name] = {"held": not decision.approved, "judged": judged}
                checkpoint.prune(dirs[name], 30, hold={store.ledger.newest_approved() or 0})
            rows.append(row)

        for interval in range(1, candidates + 1):
            arrivals, reports, matured = stream.interval(events)
            before = good.state()
            for learner in (good, shuffled):
                learner.learn(arrivals, reports, matured)
            evidence = {kind: good.evidence[kind].take() for kind in KINDS}
            bad = {kind: shuffled.evidence[kind].take() for kind in KINDS}
            if interval % WORSE_EVERY == 0 and interval > 1:
                if (interval // WORSE_EVERY) % 2:
                    submit(shuffled.state(), bad, "shuffled")
                else:
                    broken, _gap = noisy(before, rng, held_out)
                    submit(broken, {k: e and {**e, "scores": scored_by(broken, e["features"])}
                                    for k, e in evidence.items()}, "noisy")
            submit(good.state(), evidence, "good")
        for store in stores.values():
            store.stop()
    auc = roc_auc(scored_by(good.state(), held_out[0]), held_out[1])
    return {"held_out_auc": round(float(auc), 4), **{kind: summarise(rows, kind) for kind in KINDS}}


def summarise(rows: list[dict], kind: str) -> dict:
    out = {}
    for group, mine in (("good", [r for r in rows[1:] if r["kind"] == "good"]),
                        ("worse", [r for r in rows[1:] if r["kind"] != "good"]),
                        *((kind, [r for r in rows[1:] if r["kind"] == kind]) for kind in ("shuffled", "noisy"))):
        out[group] = {"candidates": len(mine), "held": sum(r[kind]["held"] for r in mine),
                      "held_share": sum(r[kind]["held"] for r in mine) / max(len(mine), 1),
                      "judged_share": sum(r[kind]["judged"] for r in mine) / max(len(mine), 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=120, help="checkpoint intervals a run (good candidates)")
    parser.add_argument("--events", type=int, default=4000, help="events between checkpoints")
    parser.add_argument("--median-delay", type=int, default=8000, help="a report's median delay, in events")
    parser.add_argument("--ttl", type=int, default=40_000, help="the attribution window, in events")
    args = parser.parse_args()
    started = time.time()
    runs = []
    for i in range(args.runs):
        runs.append(run(11 + i, args.candidates, args.events, args.median_delay, args.ttl))
        print(f"run {i + 1}: {runs[-1]}", flush=True)
    figures = {kind: {f"{group}_{key}": median([r[kind][group][key] for r in runs])
                      for group in ("good", "worse") for key in ("held_share", "judged_share")} for kind in KINDS}
    figures["held_out_auc"] = median([r["held_out_auc"] for r in runs])
    print(figures)
    write_json("gate_feedback", {"args": vars(args), "figures": figures, "runs": runs,
                                 "seconds": round(time.time() - started)})
    write_section("gate_feedback", "Quality gate under delayed feedback: matured labels against fake negatives",
                  _body(args))


def _body(args) -> str:
    return f"""`python -m load.bench.gate_feedback --runs {args.runs} --candidates {args.candidates}
--events {args.events} --median-delay {args.median_delay} --ttl {args.ttl}`: the generator's stream without
drift, learned as delayed feedback does (every event at once as legitimate, each fraud again at its report, FNW), time
in events: reports a log-normal {args.median_delay:,} events late (median), an attribution window of
{args.ttl:,}. Every checkpoint is judged twice by real ModelStores with the scorer's defaults: on the
trainer's evidence of matured labels (reports, and events whose window ended unreported) and on the
window's own targets, fake negatives included (the evidence before). Every {WORSE_EVERY}th interval a truly
worse candidate comes first (shuffled labels or noisy weights, in turn). "Judged": the paired test
had enough of both classes; otherwise the candidate goes through ("too little evidence"): the matured
gate's first {args.ttl // args.events} intervals, before any window has ended. Quality of the good lineage: its
AUC on 20,000 held-out events with their true labels. A first form of the matured evidence scored
the reports just before their steps and the matured events after the interval, each class by
another model: it held 3.4 % of good candidates (4 / 2 / 5 of 119, same seeds), so both classes are
now scored by one model before each window.
"""


if __name__ == "__main__":
    main()
