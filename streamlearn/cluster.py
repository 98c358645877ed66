"""A local Ray head on loopback, every port chosen free, stopped by its own process group.

`ray.init()` picks fixed default ports for the dashboard agent (52365) and friends, so two
clusters on one machine (a demo beside a test run) break each other's job submission.
`ray start --head --block` with explicit free ports does not, and killing the process
group of that one `ray start` stops exactly the cluster it started (never `ray stop`,
which stops every Ray on the machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from streamlearn.errors import StreamlearnError
from streamlearn.kafka.broker import free_port


class RayStartError(StreamlearnError):
    """The local Ray head did not come up."""


@dataclass
class LocalRay:
    num_cpus: float = 4  # logical CPUs: fractional actors share the real cores (docs/DECISIONS.md)
    object_store_mb: int = 300
    dashboard_port: int = 0
    log_file: Path | None = None
    # Ray 2.60 turns on token auth for clusters it starts; every client here then needs the
    # token file. The cluster listens on this machine only, so tests and the demo opt out.
    env: dict[str, str] = field(default_factory=lambda: {"RAY_AUTH_MODE": "disabled"})
    gcs_port: int = 0
    _proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout_s: float = 120.0) -> LocalRay:
        self.gcs_port = self.gcs_port or free_port()
        self.dashboard_port = self.dashboard_port or free_port()
        ports = {"--port": self.gcs_port, "--dashboard-port": self.dashboard_port}
        for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                     "--metrics-export-port", "--ray-client-server-port", "--node-manager-port",
                     "--object-manager-port"):
            ports[flag] = free_port()
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--disable-usage-stats",
               "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1", "--include-dashboard", "true",
               f"--num-cpus={self.num_cpus}", f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
               *[f"{flag}={port}" for flag, port in ports.items()]]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RayStartError(f"`ray start` exited with {self._proc.returncode}"
                                    + (f"; see {self.log_file}" if self.log_file else ""))
            if self._dashboard_up():
                return self
            time.sleep(0.5)
        self.stop()
        raise RayStartError(f"Ray head did not answer on {self.dashboard_url} within {timeout_s:.0f}s")

    def _dashboard_up(self) -> bool:
        try:
            # "/" answers without the auth token Ray 2.60 puts in front of its API routes.
            with urllib.request.urlopen(f"{self.dashboard_url}/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the `ray start --block` group (it stops its processes), SIGKILL what is left."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        try:
            os.killpg(pgid, signal.SIGKILL)  # raylet's workers can outlive a clean stop
        except ProcessLookupError:
            pass
        self._proc = None
