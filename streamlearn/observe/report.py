"""`streamlearn report`: PNG charts of a run over time, from the files in its run directory.

Reads history.jsonl (one row per checkpoint), scaling.jsonl and resizes.jsonl (written by the
scale controller, when one ran) and served.jsonl (the evaluator's, when one ran). Works on a
finished run and on one still appending: a partly written last line is skipped. One PNG per
chart plus overview.png with all of them stacked. Checkpoint versions are thin dotted vertical
lines; resizes are dashed red ones; drift alarms dash-dot orange ones, at the checkpoint that
recorded them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers, and no GUI toolkit to import

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from streamlearn.errors import StreamlearnError  # noqa: E402
from streamlearn.runfiles import RunFiles  # noqa: E402

VERSION_STYLE = dict(color="0.6", linestyle=":", linewidth=0.8, zorder=0)
RESIZE_STYLE = dict(color="tab:red", linestyle="--", linewidth=1.2, zorder=1)
DRIFT_STYLE = dict(color="tab:orange", linestyle="-.", linewidth=1.2, zorder=1)
MAX_VERSION_LABELS = 25
MIN_POSITIVES = 5  # per class, for a served version's AUC point


class _Axis:
    """Seconds since the run's first record, shown in minutes once the run is long."""

    def __init__(self, run: RunFiles):
        self.start = run.start
        ends = [rows[-1]["t"] for rows in run.tables if rows]
        self.span = max(ends) - self.start
        self.scale, self.label = (60.0, "minutes since start") if self.span > 900 else (1.0, "seconds since start")

    def __call__(self, rows: list[dict]) -> list[float]:
        return [(r["t"] - self.start) / self.scale for r in rows]


def render_report(run_dir: str | Path, out_dir: str | Path, dpi: int = 110) -> list[Path]:
    """Writes one PNG per chart and overview.png into out_dir; returns their paths."""
    run = RunFiles.load(run_dir)
    if run.empty:
        raise StreamlearnError(f"nothing to chart in {run.run_dir}: no history.jsonl/scaling.jsonl rows yet "
                               "(is this a run directory? it is <checkpoint_dir>/<run_name>; the first row "
                               "appears at the first checkpoint)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    axis = _Axis(run)
    paths = []
    for name, title, draw in CHARTS:
        fig, ax = plt.subplots(figsize=(10, 3.6), layout="constrained")
        _panel(ax, run, axis, title, draw, label_versions=True)
        ax.set_xlabel(axis.label)
        fig.suptitle(_caption(run), fontsize=9, color="0.35")
        paths.append(_save(fig, out / f"{name}.png", dpi))
    fig, axes = plt.subplots(len(CHARTS), 1, figsize=(11, 2.5 * len(CHARTS)), sharex=True, layout="constrained")
    for i, (ax, (_name, title, draw)) in enumerate(zip(axes, CHARTS, strict=True)):
        _panel(ax, run, axis, title, draw, label_versions=i == 0)
    axes[-1].set_xlabel(axis.label)
    fig.suptitle(_caption(run), fontsize=10)
    paths.append(_save(fig, out / "overview.png", dpi))
    return paths


def _save(fig, path: Path, dpi: int) -> Path:
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _caption(run: RunFiles) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run.start))
    versions = [r["version"] for r in run.history if "version" in r]
    span = f"checkpoints v{versions[0]}–v{versions[-1]}" if versions else "no checkpoint yet"
    resizes = f"{len(run.resizes)} resize{'' if len(run.resizes) == 1 else 's'}"
    return (f"{run.run_dir.name}: started {started}, {span}, {resizes}   "
            "(dotted lines: checkpoint versions; dashed red: resizes; dash-dot orange: drift alarms)")


def _panel(ax: Axes, run: RunFiles, axis: _Axis, title: str, draw: Callable, label_versions: bool) -> None:
    ax.set_title(title, loc="left", fontsize=10, pad=12 if label_versions else 6)
    ax.grid(True, axis="y", alpha=0.3)
    _markers(ax, run, axis, label_versions)
    draw(ax, run, axis)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8, framealpha=0.8)


