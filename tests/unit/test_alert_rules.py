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
