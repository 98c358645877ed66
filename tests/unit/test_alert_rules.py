"""deploy/prometheus/alerts.yml against series made up to show when each alert must fire and when
it must not, evaluated by Prometheus's own rule engine (`promtool test rules`, from the Debian
package scripts/setup.sh installs): seconds, where a live Prometheus would need the rules'
`for` and look-back windows in real time (tests/integration/test_monitor.py fires the drift
alert on a live one)."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from streamlearn import metrics
from streamlearn.config import REPO_ROOT

RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
# The series under the names Ray exports our metrics as: a renamed gauge breaks these tests.
SERVED = metrics.exported_names("streamlearn_served_metric")[0] + '{pipeline="fraud", metric="auc", WorkerId="w1"}'
LAST_ALARM = metrics.exported_names("streamlearn_drift_last_alarm_timestamp_seconds")[0]


def served_drop(summary_value: str) -> dict:
    return {"exp_labels": {"alertname": "StreamlearnServedQualityDrop", "severity": "warning", "pipeline": "fraud"},
            "exp_annotations": {"summary": "fraud: served AUC down", "description": (
                "The AUC of the answers pipeline fraud gave callers, judged by their labels, has stayed more "
                "than 0.05 below its best of the last 30 minutes for 2 minutes (" + summary_value + " below now). "
                "Which versions: `streamlearn status` (served quality per version) and "
                "`ray_streamlearn_served_version_metric`; a drift alarm before it says what moved. Training goes "
                "on; a version the scorer's gate refuses stays unserved.")}}


def drift(kind: str) -> dict:
    return {"exp_labels": {"alertname": "StreamlearnDrift", "severity": "warning", "pipeline": "fraud", "kind": kind},
            "exp_annotations": {"summary": f"fraud: {kind} drift", "description": (
                f"streamlearn's drift detectors raised a {kind} alarm for pipeline fraud in the last 15 minutes. "
                "Which signal: the trainer's `drift_detected` log lines, "
                "`ray_streamlearn_drift_alarms_total{signal=...}`, and the `drift` field of history.jsonl; what it "
                "did to quality: `streamlearn report`.")}}


def promtool_test(tmp_path, tests: list[dict]) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs Debian's prometheus package, which has it"
    spec = tmp_path / "rules_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": tests}))
    return subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)


def test_the_served_quality_alert_fires_on_a_lasting_drop_and_not_on_a_dip(tmp_path):
    result = promtool_test(tmp_path, [
        # 0.94 for 10 minutes, then 0.80 for good: pending at once, firing once it held 2 minutes.
        {"interval": "15s", "input_series": [{"series": SERVED, "values": "0.94x40 0.80x40"}],
         "alert_rule_test": [{"eval_time": "11m", "alertname": "StreamlearnServedQualityDrop", "exp_alerts": []},
                             {"eval_time": "13m", "alertname": "StreamlearnServedQualityDrop",
                              "exp_alerts": [served_drop("0.140")]}]},
        # A drift's dip: 0.94, 0.80 for 30 s, back to 0.93: never fires.
        {"interval": "15s", "input_series": [{"series": SERVED, "values": "0.94x40 0.80x2 0.93x40"}],
         "alert_rule_test": [{"eval_time": f"{m}m", "alertname": "StreamlearnServedQualityDrop", "exp_alerts": []}
                             for m in (11, 12, 14, 20)]},
        # A slow slide of 0.04 stays within the bound.
        {"interval": "15s", "input_series": [{"series": SERVED, "values": "0.94-0.0005x80"}],
         "alert_rule_test": [{"eval_time": "20m", "alertname": "StreamlearnServedQualityDrop", "exp_alerts": []}]},
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_drift_alert_fires_for_15_minutes_after_an_alarm(tmp_path):
    # The gauge is the Unix time of the newest alarm; promtool's clock starts at 0, so an alarm at
    # 60 s reads 60.
    series = LAST_ALARM + '{pipeline="fraud", kind="positive", WorkerId="w1"}'
    result = promtool_test(tmp_path, [
        {"interval": "1m", "input_series": [{"series": series, "values": "60x30"}],
         "alert_rule_test": [{"eval_time": "2m", "alertname": "StreamlearnDrift", "exp_alerts": [drift("positive")]},
                             {"eval_time": "15m", "alertname": "StreamlearnDrift",
                              "exp_alerts": [drift("positive")]},
                             {"eval_time": "17m", "alertname": "StreamlearnDrift", "exp_alerts": []}]},
    ])
    assert result.returncode == 0, result.stdout + result.stderr


BEHIND = metrics.exported_names("streamlearn_serving_versions_behind")[0] + '{pipeline="fraud", WorkerId="w1"}'
BEHIND_S = metrics.exported_names("streamlearn_serving_behind_seconds")[0] + '{pipeline="fraud", WorkerId="w1"}'
BOUND = metrics.exported_names("streamlearn_serving_behind_bound")[0]
FLOOR = metrics.exported_names("streamlearn_served_auc_floor")[0] + '{pipeline="fraud", WorkerId="w1"}'


def stale(value: str) -> dict:
    return {"exp_labels": {"alertname": "StreamlearnServingStale", "severity": "warning", "pipeline": "fraud"},
            "exp_annotations": {"summary": "fraud: serving a stale model", "description": (
                "Pipeline fraud's scorer has served a version more than its bound behind the newest checkpoint "
                f"for 2 minutes ({value} versions or seconds behind). Why: `streamlearn status` (Serving: behind) "
                "and GET /model's `behind.why`; a held candidate's reason is in `last_rejection`.")}}


def serving_series(versions: str, seconds: str) -> list[dict]:
    return [{"series": BEHIND, "values": versions}, {"series": BEHIND_S, "values": seconds},
            {"series": BOUND + '{pipeline="fraud", unit="versions", WorkerId="w1"}', "values": "10x60"},
            {"series": BOUND + '{pipeline="fraud", unit="seconds", WorkerId="w1"}', "values": "300x60"}]


def test_the_stale_serving_alert_fires_past_either_bound_for_two_minutes(tmp_path):
    result = promtool_test(tmp_path, [
        # 1-3 versions behind as a healthy gate keeps it: never.
        {"interval": "15s", "input_series": serving_series("1 2 3 1 2x56", "2 4 6 2 4x56"),
         "alert_rule_test": [{"eval_time": "14m", "alertname": "StreamlearnServingStale", "exp_alerts": []}]},
        # Candidates held from minute 1 on: 12 versions behind is past the bound of 10; fires after 2 min.
        {"interval": "15s", "input_series": serving_series("1x3 12x56", "2x3 30x56"),
         "alert_rule_test": [{"eval_time": "2m", "alertname": "StreamlearnServingStale", "exp_alerts": []},
                             {"eval_time": "4m", "alertname": "StreamlearnServingStale",
                              "exp_alerts": [stale("12")]}]},
        # A slow trainer: few versions behind, but the served one is 10 minutes older than the newest.
        {"interval": "15s", "input_series": serving_series("2x59", "600x59"),
         "alert_rule_test": [{"eval_time": "3m", "alertname": "StreamlearnServingStale",
                              "exp_alerts": [stale("600")]}]},
        # A 90-s hold (a truly worse candidate, then a good one): never.
        {"interval": "15s", "input_series": serving_series("1x4 12x6 1x49", "2x4 30x6 2x49"),
         "alert_rule_test": [{"eval_time": f"{m}m", "alertname": "StreamlearnServingStale", "exp_alerts": []}
                             for m in (2, 3, 5)]},
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_floor_alert_fires_when_callers_answers_stay_below_it(tmp_path):
    below = {"exp_labels": {"alertname": "StreamlearnServedQualityBelowFloor", "severity": "critical",
                            "pipeline": "fraud"},
             "exp_annotations": {"summary": "fraud: served AUC below the floor", "description": (
                 "The AUC of the answers pipeline fraud gave callers, judged by their labels, has stayed below the "
                 "scorer's served_auc_floor for 5 minutes (now 0.520). `streamlearn status` shows the served "
                 "version, how far it is behind the newest checkpoint and the gate's last decision; a pin "
                 "(`streamlearn serve pin`) serves an older version by hand.")}}
    result = promtool_test(tmp_path, [
        {"interval": "1m", "input_series": [{"series": SERVED, "values": "0.93x3 0.52x10"},
                                            {"series": FLOOR, "values": "0.7x13"}],
         "alert_rule_test": [{"eval_time": "6m", "alertname": "StreamlearnServedQualityBelowFloor",
                              "exp_alerts": []},
                             {"eval_time": "9m", "alertname": "StreamlearnServedQualityBelowFloor",
                              "exp_alerts": [below]}]},
        {"interval": "1m", "input_series": [{"series": SERVED, "values": "0.93x3 0.72x10"},
                                            {"series": FLOOR, "values": "0.7x13"}],
         "alert_rule_test": [{"eval_time": "12m", "alertname": "StreamlearnServedQualityBelowFloor",
                              "exp_alerts": []}]},
    ])
    assert result.returncode == 0, result.stdout + result.stderr