def _markers(ax: Axes, run: RunFiles, axis: _Axis, label_versions: bool) -> None:
    versioned = [r for r in run.history if "version" in r]
    for x in axis(versioned):
        ax.axvline(x, **VERSION_STYLE)
    if label_versions and versioned:
        gap, last = axis.span / axis.scale / MAX_VERSION_LABELS, None  # thin the labels, never the lines
        for x, row in zip(axis(versioned), versioned, strict=True):
            if last is None or x - last >= gap:
                ax.annotate(f"v{row['version']}", (x, 1.0), xycoords=("data", "axes fraction"), fontsize=6,
                            color="0.45", ha="center", va="bottom")
                last = x
    for x, row in zip(axis(run.resizes), run.resizes, strict=True):
        ax.axvline(x, **RESIZE_STYLE)
        ax.annotate(f"{row.get('from', '?')}→{row.get('to', '?')}", (x, 0.02), xycoords=("data", "axes fraction"),
                    fontsize=7, color="tab:red", ha="left", va="bottom", rotation=90)
    drifted, last = [r for r in run.history if r.get("drift")], None  # at the checkpoint after the alarms
    for x, row in zip(axis(drifted), drifted, strict=True):
        ax.axvline(x, **DRIFT_STYLE)
        if label_versions and (last is None or x - last >= axis.span / axis.scale / 8):  # a burst: named once
            ax.annotate(drift_label(row["drift"]), (x, 0.98), xycoords=("data", "axes fraction"), fontsize=7,
                        color="tab:orange", ha="right", va="top", rotation=90)
            last = x


def drift_label(alarms: list[dict]) -> str:
    """A checkpoint's drift alarms in a few words: the first signal, and how many more."""
    first = alarms[0].get("signal", "?")
    return first if len(alarms) == 1 else f"{first} +{len(alarms) - 1}"


