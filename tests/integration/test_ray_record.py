"""Issue 47: after `make demo` stops, the next `streamlearn train` runs. The demo records its head in
Ray's current-cluster file (as `ray start` does) and now removes the record as it stops (as `ray
stop` does); a record a killed demo left behind makes `streamlearn train` start a local head rather
than wait on the dead address. Both in a Ray temp dir of the test's own (RAY_TMPDIR)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from streamlearn.loadgen.generator import run_load

pytestmark = pytest.mark.integration

DEMO_LIKE = """
import ray
from streamlearn.localray import forget_recorded, recorded_cluster, start_local_ray
ctx = start_local_ray(num_cpus=1, object_store_memory=80 * 1024 * 1024, include_dashboard=False,
                      configure_logging=False)
address = ctx.address_info["gcs_address"]
assert recorded_cluster()[0] == address, recorded_cluster()
ray.shutdown()
forget_recorded(address)
print("record:", recorded_cluster()[0], "was:", address)
"""


@pytest.fixture
def ray_tmp():
    path = Path(tempfile.mkdtemp(prefix="slr", dir="/tmp"))  # short: Ray's socket paths live below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_demo_s_record_goes_with_it_and_a_stale_one_does_not_stop_train(kafka, topic, ray_tmp, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(ray_tmp)}
    demo = subprocess.run([sys.executable, "-c", DEMO_LIKE], capture_output=True, text=True, timeout=180, env=env)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert demo.stdout.startswith("record: None was: "), demo.stdout  # recorded while up, gone after

    # A demo killed with SIGKILL cannot remove its record: the address it names is dead now.
    (ray_tmp / "ray" / "ray_current_cluster").write_text(demo.stdout.split("was: ")[1].strip())
    run_load(kafka.bootstrap, topic, partitions=4, count=3000, seed=3)
    started = time.monotonic()
    train = subprocess.run([sys.executable, "-m", "streamlearn.cli", "train", "--bootstrap", kafka.bootstrap,
                            "--topic", topic, "--workers", "1", "--until-idle", "3", "--checkpoint-dir",
                            str(tmp_path / "ckpt"), "--run-name", f"stale-{topic}"],
                           capture_output=True, text=True, timeout=400, env=env)
    assert train.returncode == 0, train.stderr[-3000:]
    assert '"ray_record_stale"' in train.stderr and "starting a local Ray head" in train.stderr
    summary = json.loads(train.stdout[train.stdout.index("{"):])
    assert summary["events_learned"] + summary["dead_lettered"] == 3000, summary
    print(f"train with a stale record: {time.monotonic() - started:.0f} s")
