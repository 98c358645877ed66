"""The bigger machine's prepared benchmark (load/bench/gpu.py) in its CPU-only form, so that a
session lent a 16-core GPU machine runs a script that already worked: its own broker and Ray, the
aimed kill audited for exactly-once, the contenders round after round, and the JSON it writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamlearn.config import REPO_ROOT

# A benchmark script, not a guarantee: `make test-all` runs it, `make test` does not.
pytestmark = [pytest.mark.integration, pytest.mark.extended, pytest.mark.timeout(600)]


def test_the_gpu_machine_script_runs_here_without_a_gpu(tmp_path):
    out, docs = tmp_path / "out", REPO_ROOT / "docs" / "bench" / "gpu.json"
    before = docs.read_bytes()
    done = subprocess.run([sys.executable, "-m", "load.bench.gpu", "--cpu-only", "--workers", "1,2", "--events",
                           "20000", "--runs", "1", "--out", str(out)], capture_output=True, text=True, timeout=540,
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads((out / "gpu.json").read_text())
    assert set(figures["runs"]) == {"baseline-cpu", "gloo-1", "gloo-2"}
    assert all(len(runs) == 1 and runs[0]["steady_events_per_s"] > 0 for runs in figures["runs"].values())
    assert figures["ratio_gloo_2_vs_gloo_1"] > 0 and figures["ratio_nccl_1_vs_gloo_1"] is None
    killed = figures["killed"]
    assert killed["fault_fired"] and not killed["use_gpu"] and killed["audit"]["passed"], killed
    assert docs.read_bytes() == before, "--out must leave docs/bench/gpu.json as it is"
