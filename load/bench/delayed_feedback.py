"""Learning from fraud reports that come weeks late: how well each way of learning them ranks and
calibrates, against an oracle that knows every label at once, in the same run.

    python -m load.bench.delayed_feedback [--runs 3] [--days 40] [--median-delay-days 5]

The stream is the generator's (streamlearn/loadgen/generator.py), whose clock is already compressed: an event
every 4 s of event time, so a simulated day is 21,600 events. Its fraud pattern changes halfway
(`drift_at`), so a method that learns frauds late also learns the new pattern late. Each fraud's
report comes after a heavy-tailed delay: log-normal with the given median and sigma 1.0 (p90 3.6x
the median, p99 10x), capped at the card schemes' 120 days; a legitimate payment is never reported.
Reports due after the stream's end are not learned.

Contenders, each the fraud pipeline's model, optimizer and loss, in steps of 256 rows in time order:

- `oracle`: every event learned at arrival with its true label (what the issue's bar compares with);
- `bound`: every legitimate payment learned at arrival as legitimate and every fraud only when its
  report comes, as fraud: more than a bank can know (no bank knows at once which payments are
  legitimate), so no method that learns a fraud from its report can do better by information.
  The gap between `oracle` and `bound` is what waiting for reports costs whatever the method;
- `window`: today's join with `unlabelled_as=0` (pipelines/fraud_chargebacks.py): an event waits
  for its report for the TTL that the join's memory allows, `max_pending` = 1M events at a bank's
  1,000 events/s, 1,000 s, and is learned then as fraud if its report came, else as legitimate;
  a later report is dead-lettered;
- `fnw`: every event learned at arrival as legitimate, again as fraud when its report comes, each
  row's loss weighted by fake-negative weighting (streamlearn/train/feedback.py);
- `fnw-held`: `fnw` as the trainer runs it by default, each report held back from learning for the
  pipeline's `hold_s` of event time (its `hold_events` come later at this stream's rate), while the
  quality gate judges candidates on it (ingest/feedback.py);
- `fnc`: the same rows as `fnw`, plain loss, the scores converted by fake-negative calibration.

Quality is measured prequentially: each event is scored by the model as it was when the event
arrived, before anything after it is learned, and judged by its matured label: the true one, since
every report comes within the 120-day attribution window. AUC and log loss over the whole stream
and per simulated week, and calibration (mean predicted fraud probability over the true fraud rate).
No broker and no Ray: this measures what is learned, not how fast events move.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from load.bench.common import BENCH_DIR, DOCS, median, write_json, write_section
from streamlearn.loadgen.generator import MS_PER_EVENT, BankingSimulator
from streamlearn.pipeline import load_pipeline
from streamlearn.prequential import roc_auc
from streamlearn.train.feedback import fake_negative_calibrated, fake_negative_weights

FRAUD = load_pipeline("fraud")
BATCH = 256
DAY_MS = 86_400_000
EVENTS_PER_DAY = DAY_MS // MS_PER_EVENT
ATTRIBUTION_DAYS = 120.0
BANK_EVENTS_PER_S, JOIN_CAP = 1_000.0, 1_000_000  # the window that memory allows: 1,000 s
WINDOW_MS = JOIN_CAP / BANK_EVENTS_PER_S * 1000
CONTENDERS = ("oracle", "bound", "window", "fnw", "fnw-held", "fnc")
HOLD_MS = load_pipeline("fraud_chargebacks").labels.hold_s * 1000  # fnw-held: the trainer's default hold
TARGETS = {"auc_gap": 0.02, "calibration": (0.8, 1.25)}
IMG_DIR = DOCS / "img"


@dataclass(frozen=True)
class Stream:
    features: np.ndarray  # (n, n_features), float32
    fraud: np.ndarray  # (n,) true labels, float32
    times: np.ndarray  # (n,) event time, ms
    reported: np.ndarray  # (n,) when the report comes, ms; inf for a legitimate payment


def make_stream(seed: int, days: float, median_delay_days: float) -> Stream:
    n = int(days * EVENTS_PER_DAY)
    events = BankingSimulator(seed, drift_at=n // 2).events(n)
    fraud = FRAUD.targets(events)
    times = np.array([e["event_time"] for e in events], dtype=np.float64)
    rng = np.random.default_rng([seed, 45])
    delays = np.minimum(rng.lognormal(np.log(median_delay_days), 1.0, n), ATTRIBUTION_DAYS) * DAY_MS
    reported = np.where(fraud > 0.5, times + delays, np.inf)
    return Stream(FRAUD.features(events), fraud, times, reported)


def learning_rows(stream: Stream, contender: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(when each row is learned, which event, its target), in time order."""
    n, end = len(stream.times), stream.times[-1]
    index = np.arange(n)
    if contender == "oracle":
        return stream.times, index, stream.fraud
    if contender == "bound":
        when = np.where(stream.fraud > 0.5, stream.reported, stream.times)
        due = when <= end  # a report due after the stream's end is not learned, as for fnw
        rows = (when[due], index[due], stream.fraud[due])
        order = np.argsort(rows[0], kind="stable")
        return tuple(r[order] for r in rows)
    if contender == "window":
        in_window = stream.reported <= stream.times + WINDOW_MS
        # Learned when its report comes within the window, else when the window ends.
        when = np.where(in_window, stream.reported, stream.times + WINDOW_MS)
        rows = (when, index, in_window.astype(np.float32))
    else:  # fnw, fnc: at once as legitimate, again as fraud when the report comes (fnw-held: a hold later)
        reported = stream.reported + (HOLD_MS if contender == "fnw-held" else 0)
        late = np.flatnonzero(reported <= end)
        rows = (np.concatenate([stream.times, reported[late]]), np.concatenate([index, late]),
                np.concatenate([np.zeros(n, np.float32), np.ones(len(late), np.float32)]))
    order = np.argsort(rows[0], kind="stable")
    return tuple(r[order] for r in rows)


