"""`ray job submit --working-dir . -- streamlearn train ...` runs the same trainer on a running cluster."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines.banking import TRANSACTION
from streamlearn.config import REPO_ROOT
from streamlearn.errors import BadEvent
from streamlearn.loadgen.generator import run_load

from .streams import read_topic

pytestmark = pytest.mark.integration


def test_regression_pipeline_submitted_as_a_ray_job_learns_every_event(kafka, kafka_settings, ray_cluster, topic,
                                                                       tmp_path):
    """Also the data-agnostic proof: the regression pipeline runs through the same trainer."""
    run_load(kafka.bootstrap, topic, partitions=4, count=6_000, bad_fraction=0.01, seed=4)
    address = f"http://{ray_cluster.dashboard_url}"
    entrypoint = [sys.executable, "-m", "streamlearn.cli", "train", "--pipeline", "amount",
                  "--bootstrap", kafka.bootstrap, "--topic", topic,
                  "--workers", "2", "--batch-size", "32", "--checkpoint-dir", str(tmp_path / "ckpt"),
                  "--until-idle", "3"]
    # No export needed here: ray.init put RAY_AUTH_MODE=token in this process's environment, which
    # the CLI inherits; a user's new shell does not (test_demo_ray.py checks what it needs).
    ray_cli = str(Path(sys.executable).parent / "ray")
    for _ in range(30):  # a fresh cluster's job agent comes up a little after the dashboard
        done = subprocess.run([ray_cli, "job", "submit", "--address", address,
                               "--working-dir", str(REPO_ROOT), "--", *entrypoint],
                              capture_output=True, text=True, timeout=400)
        if "No available agent" not in done.stderr + done.stdout:
            break
        time.sleep(2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith('{"events_learned"')][-1])
    assert summary["events_learned"] == 5_940 and summary["dead_lettered"] == 60
    # Online MAE (log amount) beats the best constant guess: the model learned the spend pattern.
    targets = np.log1p([TRANSACTION.decode(m.value)["amount"] for m in read_topic(kafka_settings, topic)
                        if _valid(m.value)])
    constant_mae = float(np.abs(targets - np.median(targets)).mean())
    assert summary["online"]["mae"] < 0.8 * constant_mae, (summary["online"], constant_mae)


def _valid(value: bytes) -> bool:
    try:
        TRANSACTION.decode(value)
        return True
    except BadEvent:
        return False
