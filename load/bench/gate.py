"""The quality gate's decisions on a stationary stream: how often it holds a candidate that is no
worse (false rejections, issue 44: <= 1 %) and how often it holds one that is (true rejections,
>= 95 %), beside the gate it replaced (each candidate's online metric against the last approved
version's, from different windows, tolerance 0.02) judged on the same candidates in the same run.

    python -m load.bench.gate [--runs 3] [--candidates 150] [--events 4000]

A run learns the generator's stream (no drift) predict-then-learn, as the trainer does: the
fraud pipeline's model, optimizer and loss, steps of 256 events, a checkpoint every `--events`
events (2 s at 2k events/s) with the evidence the trainer writes (train/evidence.py: rank 0's
newest 4,096 events with the scores the training model gave them before learning them). Each
checkpoint goes through checkpoint.publish into a run directory that a real ModelStore judges,
with the scorer's default settings. Every 5th interval a truly worse candidate comes first, judged
on the same window: one of two kinds, in turn:

- `shuffled`: a lineage learning the same events with their labels shuffled (the issue's example);
- `noisy`: the good model before the window with Gaussian noise (3x each tensor's mean |w|) in its
  weights, drawn until it is at least 0.05 AUC worse on 20,000 held-out events (a botched update),
  its scores on the window computed from those weights.

Only the gate is measured here, so no broker and no Ray: what it judges is what the trainer writes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from load.bench.common import machine_line, median, write_json, write_section
from streamlearn.loadgen.generator import BankingSimulator
from streamlearn.pipeline import load_pipeline
from streamlearn.prequential import SlidingWindow, roc_auc, summarize
from streamlearn.rundir import checkpoint
from streamlearn.serve.model_store import ModelStore
from streamlearn.train.evidence import EvidenceSampler

FRAUD = load_pipeline("fraud")
BATCH, METRIC_WINDOW, EVIDENCE = 256, 5000, 4096
OLD_TOLERANCE = 0.02
WORSE_EVERY = 5
WORSE_BY = 0.05  # AUC on 20k held-out events: what "truly worse" means for the noisy kind


class Learner:
    """Predict-then-learn on windows, keeping the trainer's online window and evidence."""

    def __init__(self, seed: int, shuffled: bool = False):
        torch.manual_seed(seed)
        self.model = FRAUD.build_model()
        self.optimizer = FRAUD.make_optimizer(self.model.parameters())
        self.online, self.evidence = SlidingWindow(METRIC_WINDOW), EvidenceSampler(EVIDENCE)
        self.rng = np.random.default_rng(seed) if shuffled else None

    def learn(self, features: np.ndarray, targets: np.ndarray) -> None:
        # A shuffled lineage learns permuted labels; its answers are judged by the true ones.
        learned = self.rng.permutation(targets) if self.rng is not None else targets
        x, y, y_learned = torch.from_numpy(features), torch.from_numpy(targets), torch.from_numpy(learned)
        for start in range(0, len(x), BATCH):
            rows, y_rows = x[start:start + BATCH], y[start:start + BATCH]
            output = self.model(rows)
            loss = FRAUD.loss(output, y_learned[start:start + BATCH]).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            scores = FRAUD.score(output.detach()).numpy()
            self.online.add(scores, y_rows.numpy())
            self.evidence.add(scores, y_rows.numpy(), rows.numpy)

    def metric(self) -> float | None:
        return summarize("classification", *self.online.arrays()).get("auc")


def noisy(state: dict[str, torch.Tensor], rng: np.random.Generator, held_out: tuple[np.ndarray, np.ndarray]
          ) -> tuple[dict[str, torch.Tensor], float]:
    """The model with noise in its weights that takes at least WORSE_BY of AUC off on held-out events
    (the model shrugs off small noise: 1x each tensor's mean |w| moves its AUC by < 0.01), and that gap."""
    base = roc_auc(scored_by(state, held_out[0]), held_out[1])
    for _ in range(50):
        broken = {k: v + torch.from_numpy(rng.normal(0, 3 * float(v.abs().mean()), v.shape).astype(np.float32))
                  for k, v in state.items()}
        gap = roc_auc(scored_by(broken, held_out[0]), held_out[1]) - base
        if gap <= -WORSE_BY:
            return broken, gap
    raise RuntimeError("no noise draw made the model worse by WORSE_BY")


