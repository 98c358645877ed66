"""`serve run deploy/serve/fraud.yaml`, the Ray Serve CLI a user runs, end to end.

The shipped config file is copied with a free proxy port, a fresh checkpoint directory and an
application name and route of its own (never the shipped file edited), and `serve run` is
started as a subprocess. It serves a checkpoint written after it started, then SIGINT stops
it: it must exit cleanly, with Serve gone and the port closed.

Which Ray `serve run` joins: the session's cluster (`--address` = its GCS), not a Ray of its
own. Without --address it would join the newest cluster recorded on the machine (maybe
another suite's); with `--address local` it starts a second head, which on 2 cores took
39.7 s from start to a ready /healthz against 26.5 s on the session's cluster, and holds a
second GCS, raylet and dashboard beside the session's for nothing. Sharing is safe because of
how Serve and the other modules behave: Serve keeps its first proxy settings per cluster
(`serve run` only warns and keeps the old port), so this test needs Serve down when it
starts, and `serve run` shuts Serve down on the whole cluster at Ctrl-C, leaving it down for
the next module. Every module that deploys (test_serve, test_metrics, ...) shuts Serve down
when it ends, so whatever order the files run in each finds Serve down; the fixture checks
it, so a module that leaks a proxy is named rather than answering on another port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE  # pinned Ray 2.60

from streamlearn.config import REPO_ROOT
from streamlearn.kafka.broker import free_port
from tests.integration.test_serve import EVENT, expected_score, wait_for, write_checkpoint

pytestmark = pytest.mark.integration

SHIPPED = REPO_ROOT / "deploy" / "serve" / "fraud.yaml"
SERVE_CLI = Path(sys.executable).parent / "serve"
APP, ROUTE = "serve-run-fraud", "/serve-run"  # apart from test_serve's score-* applications on /


def serve_running() -> bool:
    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def config_copy(tmp_path: Path, port: int, checkpoint_dir: Path) -> Path:
    config = yaml.safe_load(SHIPPED.read_text())
    config["http_options"]["port"] = port
    (application,) = config["applications"]
    application.update(name=APP, route_prefix=ROUTE)
    application["args"].update(checkpoint_dir=str(checkpoint_dir), poll_interval_s=0.25)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def serve_run(ray_cluster, tmp_path):
    """`serve run` on the session's cluster; stopped by its process id whatever the test did."""
    # A module's serve.shutdown() returns before the controller's actor is gone from the GCS.
    assert wait_for(lambda: not serve_running(), timeout=30), \
        "Serve is still running on the session cluster: a test module left it up"
    port, checkpoint_dir = free_port(), tmp_path / "checkpoints"
    log = (tmp_path / "serve-run.log").open("wb")
    command = [str(SERVE_CLI), "run", str(config_copy(tmp_path, port, checkpoint_dir)),
               "--address", ray_cluster.address_info["gcs_address"]]
    started = time.monotonic()
    # This process's environment carries what joining needs: the cluster's auth token settings
    # (set by ray.init); Serve's ingress switches are the cluster's own.
    # Unbuffered, so its log keeps what it said before a kill; with the fault handler a SIGABRT
    # writes every thread's Python stack into the log (a hung exit then shows where it hangs).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True,  # our SIGINT reaches it alone, as Ctrl-C would
                               # as from a terminal: a suite run in the background ignores SIGINT (bash
                               # does for a job started with & where there is no job control)
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        yield process, port, checkpoint_dir / "fraud", started
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGABRT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(process.pid, signal.SIGKILL)  # its own session: only what it started
            process.wait()
        log.close()
        print((tmp_path / "serve-run.log").read_text(errors="replace")[-4000:])


def test_serve_run_config_file_serves_and_stops_on_ctrl_c(serve_run):
    process, port, run_dir, started = serve_run
    path = write_checkpoint(run_dir, 1, auc=0.80)
    base = f"http://127.0.0.1:{port}{ROUTE}"

    def ready():
        assert process.poll() is None, "serve run exited before serving"
        try:
            return httpx.get(f"{base}/healthz", timeout=2).json().get("ready")
        except (httpx.HTTPError, ValueError):
            return False

    assert wait_for(ready, timeout=180, interval=0.5), "the application never became ready"
    print(f"serve run: ready {time.monotonic() - started:.1f}s after start")

    scored = httpx.post(f"{base}/score", json=EVENT, timeout=10)
    assert scored.status_code == 200, scored.text
    body = scored.json()
    assert body["version"] == 1 and body["pipeline"] == "fraud"
    assert body["scores"][0] == pytest.approx(expected_score(path), abs=1e-6)
    model = httpx.get(f"{base}/model", timeout=10)
    assert model.status_code == 200 and model.json()["version"] == 1, model.text

    stopping = time.monotonic()
    process.send_signal(signal.SIGINT)
    # ~4 s with Serve's proxy actor; with the HAProxy ingress the replica outlived Serve's 30 s
    # shutdown tier before the controller moved on (31 s measured).
    assert process.wait(timeout=90) == 0, "serve run did not exit cleanly on Ctrl-C"
    print(f"serve run: exited {time.monotonic() - stopping:.1f}s after SIGINT")
    assert wait_for(lambda: not serve_running(), timeout=30), "Serve still runs on the cluster"
    assert wait_for(lambda: not port_open(port), timeout=30), f"port {port} still answers"


def test_streamlearn_serve_up_deploys_on_the_cluster_it_names_and_returns(ray_cluster, tmp_path):
    """`streamlearn serve up`, the operator's command (docs/OPERATIONS.md), as a subprocess: it
    joins the cluster --address names, deploys the scorer, prints its URL and exits; the scorer
    goes on serving the checkpoint directory it was given. It joins Ray before it imports the
    scorer (cli.serve_up), so this is the one test of that order on a cluster that answers."""
    from ray import serve

    assert wait_for(lambda: not serve_running(), timeout=30), \
        "Serve is still running on the session cluster: a test module left it up"
    port, checkpoint_dir = free_port(), tmp_path / "checkpoints"
    path = write_checkpoint(checkpoint_dir / "fraud", 1, auc=0.80)
    command = [sys.executable, "-m", "streamlearn.cli", "serve", "up", "--checkpoint-dir", str(checkpoint_dir),
               "--port", str(port), "--min-replicas", "1", "--max-replicas", "1",
               "--address", ray_cluster.address_info["gcs_address"]]
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        url = done.stdout.strip().splitlines()[-1]
        assert url == f"http://127.0.0.1:{port}", done.stdout[-1000:]
        scored = httpx.post(f"{url}/score", json=EVENT, timeout=10)
        assert scored.status_code == 200, scored.text
        assert scored.json()["version"] == 1
        assert scored.json()["scores"][0] == pytest.approx(expected_score(path), abs=1e-6)
    finally:
        serve.shutdown()  # Serve keeps its first proxy settings per cluster: the next module deploys its own
    assert wait_for(lambda: not serve_running(), timeout=30), "Serve still runs on the cluster"