def run_one(stream: Stream, contender: str, seed: int) -> dict:
    """Predict each block of arrivals, then learn the rows due before the next block arrives."""
    torch.manual_seed(seed)
    model = FRAUD.build_model()
    optimizer = FRAUD.make_optimizer(model.parameters())
    when, which, target = learning_rows(stream, contender)
    x_all = torch.from_numpy(stream.features)
    predicted = np.empty(len(stream.times), dtype=np.float64)
    learned, row, started = 0, 0, time.perf_counter()
    for first in range(0, len(stream.times), BATCH):
        block = slice(first, first + BATCH)
        with torch.inference_mode():
            scores = FRAUD.score(model(x_all[block]))
            predicted[block] = (fake_negative_calibrated(scores) if contender == "fnc" else scores).numpy()
        until = stream.times[min(first + BATCH, len(stream.times) - 1)]
        due = int(np.searchsorted(when, until, side="left"))
        while row < due:
            rows = slice(row, min(row + BATCH, due))
            x, y = x_all[which[rows]], torch.from_numpy(target[rows])
            output = model(x)
            loss = FRAUD.loss(output, y)
            if contender.startswith("fnw"):
                loss = loss * fake_negative_weights(torch.sigmoid(output), y)
            optimizer.zero_grad(set_to_none=True)
            loss.mean().backward()
            optimizer.step()
            learned += rows.stop - rows.start
            row = rows.stop
    seconds = time.perf_counter() - started
    return {"contender": contender, "rows_learned": learned, "seconds": seconds,
            **quality(predicted, stream)}