def _none(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.4")


def _rows_with(rows: list[dict], *keys: str) -> list[dict]:
    return [r for r in rows if all(isinstance(r.get(k), int | float) for k in keys)]


def learned_rates(history: list[dict]) -> list[tuple[dict, float]]:
    """Events/s learned between consecutive checkpoints, attached to the later one."""
    rows = _rows_with(history, "learned")
    out = []
    for before, after in zip(rows, rows[1:], strict=False):
        dt, dn = after["t"] - before["t"], after["learned"] - before["learned"]
        if dt > 0 and dn >= 0:  # a smaller total means a new lineage in the same directory: no rate across it
            out.append((after, dn / dt))
    return out


def draw_throughput(ax: Axes, run: RunFiles, axis: _Axis) -> None:
    rates = learned_rates(run.history)
    scaled = _rows_with(run.scaling, "input_rate")
    if scaled:
        ax.plot(axis(scaled), [r["input_rate"] for r in scaled], color="tab:gray", linewidth=1.2,
                label="arriving (controller)")
    if rates:
        ax.step(axis([r for r, _ in rates]), [v for _, v in rates], where="pre", color="tab:blue",
                linewidth=1.6, label="learned (between checkpoints)")
    if not (rates or scaled):
        _none(ax, "needs two checkpoints")
    ax.set_ylabel("events/s")
    ax.set_ylim(bottom=0)


def draw_lag(ax: Axes, run: RunFiles, axis: _Axis) -> None:
    rows = _rows_with(run.scaling, "lag")
    if not rows:
        _none(ax, "no scaling.jsonl: consumer lag is sampled by the scale controller")
        return
    ax.fill_between(axis(rows), [r["lag"] for r in rows], step="post", alpha=0.3, color="tab:orange")
    ax.step(axis(rows), [r["lag"] for r in rows], where="post", color="tab:orange", label="consumer lag")
    ax.set_ylabel("events")
    ax.set_ylim(bottom=0)


def draw_workers(ax: Axes, run: RunFiles, axis: _Axis) -> None:
    rows = _rows_with(run.scaling, "workers_active")
    if rows:
        ax.step(axis(rows), [r["workers_active"] for r in rows], where="post", color="tab:green", linewidth=1.8,
                label="active")
        wanted = _rows_with(rows, "workers_desired")
        ax.step(axis(wanted), [r["workers_desired"] for r in wanted], where="post", color="tab:purple",
                linestyle="--", linewidth=1.2, label="desired")
    else:
        rows = _rows_with(run.history, "workers")
        if not rows:
            _none(ax, "no worker counts recorded yet")
            return
        ax.step(axis(rows), [r["workers"] for r in rows], where="post", color="tab:green", linewidth=1.8,
                label="active (at checkpoints)")
    ax.set_ylabel("workers")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    low, high = ax.get_ylim()
    ax.set_ylim(0, max(high, 1) + 0.5)


def draw_metric(ax: Axes, run: RunFiles, axis: _Axis) -> None:
    """AUC and logloss (classification, two scales) or MAE and RMSE (regression, one scale)."""
    if _rows_with(run.history, "auc") or _rows_with(run.history, "logloss"):
        auc, logloss = _rows_with(run.history, "auc"), _rows_with(run.history, "logloss")
        # Delayed feedback: the online figure counts unreported frauds as legitimate; the matured one
        # is what the gate and the drift detectors judge on (ingest/maturing.py), and says how old.
        matured = [r for r in run.history if isinstance((r.get("matured") or {}).get("auc"), float)]
        ax.plot(axis(auc), [r["auc"] for r in auc], marker="o", markersize=3, color="tab:blue",
                label="AUC (against fake negatives: not matured)" if "matured" in run.history[-1] else "AUC")
        if matured:
            age = matured[-1]["matured"].get("age_s")
            ax.plot(axis(matured), [r["matured"]["auc"] for r in matured], marker="^", markersize=3,
                    color="tab:purple", label="AUC on matured labels" + (
                        f" (negatives {age / 86_400:.0f} days old)" if isinstance(age, float) else " (reports only)"))
            ax.legend(loc="lower left", fontsize=8, framealpha=0.8)
        ax.set_ylabel("AUC (online)")
        if logloss:
            right = ax.twinx()
            right.plot(axis(logloss), [r["logloss"] for r in logloss], marker="s", markersize=3,
                       color="tab:red", alpha=0.8, label="logloss")
            right.set_ylabel("logloss", color="tab:red")
            right.tick_params(axis="y", colors="tab:red")
            right.legend(loc="upper right", fontsize=8, framealpha=0.8)
        return
    drew = False
    for key, color in (("mae", "tab:blue"), ("rmse", "tab:red")):
        rows = _rows_with(run.history, key)
        if rows:
            ax.plot(axis(rows), [r[key] for r in rows], marker="o", markersize=3, color=color, label=key.upper())
            drew = True
    if drew:
        ax.set_ylabel("error (online)")
    else:
        _none(ax, "no online metric yet (written at each checkpoint)")


def draw_served(ax: Axes, run: RunFiles, axis: _Axis) -> None:
    """The headline metric of the answers callers got (the evaluator's window of every version, and
    each of the newest versions), beside the trainer's own online figure."""
    key = "auc" if any(isinstance((r.get("overall") or {}).get("auc"), float) for r in run.served) else "mae"
    rows = [r for r in run.served if isinstance((r.get("overall") or {}).get(key), float)]
    if not rows:
        _none(ax, "no served quality yet: deploy the scorer with --scores-topic and run `streamlearn evaluate`")
        return
    ax.plot(axis(rows), [r["overall"][key] for r in rows], color="tab:green", linewidth=1.8,
            label=f"served {key.upper()} (answers callers got, all versions)")
    points = [(r, s[key]) for r in rows for s in (r.get("versions") or {}).values()
              if isinstance(s.get(key), float) and _judged(s)]
    if points:
        ax.scatter(axis([r for r, _ in points]), [v for _, v in points], s=6, color="tab:green", alpha=0.35,
                   label="per served version (newest few)")
    online = _rows_with(run.history, key)
    if online:
        ax.plot(axis(online), [r[key] for r in online], color="0.5", linewidth=1.0, alpha=0.8,
                label=f"trainer's online {key.upper()} (its own batches)")
    ax.set_ylabel(f"{key.upper()} (served)")


def _judged(summary: dict) -> bool:
    """Enough answers to draw a version's point: an AUC from a handful of frauds is noise (0 or 1)."""
    positives = summary.get("window", 0) * summary.get("positive_rate", 1.0)
    return positives >= MIN_POSITIVES and summary.get("window", 0) - positives >= MIN_POSITIVES


def draw_loss(ax: Axes, run: RunFiles, axis: _Axis) -> None:
    rows = _rows_with(run.history, "train_loss")
    if not rows:
        _none(ax, "no train loss yet (written at each checkpoint)")
        return
    ax.plot(axis(rows), [r["train_loss"] for r in rows], marker="o", markersize=3, color="tab:brown",
            label="train loss (mean per event since the last checkpoint)")
    ax.set_ylabel("loss")


CHARTS: list[tuple[str, str, Callable]] = [
    ("throughput", "Events per second", draw_throughput),
    ("lag", "Consumer lag (committed, all partitions)", draw_lag),
    ("workers", "Training workers", draw_workers),
    ("metric", "Online metric (predict-then-learn, sliding window)", draw_metric),
    ("served", "Served quality (answers joined with their labels)", draw_served),
    ("loss", "Train loss", draw_loss),
]
