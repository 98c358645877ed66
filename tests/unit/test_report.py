"""`streamlearn report` draws PNG charts from a recorded run directory, also mid-write."""

from __future__ import annotations

import json
import math

import pytest

from streamlearn.errors import StreamlearnError
from streamlearn.observe.report import CHARTS, _Axis, draw_served, drift_label, learned_rates, render_report
from streamlearn.runfiles import RunFiles

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = 1_795_000_000.0
SERVED_AUC = [0.9] * 15 + [0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.9, 0.9, 0.9, 0.9]


def write_jsonl(path, rows, truncated_tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + truncated_tail)


def recorded_run(run_dir, task: str = "classification", controller: bool = True) -> None:
    """Two minutes of a run: checkpoints every 5 s, a controller sample every 2 s, one resize 2→3."""
    run_dir.mkdir(parents=True)
    history, learned = [], 0
    for v in range(1, 25):
        learned += 5 * (1500 if v < 12 else 2100)
        online = ({"auc": 0.7 + 0.01 * v, "logloss": 0.2 - 0.004 * v, "n": 10000} if task == "classification"
                  else {"mae": 1.0 / v, "rmse": 1.5 / v, "n": 10000})
        history.append({"version": v, "t": T0 + 5 * v, "workers": 2 if v < 12 else 3, "learned": learned,
                        "dead_lettered": v * 10, "steps": v * 40, "train_loss": 0.3 / math.sqrt(v),
                        "phases_s": {"train": 1.0}, **online})
        if v == 15:  # a new fraud pattern: two alarms recorded by this checkpoint
            history[-1]["drift"] = [{"signal": "positive.merchant_category=cash", "before": 0.01, "after": 0.2,
                                     "events": 90_000}, {"signal": "positive.channel=atm", "before": 0.02,
                                                         "after": 0.3, "events": 90_000}]
    write_jsonl(run_dir / "history.jsonl", history, truncated_tail='{"version": 25, "t": 17950001')
    if task == "classification":  # the evaluator's rows: served AUC dips at the drift, then recovers
        write_jsonl(run_dir / "served.jsonl", [
            {"t": T0 + 5 * i, "overall": {"window": 5000, "auc": SERVED_AUC[i], "logloss": 0.1},
             "versions": {str(i - 1): {"auc": SERVED_AUC[i] - 0.01, "window": 400, "positive_rate": 0.1},
                          str(i): {"auc": 1.0, "window": 30, "positive_rate": 0.1}},  # 3 frauds: not drawn
             "joined": 430 * i}
            for i in range(2, 25)])
    if not controller:
        return
    scaling = [{"t": T0 + 2 * i, "lag": max(0, 40000 - 700 * i) if i > 30 else 500 * i,
                "input_rate": 1500 + 500 * math.sin(i / 10), "learned_rate": 1600.0,
                "workers_active": 2 if i < 29 else 3, "workers_desired": 2 if i < 25 else 3,
                "reason": "lag growing"} for i in range(60)]
    write_jsonl(run_dir / "scaling.jsonl", scaling, truncated_tail='{"t": 1795000121.0, "lag": 12')
    write_jsonl(run_dir / "resizes.jsonl", [{"t": T0 + 58, "from": 2, "to": 3, "reason": "lag growing",
                                             "pause_s": 6.2, "requested_at": T0 + 50}])


def assert_pngs(paths, out) -> None:
    names = {p.name for p in paths}
    assert names == {f"{name}.png" for name, _, _ in CHARTS} | {"overview.png"}
    for path in paths:
        assert path.parent == out
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 10_000, f"{path.name} is suspiciously small ({len(data)} bytes)"


def test_report_renders_every_chart_from_a_run_still_being_written(tmp_path):
    recorded_run(tmp_path / "fraud")
    run = RunFiles.load(tmp_path / "fraud")
    assert len(run.history) == 24 and len(run.scaling) == 60 and len(run.resizes) == 1  # torn lines skipped
    paths = render_report(tmp_path / "fraud", tmp_path / "out")
    assert_pngs(paths, tmp_path / "out")
    assert (tmp_path / "out" / "overview.png").stat().st_size > max(p.stat().st_size for p in paths[:-1])


