"""`make demo` as a new user runs it, beside the suite's own Kafka and Ray: it serves a model
version, the request its banner says to try is scored by that version, the answers its caller got
are judged against their labels (served.jsonl), and Ctrl-C stops it.
(test_demo_ray.py checks what the banner says about reaching Ray.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ray._private.utils import read_ray_address, write_ray_address  # pinned Ray 2.60

from streamlearn.config import REPO_ROOT
from streamlearn.monitor import PROMETHEUS_HOST_VAR

pytestmark = pytest.mark.integration

SERVED_WITHIN_S = 360  # Kafka, Prometheus, Ray, the training job and Serve all start on 2 busy cores
JUDGED_WITHIN_S = 80  # after the serving deadline: the caller's first answers meet their labels
STOPPED_WITHIN_S = 150  # all three inside pytest's 600 s per test
LAST_EXITS_S = 10.0  # after make returns, for the demo's processes to finish exiting


def _as_a_new_shell(environ: dict[str, str]) -> dict[str, str]:
    """This process's environment without what the suite's own cluster put there (its Ray, its
    Serve ingress, its Prometheus): a user's shell has none of it."""
    ours = ("RAY_", "STREAMLEARN_HAPROXY")
    return {k: v for k, v in environ.items() if not k.startswith(ours) and k != PROMETHEUS_HOST_VAR}


def test_make_demo_serves_a_version_and_scores_the_banners_request():
    home = Path(tempfile.mkdtemp(prefix="sl-demo-", dir="/tmp"))
    # The demo's head records itself as the machine's current Ray, as `ray start` does; the
    # suite's later job submissions find their cluster through that record, so put it back.
    suite_ray = read_ray_address()
    demo = subprocess.Popen(["make", "-s", "demo", "DURATION=900", f"DEMO_HOME={home}"], cwd=REPO_ROOT,
                            env=_as_a_new_shell(dict(os.environ)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            # as from a terminal: a suite run in the background ignores SIGINT, and
                            # the demo would inherit that and never see the Ctrl-C below
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + SERVED_WITHIN_S
    try:
        url, sample = _banner(lines, demo, deadline)
        version = _served_version(url, demo, deadline)
        request = urllib.request.Request(f"{url}/score", data=sample.encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            body = json.loads(r.read())
        assert len(body["scores"]) == 1 and 0.0 <= body["scores"][0] <= 1.0
        assert body["version"] >= version and body["pipeline"] == "fraud"
        # the demo's caller scores live events and its evaluator judges those answers by their labels
        served = _served_row(home / "checkpoints" / "fraud" / "served.jsonl", demo, deadline + JUDGED_WITHIN_S)
        assert served["joined"] > 0 and served["overall"]["window"] > 0 and served["versions"], served
        assert 0.0 <= served["overall"]["auc"] <= 1.0, served

        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C, as the banner says
        demo.wait(timeout=STOPPED_WITHIN_S)
        reader.join(timeout=10)
        assert any("stopping everything the demo started" in line for line in lines), "".join(lines[-40:])
        left = _still_running(demo.pid, home, grace_s=LAST_EXITS_S)
        assert not left, f"the demo left processes running after Ctrl-C: {left}"
    finally:
        for pid in _started_by(demo.pid, home):  # a failed run must not leave its load to the tests after it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        demo.wait(timeout=30)
        if suite_ray:
            write_ray_address(suite_ray)
        shutil.rmtree(home, ignore_errors=True)


def _still_running(session: int, home: Path, grace_s: float) -> list[str]:
    """What `_started_by` finds once `grace_s` has passed without it finding nothing, each as
    "pid command": `make` returns at the Ctrl-C while the processes it was waiting on may still be
    exiting (one fresh-clone run, 2026-12-01, found some at once; which ones was not recorded)."""
    deadline = time.monotonic() + grace_s
    while (found := _started_by(session, home)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"{pid} {_command(pid)}" for pid in found]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "(gone)"


def _started_by(session: int, home: Path) -> list[int]:
    """Processes of the demo's session (make, the demo, Ray's processes), and those it started in
    sessions of their own (its Kafka and Prometheus run with their data under `home`)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        if fields[0] != "Z" and (int(fields[3]) == session or str(home).encode() in cmdline):
            found.append(int(proc.name))
    return found


def _banner(lines: list[str], demo: subprocess.Popen, deadline: float) -> tuple[str, str]:
    """The scoring URL and the sample event of the banner's `Try:` line."""
    while time.monotonic() < deadline:
        text = "".join(lines)
        found = re.search(r"Try:\s+curl -s -X POST (\S+)/score .* -d '(\{.*\})'", text)
        if found:
            return found.group(1), found.group(2)
        assert demo.poll() is None, f"the demo ended (exit {demo.returncode}) before its banner:\n{text[-4000:]}"
        time.sleep(0.25)
    raise AssertionError(f"no banner within {SERVED_WITHIN_S} s:\n{''.join(lines)[-4000:]}")


def _served_version(url: str, demo: subprocess.Popen, deadline: float) -> int:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as r:
                version = json.loads(r.read()).get("version")
            if version is not None:
                return version
        except (urllib.error.URLError, OSError):
            pass  # Serve's proxy comes up a little after the banner
        assert demo.poll() is None, f"the demo ended (exit {demo.returncode}) before serving a version"
        time.sleep(0.5)
    raise AssertionError(f"the demo served no model version within {SERVED_WITHIN_S} s")


def _served_row(path: Path, demo: subprocess.Popen, deadline: float) -> dict:
    """The evaluator's newest row once its window of judged answers holds both classes (the first
    answers judged may all be legitimate: their AUC is then undefined, None)."""
    from streamlearn.runfiles import read_last_jsonl

    while time.monotonic() < deadline and demo.poll() is None:
        row = read_last_jsonl(path)
        if row and isinstance((row.get("overall") or {}).get("auc"), float):
            return row
        time.sleep(0.5)
    raise AssertionError(f"no served-quality row with an AUC (answers of both classes judged) in {path}: "
                         f"{read_last_jsonl(path)}")
