"""`ray job submit --working-dir . -- streamlearn train ...` runs the same trainer on a running cluster."""

import json
import subprocess
import sys
from pathlib import Path

from load.generator import run_load
from streamlearn.config import REPO_ROOT


def test_training_submitted_as_a_ray_job_learns_every_event(kafka, ray_cluster, topic, tmp_path):
    run_load(kafka.bootstrap, topic, partitions=4, count=3_000, bad_fraction=0.01, seed=4)
    address = f"http://{ray_cluster.dashboard_url}"
    entrypoint = [sys.executable, "-m", "streamlearn.cli", "train", "--bootstrap", kafka.bootstrap, "--topic", topic,
                  "--workers", "2", "--checkpoint-dir", str(tmp_path / "ckpt"), "--until-idle", "3"]
    ray_cli = str(Path(sys.executable).parent / "ray")
    done = subprocess.run([ray_cli, "job", "submit", "--address", address,
                           "--working-dir", str(REPO_ROOT), "--", *entrypoint],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith('{"events_learned"')][-1])
    assert summary["events_learned"] == 2_970 and summary["dead_lettered"] == 30
