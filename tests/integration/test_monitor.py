"""`streamlearn monitor`: a real Prometheus following a service-discovery file, without Ray.

The discovery file here names a prometheus_client endpoint in this process, standing in for a
Ray node's metrics port; the Ray-backed path is tests/integration/test_metrics.py.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from streamlearn.errors import ConfigError
from streamlearn.kafka.broker import free_port
from streamlearn.monitor import Monitor, query

pytestmark = pytest.mark.integration


def _wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    return predicate()


def test_up_scrapes_discovered_targets_and_down_stops_it(tmp_path):
    registry = CollectorRegistry()
    events = Counter("streamlearn_probe_events", "probe", registry=registry)
    events.inc(7)
    # What a trainer's drift alarm sets (streamlearn.metrics.record_drift), as Ray exports it.
    drift = Gauge("ray_streamlearn_drift_last_alarm_timestamp_seconds", "probe", ["pipeline", "kind"],
                  registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        discovery = tmp_path / "sd.json"
        discovery.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": [f"127.0.0.1:{port}"]}]))
        monitor = Monitor(data_dir=tmp_path / "prom", port=0, discovery_file=discovery, scrape_interval_s=1)
        monitor.up()
        try:
            assert monitor.ready()
            status = monitor.status()
            assert status["running"] and status["ready"] and status["url"] == monitor.url
            assert Monitor(data_dir=tmp_path / "prom", port=0).up().url == monitor.url  # idempotent: same one
            found = _wait(lambda: query(monitor.url, "streamlearn_probe_events_total"), 30)
            assert found and float(found[0]["value"][1]) == 7.0
            events.inc(3)
            assert _wait(lambda: [r for r in query(monitor.url, "streamlearn_probe_events_total")
                                  if float(r["value"][1]) == 10.0], 20)
            # deploy/prometheus/alerts.yml is loaded, and its drift alert fires on a fresh alarm.
            firing = 'ALERTS{alertname="StreamlearnDrift", alertstate="firing", pipeline="probe", kind="positive"}'
            assert not query(monitor.url, firing)
            drift.labels(pipeline="probe", kind="positive").set(time.time())
            assert _wait(lambda: query(monitor.url, firing), 30), "StreamlearnDrift did not fire"
            pid = monitor.pid()
        finally:
            assert monitor.down()
        assert monitor.pid() is None and not monitor.ready(0.5)
        assert not Monitor(data_dir=tmp_path / "prom", port=0).down()  # already stopped
        with pytest.raises(OSError):  # gone, and reaped
            os.kill(pid, 0)
    finally:
        server.shutdown()
        thread.join(5)


def test_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no Ray service-discovery file"):
        Monitor(data_dir=tmp_path, port=0, discovery_file=tmp_path / "missing.json").up()
    discovery = tmp_path / "sd.json"
    discovery.write_text("[]")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="is taken"):
            Monitor(data_dir=tmp_path, port=taken.getsockname()[1], discovery_file=discovery).up()
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without Prometheus installed
    with pytest.raises(ConfigError, match="scripts/setup.sh"):
        Monitor(data_dir=tmp_path, port=0, discovery_file=discovery).up()