def quality(predicted: np.ndarray, stream: Stream) -> dict:
    y = stream.fraud
    p = np.clip(predicted, 1e-7, 1 - 1e-7)
    week = ((stream.times - stream.times[0]) // (7 * DAY_MS)).astype(int)
    weekly = [roc_auc(predicted[week == w], y[week == w]) for w in range(week.max() + 1)]
    return {"auc": roc_auc(predicted, y), "logloss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
            "calibration": float(predicted.mean() / y.mean()), "auc_by_week": weekly,
            "auc_second_half": roc_auc(predicted[len(y) // 2:], y[len(y) // 2:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--days", type=float, default=40.0, help="simulated days of events (21,600 a day)")
    parser.add_argument("--median-delay-days", type=float, default=5.0)
    parser.add_argument("--draw", action="store_true", help="only redraw docs/img/delayed-feedback.png from the JSON")
    args = parser.parse_args()
    if args.draw:
        draw(json.loads((BENCH_DIR / "delayed_feedback.json").read_text()))
        return
    torch.set_num_threads(1)  # as each training worker: one core of the two
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    for seed in range(args.runs):
        stream = make_stream(seed, args.days, args.median_delay_days)
        for contender in CONTENDERS:
            result = run_one(stream, contender, seed)
            runs[contender].append(result)
            print(f"seed {seed} {contender:7s} auc {result['auc']:.4f} logloss {result['logloss']:.4f} "
                  f"calibration {result['calibration']:.2f} ({result['seconds']:.1f} s)", flush=True)
    figures = summarize(runs, args)
    write_json("delayed_feedback", figures)
    draw(figures)
    write_section("delayed_feedback", "Delayed feedback: fraud reports weeks late", render(figures))


def draw(figures: dict) -> Path:
    """docs/img/delayed-feedback.png: each method's AUC per simulated week (median of the runs), the
    README's picture of what waiting for reports costs and what FNW wins back."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    path = IMG_DIR / "delayed-feedback.png"
    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=110)
    names = {"oracle": "oracle (every label at once)", "bound": "bound (legitimate at once, fraud at its report)",
             "fnw": "delayed feedback, FNW (the trainer's)",
             "fnc": "delayed feedback, FNC", "window": "window (the join's memory: 1,000 s)"}
    for contender, label in names.items():
        weekly = np.median(np.array([r["auc_by_week"] for r in figures["per_run"][contender]]), axis=0)
        ax.plot(np.arange(1, len(weekly) + 1), weekly, marker="o", label=label)
    weeks = figures["days"] / 7
    ax.axvline(weeks / 2 + 0.5, color="grey", linestyle=":", linewidth=1)
    ax.text(weeks / 2 + 0.55, 0.72, "fraud pattern\nchanges", color="grey", fontsize=8)
    ax.set(xlabel="simulated week", ylabel="prequential AUC (matured labels)", ylim=(0.4, 1.0),
           title=f"Reports a median {figures['median_delay_days']:g} days late ({figures['delay']})")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summarize(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    med = {c: {k: median([r[k] for r in rs]) for k in ("auc", "logloss", "calibration", "auc_second_half")}
           for c, rs in runs.items()}
    oracle, bound = med["oracle"]["auc"], med["bound"]["auc"]
    return {"days": args.days, "events": int(args.days * EVENTS_PER_DAY), "median_delay_days": args.median_delay_days,
            "delay": "log-normal, sigma 1.0, capped at 120 days", "window_s": WINDOW_MS / 1000, "runs": args.runs,
            "medians": med, "auc_gap_to_oracle": {c: med[c]["auc"] - oracle for c in CONTENDERS},
            "auc_gap_to_bound": {c: med[c]["auc"] - bound for c in CONTENDERS},
            # Whether any method that learns a fraud from its report could meet the bar on this stream.
            "bar_reachable": oracle - bound <= TARGETS["auc_gap"],
            "targets": {"auc_within_of_oracle": TARGETS["auc_gap"], "calibration": TARGETS["calibration"]},
            "met": {c: (oracle - med[c]["auc"] <= TARGETS["auc_gap"]
                        and TARGETS["calibration"][0] <= med[c]["calibration"] <= TARGETS["calibration"][1])
                    for c in ("fnw", "fnw-held", "fnc")},
            "per_run": runs}


def render(figures: dict) -> str:
    """The section's prose; its table comes from the JSON (load/bench/tables.py)."""
    return (f"`python -m load.bench.delayed_feedback --runs {figures['runs']} --days {figures['days']:g} "
            f"--median-delay-days {figures['median_delay_days']:g}`: {figures['events']:,} generated events "
            f"({figures['days']:g} simulated days, the fraud pattern changing halfway), each fraud reported "
            f"after a {figures['delay']} delay of median {figures['median_delay_days']:g} days; the window "
            f"method waits {figures['window_s']:,.0f} s (the join's 1M-event cap at 1k events/s). Each event "
            "is scored by the model as it stood when the event arrived and judged by its matured label. "
            "The method only, no broker and no Ray; the trainer learns by FNW the same way "
            "(streamlearn/ingest/feedback.py, train/learner.py). Per week: docs/img/delayed-feedback.png. "
            "No method that waits for reports can see a new fraud pattern before its reports come: `bound` "
            "is told every legitimate payment at once and learns each fraud at its report, more than a bank "
            "knows, and its gap to the oracle is what waiting for reports costs on this stream whatever the "
            f"method ({figures['auc_gap_to_bound']['oracle']:+.4f} AUC; the bar of "
            f"{figures['targets']['auc_within_of_oracle']:g} is "
            f"{'within' if figures['bar_reachable'] else 'beyond'} reach of any such method here).")


if __name__ == "__main__":
    main()