def test_report_without_controller_files_and_for_regression(tmp_path):
    recorded_run(tmp_path / "amount", task="regression", controller=False)
    assert_pngs(render_report(tmp_path / "amount", tmp_path / "out"), tmp_path / "out")


def test_learned_rate_is_the_delta_between_checkpoints():
    rows = [{"t": 10.0, "learned": 0}, {"t": 15.0, "learned": 5000}, {"t": 25.0, "learned": 7000},
            {"t": 30.0, "learned": 100}]  # a new lineage in the same directory: no rate across it
    assert [rate for _, rate in learned_rates(rows)] == [1000.0, 200.0]


def test_report_on_an_empty_directory_says_what_is_missing(tmp_path):
    with pytest.raises(StreamlearnError, match="history.jsonl"):
        render_report(tmp_path, tmp_path / "out")


def test_report_command_prints_the_png_paths(tmp_path):
    import subprocess
    import sys

    recorded_run(tmp_path / "ckpt" / "fraud")
    command = [sys.executable, "-m", "streamlearn.cli", "report", "--checkpoint-dir", str(tmp_path / "ckpt"),
               "--pipeline", "fraud", "--out", str(tmp_path / "png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split()
    assert len(printed) == len(CHARTS) + 1 and all(p.endswith(".png") for p in printed)
    assert {p.rsplit("/", 1)[1] for p in printed} == {p.name for p in (tmp_path / "png").iterdir()}


def test_drift_alarms_are_named_on_the_charts():
    alarms = [{"signal": "positive.merchant_category=cash"}, {"signal": "positive.channel=atm"}]
    assert drift_label(alarms) == "positive.merchant_category=cash +1"
    assert drift_label(alarms[1:]) == "positive.channel=atm"


def test_served_quality_is_drawn_per_version_beside_the_trainers_own_figure(tmp_path):
    import matplotlib.pyplot as plt

    recorded_run(tmp_path / "fraud")
    run = RunFiles.load(tmp_path / "fraud")
    fig, ax = plt.subplots()
    draw_served(ax, run, _Axis(run))
    lines = {line.get_label(): line for line in ax.get_lines()}
    served = lines["served AUC (answers callers got, all versions)"]
    assert list(served.get_ydata()) == SERVED_AUC[2:]  # the dip at the drift and the recovery
    assert "trainer's online AUC (its own batches)" in lines
    points = ax.collections[0].get_offsets()
    assert len(points) == 23 and max(points[:, 1]) < 0.9  # one point per row: the version with 40 frauds
    plt.close(fig)
    fig, ax = plt.subplots()
    recorded_run(tmp_path / "amount", task="regression")
    draw_served(ax, RunFiles.load(tmp_path / "amount"), _Axis(RunFiles.load(tmp_path / "amount")))
    assert "streamlearn evaluate" in ax.texts[0].get_text()  # no evaluator ran: says how to get one
    plt.close(fig)


def test_delayed_feedbacks_matured_auc_is_drawn_beside_the_online_one_with_its_age(tmp_path):
    from matplotlib.figure import Figure

    from streamlearn.observe.report import draw_metric

    recorded_run(tmp_path / "fraud")
    run = RunFiles.load(tmp_path / "fraud")
    for i, row in enumerate(run.history):  # reports only at first, then matured negatives 120 days old
        row["matured"] = {"window": 900, "positives": 40, "auc": 0.8 + 0.001 * i,
                          "age_s": 120 * 86_400.0 if i >= 10 else None}
    ax = Figure().subplots()
    draw_metric(ax, run, _Axis(run))
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["AUC (against fake negatives: not matured)", "AUC on matured labels (negatives 120 days old)"]