def scored_by(state: dict[str, torch.Tensor], features: np.ndarray) -> np.ndarray:
    model = FRAUD.build_model()
    model.load_state_dict(state)
    with torch.inference_mode():
        return FRAUD.score(model(torch.from_numpy(features))).numpy().astype(np.float32)


def run(seed: int, candidates: int, events: int, **gate: float) -> dict:
    sim = BankingSimulator(seed, drift_at=None)
    good, shuffled = Learner(seed), Learner(seed + 1, shuffled=True)
    rng = np.random.default_rng(seed)
    held_out_events = BankingSimulator(seed + 100, drift_at=None).events(20_000)
    held_out = FRAUD.features(held_out_events), FRAUD.targets(held_out_events)
    true_gaps: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / FRAUD.name
        store = ModelStore(FRAUD, run_dir, **gate)  # the scorer's defaults unless --tolerance/--alpha
        version, old_approved = 0, None
        rows: list[dict] = []
        judge_ms: list[float] = []

        def submit(state, evidence, metric, kind) -> None:
            nonlocal version, old_approved
            version += 1
            meta = {"version": version, "offsets": {"0": version}, "counters": {}, "pipeline": FRAUD.describe(),
                    "metrics": {"online": {"auc": metric, "window": METRIC_WINDOW}}, "written_at": time.time()}
            checkpoint.publish(run_dir, version, state, None, meta, evidence=evidence)
            started = time.perf_counter()
            store.poll_once()
            judge_ms.append(1e3 * (time.perf_counter() - started))
            decision = store.ledger.read(version)
            # The gate before issue 44, on the same candidate: its metric against the last approved one's.
            old_held = (old_approved is not None and metric is not None and old_approved - metric > OLD_TOLERANCE)
            if not old_held and metric is not None:
                old_approved = metric
            rows.append({"version": version, "kind": kind, "held": not decision.approved, "old_held": old_held,
                         "better_by": (decision.evidence or {}).get("better_by")})
            checkpoint.prune(run_dir, 30, hold={store.ledger.newest_approved() or 0})

        for interval in range(1, candidates + 1):
            batch = sim.events(events)
            features, targets = FRAUD.features(batch), FRAUD.targets(batch)
            before = {k: v.detach().clone() for k, v in good.model.state_dict().items()}
            good.learn(features, targets)
            shuffled.learn(features, targets)
            evidence = good.evidence.take()
            bad_evidence = shuffled.evidence.take()
            if interval % WORSE_EVERY == 0 and interval > 1:
                if (interval // WORSE_EVERY) % 2:
                    submit(_copy(shuffled.model), bad_evidence, shuffled.metric(), "shuffled")
                else:
                    broken, gap = noisy(before, rng, held_out)
                    true_gaps.append(gap)
                    kept = evidence["features"]
                    submit(broken, {**evidence, "scores": scored_by(broken, kept)},
                           summarize("classification", scored_by(broken, kept), evidence["targets"]).get("auc"),
                           "noisy")
            submit(_copy(good.model), evidence, good.metric(), "good")
        store.stop()
    return {**summarise_run(rows, judge_ms), "noisy_held_out_auc_gap_median": round(statistics.median(true_gaps), 4)}


def _copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def summarise_run(rows: list[dict], judge_ms: list[float]) -> dict:
    out: dict = {"judge_ms_median": round(statistics.median(judge_ms), 2)}
    for kind in ("good", "shuffled", "noisy"):
        mine = [r for r in rows[1:] if r["kind"] == kind]  # the first version has nothing to be judged against
        gaps = [r["better_by"] for r in mine if r["better_by"] is not None]
        out[kind] = {"candidates": len(mine), "held": sum(r["held"] for r in mine),
                     "held_by_old_gate": sum(r["old_held"] for r in mine),
                     "held_share": sum(r["held"] for r in mine) / max(len(mine), 1),
                     "old_held_share": sum(r["old_held"] for r in mine) / max(len(mine), 1),
                     "auc_gap_median": round(statistics.median(gaps), 4) if gaps else None}
    worse = [r for r in rows[1:] if r["kind"] != "good"]
    out["worse"] = {"candidates": len(worse), "held_share": sum(r["held"] for r in worse) / max(len(worse), 1),
                    "old_held_share": sum(r["old_held"] for r in worse) / max(len(worse), 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=150, help="checkpoint intervals a run (good candidates)")
    parser.add_argument("--events", type=int, default=4000, help="events between checkpoints")
    parser.add_argument("--tolerance", type=float, help="a contender's quality_tolerance (default: the scorer's)")
    parser.add_argument("--alpha", type=float, help="a contender's quality_alpha (default: the scorer's)")
    args = parser.parse_args()
    gate = {k: v for k, v in (("quality_tolerance", args.tolerance), ("quality_alpha", args.alpha)) if v is not None}
    started = time.time()
    runs = []
    for i in range(args.runs):
        runs.append(run(11 + i, args.candidates, args.events, **gate))
        print(f"run {i + 1}: {runs[-1]}", flush=True)
    figures = {
        "false_rejections": median([r["good"]["held_share"] for r in runs]),
        "true_rejections": median([r["worse"]["held_share"] for r in runs]),
        "old_gate_false_rejections": median([r["good"]["old_held_share"] for r in runs]),
        "old_gate_true_rejections": median([r["worse"]["old_held_share"] for r in runs]),
        "judge_ms": median([r["judge_ms_median"] for r in runs]),
    }
    print(figures)
    if gate:  # a contender for the defaults: printed, not recorded as the result
        return
    write_json("gate", {"args": vars(args), "figures": figures, "runs": runs, "seconds": round(time.time() - started)})
    write_section("gate", "Quality gate: the same events, a paired test", _body(args, runs, figures))


def _body(args, runs: list[dict], f: dict, machine: dict | None = None) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    def row(kind: str, label: str, target: str = "") -> str:
        held = statistics.median(r[kind]["held_share"] for r in runs)
        old = statistics.median(r[kind]["old_held_share"] for r in runs)
        gaps = [r[kind].get("auc_gap_median") for r in runs if r[kind].get("auc_gap_median") is not None]
        cells = [label, f"**{pct(held)}**{target}" if target else pct(held),
                 " / ".join(pct(r[kind]["held_share"]) for r in runs), pct(old),
                 " / ".join(pct(r[kind]["old_held_share"]) for r in runs),
                 f"{statistics.median(gaps):+.4f}" if gaps else ""]
        return "| " + " | ".join(cells) + " |"

    met = f["false_rejections"] <= 0.01 and f["true_rejections"] >= 0.95
    n = runs[0]
    gap = statistics.median(r["noisy_held_out_auc_gap_median"] for r in runs)
    table = "\n".join([
        f"| candidates (per run) | held, paired gate (median of {len(runs)}) | per run | held, old gate | per run "
        "| AUC gap on the same events (median) |",
        "|---|---|---|---|---|---|",
        row("good", f"good ({n['good']['candidates']})", " (target ≤ 1 %)"),
        row("shuffled", f"shuffled labels ({n['shuffled']['candidates']})"),
        row("noisy", f"noisy weights ({n['noisy']['candidates']})"),
        row("worse", "all worse", " (target ≥ 95 %)"),
    ])
    return f"""`python -m load.bench.gate --runs {args.runs} --candidates {args.candidates} --events {args.events}`: the
generator's stream without drift, learned predict-then-learn by the fraud pipeline's model; a
checkpoint every {args.events} events with the trainer's evidence; a real ModelStore with the scorer's
defaults judges each (tolerance 0.02, alpha 0.02, DeLong's paired test on the candidate's newest
4,096 events). Every {WORSE_EVERY}th interval a truly worse candidate comes first: a lineage learning
shuffled labels, or the good model with noisy weights at least {WORSE_BY} AUC worse on 20,000 held-out
events (median {gap:+.3f}), in turn. The gate before issue 44 (candidate's online AUC against the last
approved one's, each on its own window, tolerance {OLD_TOLERANCE}) judged the same candidates.

{table}

Targets {'met' if met else 'NOT met'}. A judgement (evidence read, served model scoring 4,096 events, the test)
took {f['judge_ms']:.1f} ms (median). {machine_line(machine)}
"""


if __name__ == "__main__":
    main()
