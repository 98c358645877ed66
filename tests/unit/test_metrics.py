"""The metric catalogue, the Grafana dashboard that must match it, and recording without Ray."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from streamlearn import metrics
from streamlearn.config import REPO_ROOT
from streamlearn.serve.latency import ScoringStats

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "streamlearn.json"
EXPORTED = re.compile(r"\bray_streamlearn_[a-z0-9_]+")


def _panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


def test_catalogue_names_and_tags():
    required = {"events_ingested", "events_dead_lettered", "consumer_lag", "train_steps", "train_loss",
                "online_metric", "workers_active", "workers_desired", "checkpoint_age_seconds",
                "model_version_served", "model_swaps", "gate_rejections", "scoring_requests",
                "scoring_latency_seconds", "resize_pause_seconds"}
    assert {f"streamlearn_{n}" for n in required} <= set(metrics.CATALOGUE)
    for name, spec in metrics.CATALOGUE.items():
        assert re.fullmatch(r"streamlearn_[a-z0-9_]+", name)
        assert spec.tags[0] == "pipeline" and spec.description
        assert spec.kind in ("counter", "gauge", "histogram")
        assert (spec.kind == "histogram") == bool(spec.boundaries)
        assert not name.endswith("_total")  # the export adds it
    assert "reason" in metrics.CATALOGUE["streamlearn_events_dead_lettered"].tags
    assert "partition" in metrics.CATALOGUE["streamlearn_consumer_lag"].tags
    assert "status" in metrics.CATALOGUE["streamlearn_scoring_requests"].tags
    assert metrics.exported_names("streamlearn_model_swaps") == ("ray_streamlearn_model_swaps_total",)
    assert metrics.exported_names("streamlearn_train_loss") == ("ray_streamlearn_train_loss",)
    assert "ray_streamlearn_scoring_latency_seconds_bucket" in metrics.exported_names(
        "streamlearn_scoring_latency_seconds")


def test_dashboard_references_only_exported_metrics_and_covers_all():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = {series: name for name in metrics.CATALOGUE for series in metrics.exported_names(name)}
    referenced = {m for expr in _exprs(dashboard) for m in EXPORTED.findall(expr)}
    referenced.discard("ray_streamlearn_")  # the pipeline variable's name regex, not a metric
    unknown = referenced - set(exported)
    assert not unknown, f"dashboard queries metrics the code does not export: {sorted(unknown)}"
    covered = {exported[m] for m in referenced}
    missing = set(metrics.CATALOGUE) - covered
    assert not missing, f"catalogue metrics with no panel: {sorted(missing)}"


def test_dashboard_is_importable_grafana_json():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        assert all('pipeline=~"$pipeline"' in t["expr"] for t in panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24


def test_dashboard_queries_are_valid_promql(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/setup.sh installs Debian's prometheus package, which has it"
    exprs = [e.replace("$pipeline", ".*") for e in _exprs(json.loads(DASHBOARD.read_text()))]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"streamlearn:check_{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.json"  # YAML is a superset of JSON: promtool reads it
    path.write_text(json.dumps(rules))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(exprs)} rules found" in done.stdout


def test_recording_without_ray_is_a_noop():
    # In a fresh interpreter: in this one an integration session may have connected Ray already
    # (the suite must pass in any order), and this is about a process that never did.
    check = """
import ray
from streamlearn import metrics
assert not ray.is_initialized()
metrics.record_window("fraud", 10, {"out_of_range": 2}, 3)
metrics.record_checkpoint("fraud", 4, 0.1, {"auc": 0.9, "n": 100, "logloss": float("nan")}, 1.0)
metrics.record_scaling({"pipeline": "fraud", "lag_by_partition": {"0": 5}, "workers_active": 1})
metrics.record_resize("fraud", 3.0)
metrics.record_request("fraud", 200, 0.001)
metrics.record_swap("fraud", 4)
metrics.record_rejection("fraud", "quality")
assert metrics._objects == {} and not metrics._failed and not metrics._requests and metrics._keeper is None
assert not ray.is_initialized()  # recording never starts Ray
"""
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_dead_letter_reasons_become_codes():
    bad = [(None, "out_of_range: 'amount' is -3"), (None, "not_json: bad byte"), (None, "out_of_range: 'x'")]
    assert metrics.dead_by_reason(bad) == {"out_of_range": 2, "not_json": 1}
    assert metrics.dead_by_reason([]) == {}


def test_scoring_stats_summary():
    stats = ScoringStats(capacity=100)
    assert stats.summary()["p99_ms"] is None and stats.summary()["requests"] == 0
    for i in range(1, 101):
        stats.add(200, i / 1000)
    stats.add(422, 0.5)
    summary = stats.summary()
    assert summary["requests"] == 101 and summary["recent"] == 100  # the ring keeps the newest 100
    assert summary["errors"] == 1
    assert summary["p50_ms"] == pytest.approx(51.5, abs=1.0)
    assert 99.0 <= summary["p99_ms"] <= 500.0
    assert summary["rate"] > 0
