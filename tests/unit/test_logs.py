"""Structured logs: one JSON object per line with the bound context, quiet below the chosen level."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
from streamlearn.logs import bind, log
bind(pipeline="fraud", rank=1, version=7)
log("checkpoint", learned=100)
bind(version=8)
log("detail", level="debug", n=1)
log("slow_broker", level="warning", password="hunter2", sasl_plain_password="x")
bind(rank=None)
log("worker_stopped")
"""


def run(level: str | None) -> tuple[list[dict], str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMLEARN_LOG_LEVEL"}
    if level is not None:
        env["STREAMLEARN_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stderr.splitlines()], done.stdout


def test_every_line_carries_the_bound_context_and_debug_is_quiet_by_default():
    lines, stdout = run(None)
    assert stdout == ""  # logs never mix into a command's stdout (its JSON summary)
    assert [line["event"] for line in lines] == ["checkpoint", "slow_broker", "worker_stopped"]
    first, warning, last = lines
    assert (first["pipeline"], first["rank"], first["version"], first["learned"]) == ("fraud", 1, 7, 100)
    assert (warning["version"], warning["level"]) == (8, "warning")
    assert "rank" not in last and last["version"] == 8


def test_secret_fields_are_masked():
    lines, _ = run(None)
    text = json.dumps(lines)
    assert "hunter2" not in text and '"x"' not in text


def test_level_from_the_environment_and_a_bad_value_explained():
    assert [line["event"] for line in run("debug")[0]] == ["checkpoint", "detail", "slow_broker", "worker_stopped"]
    assert [line["event"] for line in run("warning")[0]] == ["slow_broker"]
    lines, _ = run("loud")
    assert lines[0]["event"] == "bad_log_level" and "STREAMLEARN_LOG_LEVEL" in lines[0]["fix"]
    assert [line["event"] for line in lines[1:]] == ["checkpoint", "slow_broker", "worker_stopped"]
