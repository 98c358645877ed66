"""Issue 47: no streamlearn command waits on a Ray address that does not answer. `make demo` used to
leave its cluster recorded in Ray's current-cluster file; `ray.init()` then retried the dead address
for over 11 minutes. Here the record and RAY_ADDRESS point at a port where nothing listens, in a Ray
temp dir of the test's own (RAY_TMPDIR), so no real cluster on the machine is touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from streamlearn.localray import answers

DEAD = "127.0.0.1:1"


@pytest.fixture
def ray_tmp():
    path = Path(tempfile.mkdtemp(prefix="slr", dir="/tmp"))  # short: Ray's socket paths live below it
    (path / "ray").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def streamlearn(args: list[str], ray_tmp: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(ray_tmp), **env}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamlearn.cli", *args], capture_output=True, text=True,
                          timeout=120, env=environ)
    return done, time.monotonic() - started


def test_serve_up_on_a_stale_record_says_so_at_once(ray_tmp):
    (ray_tmp / "ray" / "ray_current_cluster").write_text(DEAD)
    done, took = streamlearn(["serve", "up"], ray_tmp)
    assert done.returncode == 2, done.stderr
    assert f"names {DEAD}, where none answers" in done.stderr and "ray_current_cluster" in done.stderr
    assert "streamlearn cluster up" in done.stderr and took < 60


def test_serve_up_with_no_cluster_at_all_says_how_to_start_one(ray_tmp):
    done, _took = streamlearn(["serve", "up"], ray_tmp)
    assert done.returncode == 2, done.stderr
    assert "RAY_ADDRESS is unset and no cluster is recorded" in done.stderr and "Traceback" not in done.stderr


def test_a_dead_ray_address_is_named_with_where_it_came_from(ray_tmp):
    done, took = streamlearn(["serve", "up"], ray_tmp, RAY_ADDRESS=DEAD)
    assert done.returncode == 2, done.stderr
    assert f"no Ray cluster answers at {DEAD} (RAY_ADDRESS)" in done.stderr and took < 60
    done, _took = streamlearn(["serve", "up", "--address", DEAD], ray_tmp)
    assert f"no Ray cluster answers at {DEAD} (--address)" in done.stderr
    done, _took = streamlearn(["drain", "--address", DEAD], ray_tmp)
    assert done.returncode == 2 and f"no Ray cluster answers at {DEAD} (--address)" in done.stderr, done.stderr


def test_answers_tells_a_listening_port_from_a_dead_one():
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert answers(f"127.0.0.1:{listening.getsockname()[1]}")
        assert answers(f"ray://127.0.0.1:{listening.getsockname()[1]}")
    assert not answers(DEAD) and not answers("no-port")


# In a process of its own: this one may have joined the suite's Ray already (a run of tests/integration
# before tests/unit), and then every command here would find that connection and ask it instead.
STATUS_AND_MONITOR = """
import json
import ray
from streamlearn import monitor
from streamlearn.errors import ConfigError
from streamlearn.observe.status import Sources
figures, problem = Sources(address="auto", run_name="r", serve_url="http://127.0.0.1:1").controller()
try:
    monitor.cluster_discovery_file("auto")
    refused = None
except ConfigError as e:
    refused = str(e)
print(json.dumps({"figures": figures, "problem": problem, "refused": refused, "joined": ray.is_initialized()}))
"""


def test_status_and_monitor_read_the_record_where_ray_does(ray_tmp):
    """`streamlearn status` and `streamlearn monitor` join Ray as every command does (join_ray):
    RAY_TMPDIR's record, not /tmp/ray's (they read /tmp/ray's, so with RAY_TMPDIR set they probed
    another cluster's address, or none); a dead one is refused in seconds, named."""
    import json

    (ray_tmp / "ray" / "ray_current_cluster").write_text(DEAD)
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(ray_tmp)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STATUS_AND_MONITOR], capture_output=True, text=True, timeout=120,
                          env=environ)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["figures"] is None and DEAD in seen["problem"]
    assert seen["refused"] and DEAD in seen["refused"]
    assert time.monotonic() - started < 30 and not seen["joined"]
