"""The demo's Ray as its user meets it. `ray job submit/list/logs` from a new shell with only
what the demo banner says to export: the instructions are needed (without them Ray's CLI is
refused) and sufficient (with them it submits, lists and reads logs). And the dashboard reads
the Prometheus the demo started, which scrapes this Ray.

The session cluster is started by the demo's own start (streamlearn.demo.start_ray), in this
process: ray.init sets RAY_AUTH_MODE=token in this process's environment, which is why
test_job_submit.py's `ray job submit` works without exporting anything. A user's new shell
has no such variable, so every command here starts from os.environ minus every RAY_* name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from streamlearn.demo import banner
from streamlearn.localray import client_auth
from streamlearn.monitor import PROMETHEUS_HOST_VAR, query

from .conftest import SESSION_SCRAPE_S

pytestmark = pytest.mark.integration

REFUSED = "Authentication required"


def test_ray_job_cli_works_with_exactly_what_the_banner_says_and_not_without(ray_cluster):
    dashboard = f"http://{ray_cluster.dashboard_url}"
    with urllib.request.urlopen(f"{dashboard}/api/authentication_mode", timeout=10) as r:
        assert json.load(r)["authentication_mode"] == "token"  # what the demo's head gets from Ray 2.60
    export, list_jobs = _instructions(dashboard)
    ray = list_jobs.split()[0]
    job_id = f"sl-cli-{uuid.uuid4().hex[:8]}"
    hello = f"{sys.executable} -c \"print('hello')\""  # tiny: this is about the CLI and auth, not training
    submit = f"{ray} job submit --address {dashboard} --submission-id {job_id} -- {hello}"
    logs = f"{ray} job logs --address {dashboard} {job_id}"

    for command in (submit, list_jobs, logs):
        refused = _shell(command)
        assert refused.returncode != 0 and REFUSED in refused.stdout + refused.stderr, _out(refused)

    done = _until_agent_is_up(lambda: _shell(f"{export}\n{submit}"))
    assert done.returncode == 0 and "hello" in done.stdout and "succeeded" in done.stdout, _out(done)
    listed = _shell(f"{export}\n{list_jobs}")
    assert listed.returncode == 0 and job_id in listed.stdout, _out(listed)
    read = _shell(f"{export}\n{logs}")
    assert read.returncode == 0 and "hello" in read.stdout, _out(read)


def test_the_dashboard_reads_the_prometheus_the_demo_started_which_scrapes_this_ray(ray_cluster):
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    prometheus = os.environ[PROMETHEUS_HOST_VAR]  # start_ray set it for the dashboard to inherit
    request = urllib.request.Request(f"http://{ray_cluster.dashboard_url}/api/prometheus_health",
                                     headers=get_auth_headers_if_auth_enabled({}))
    with urllib.request.urlopen(request, timeout=20) as r:
        assert json.load(r)["result"] is True
    # The targets file is re-read every 5 s, and a target first scraped within one interval.
    deadline = time.monotonic() + 30 + 2 * SESSION_SCRAPE_S
    while not [s for s in query(prometheus, 'up{job="ray"}') if s["value"][1] == "1"]:
        assert time.monotonic() < deadline, f"{prometheus} scrapes no Ray metrics endpoint"
        time.sleep(1)


def _instructions(dashboard: str) -> tuple[str, str]:
    """The banner's export line (its comment cut) and its `ray job list` command, as printed."""
    text = banner(dashboard, "http://127.0.0.1:1", "127.0.0.1:1", "raysubmit_x", Path("/ckpt"), client_auth(), None)
    lines = [line.strip() for line in text.splitlines()]
    export = [line.split("export ", 1)[1].split("   #")[0] for line in lines if "export " in line]
    listing = [line.split("   (")[0] for line in lines if " job list --address " in line]
    assert len(export) == 1 and len(listing) == 1, text
    return f"export {export[0]}", listing[0]


def _shell(script: str) -> subprocess.CompletedProcess:
    """A new shell: this process's environment without anything Ray put or read there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300)


def _until_agent_is_up(run, attempts: int = 30) -> subprocess.CompletedProcess:
    """A fresh head's job agent comes up a little after the dashboard answers."""
    for _ in range(attempts):
        done = run()
        if "No available agent" not in done.stdout + done.stderr:
            return done
        time.sleep(2)
    return done


def _out(done: subprocess.CompletedProcess) -> str:
    return f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
