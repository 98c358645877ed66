"""A local autoscaling Ray cluster: `streamlearn cluster up|down|status`.

`ray start --head` with Ray's fake multi-node provider (deploy/local/autoscaler.yaml): the real
Ray autoscaler launches and terminates worker "nodes" (raylets on this machine) as demand
rises and falls, so autoscaling runs end to end without a cloud. The head has no CPUs, so all
training lands on autoscaled nodes, as it does on KubeRay.

Every process of the cluster, head and autoscaled nodes alike, lives under one temp dir of
its own (/tmp/sl-ray-<port>), which is how `down` finds them: by that path in their command
line, never by a process name another cluster could share.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from streamlearn.config import cache_dir, repo_file
from streamlearn.errors import ConfigError, StreamlearnError
from streamlearn.kafka.broker import free_ports

# How often the autoscaler looks at demand (Ray's default: 5 s). A resize waits for its room
# from the policy's decision on, and a look every 5 s was 0-5 s of the 9-14 s that wait took in
# test_autoscale; every second costs the monitor 0.8 % of a core instead of 0.2 % (measured, an
# idle cluster, 60 s each).
AUTOSCALER_UPDATE_S = "1"


class ClusterError(StreamlearnError):
    """The local cluster did not start or stop as asked."""


@dataclass(frozen=True)
class ClusterSpec:
    port: int = 0  # GCS port; 0 picks a free one
    max_nodes: int = 3  # autoscaled worker nodes at most
    min_nodes: int = 0
    node_cpus: int = 1  # whole CPUs (Ray requires it of a node); one training worker each at 1 CPU
    idle_timeout_s: float = 15.0  # an idle node is removed after this long
    object_store_mb: int = 128

    def __post_init__(self):
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise ConfigError(f"need 0 <= min_nodes <= max_nodes, got {self.min_nodes} and {self.max_nodes}")
        if self.node_cpus < 1 or self.idle_timeout_s <= 0:
            raise ConfigError(f"node_cpus must be a whole number >= 1 and idle_timeout_s > 0, "
                              f"got {self.node_cpus} and {self.idle_timeout_s}")


@dataclass(frozen=True)
class LocalCluster:
    address: str  # GCS address, what RAY_ADDRESS takes
    dashboard_url: str
    temp_dir: str

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def to_json(self) -> dict:
        return {"address": self.address, "dashboard_url": self.dashboard_url, "temp_dir": self.temp_dir}


def _state_file(port: int) -> Path:
    return cache_dir() / "clusters" / f"{port}.json"


def _token_file(port: int) -> Path:
    return cache_dir() / "clusters" / f"{port}.token"


def client_env(port: int) -> dict[str, str]:
    """What a driver, `ray job submit` or `streamlearn train` needs in its environment to join."""
    return {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(_token_file(port))}


def _temp_dir(port: int) -> str:
    # Short on purpose: Ray puts unix sockets under it, and socket paths must stay < 108 bytes.
    return f"/tmp/sl-ray-{port}"


def render_config(spec: ClusterSpec, gcs_address: str) -> dict:
    config = yaml.safe_load(repo_file("deploy/local/autoscaler.yaml").read_text())
    config["provider"]["gcs_address"] = gcs_address
    config["max_workers"] = spec.max_nodes
    config["idle_timeout_minutes"] = spec.idle_timeout_s / 60
    node = config["available_node_types"]["worker.cpu"]
    node["resources"] = {"CPU": spec.node_cpus, "object_store_memory": spec.object_store_mb * 1024 * 1024}
    node["min_workers"], node["max_workers"] = spec.min_nodes, spec.max_nodes
    return config


def up(spec: ClusterSpec) -> LocalCluster:
    """Start the head (its autoscaler starts worker nodes on demand); return where it is."""
    # One draw for the head's five listeners: separate draws can repeat a port (ray start refused one).
    ports = [p for p in free_ports(5) if p != spec.port]
    port = spec.port or ports.pop()
    if _state_file(port).exists() and _alive(_temp_dir(port)):
        return LocalCluster(**json.loads(_state_file(port).read_text()))
    address, (dashboard_port, agent_port, client_port, metrics_port) = f"127.0.0.1:{port}", ports[:4]
    config_path = cache_dir() / "clusters" / f"{port}-autoscaler.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(render_config(spec, address)))
    # The `ray` next to this interpreter: the same Ray version as the drivers that will connect.
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}",
               "--node-ip-address=127.0.0.1", "--num-cpus=0",
               f"--autoscaling-config={config_path}", f"--temp-dir={_temp_dir(port)}",
               "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
               f"--dashboard-agent-listen-port={agent_port}", f"--ray-client-server-port={client_port}",
               f"--metrics-export-port={metrics_port}", f"--object-store-memory={spec.object_store_mb * 1024 * 1024}",
               "--disable-usage-stats"]
    token = _token_file(port)
    if not token.exists():
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    # Token auth on: Ray's servers listen beyond loopback, and only holders of the token get in.
    from streamlearn.serve.ingress import with_ingress  # here: the serve package imports torch

    # Serve's HAProxy ingress on loopback too (streamlearn/serve/ingress.py): Ray's processes read it at start.
    env = with_ingress({"AUTOSCALER_UPDATE_INTERVAL_S": AUTOSCALER_UPDATE_S, **os.environ, **client_env(port),
                        "RAY_FAKE_CLUSTER": "1"}, _temp_dir(port))  # the environment's interval wins
    for attempt in range(3):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        if done.returncode == 0:
            break
        down(port)
        # Ray gives a raylet a fixed 30 s to register; a machine busy for longer fails the start
        # without anything being wrong, and a second try usually finds it quieter.
        if "timed out during startup" not in done.stderr or attempt == 2:
            raise ClusterError(f"ray start failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    cluster = LocalCluster(address, f"http://127.0.0.1:{dashboard_port}", _temp_dir(port))
    _state_file(port).write_text(json.dumps(cluster.to_json()))
    return cluster


def down(port: int, grace_s: float = 10.0) -> int:
    """Stop every process of the cluster on `port` (head and nodes); return how many there were."""
    procs = _processes(_temp_dir(port))
    for p in procs:
        _signal(p, signal.SIGTERM)
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    _state_file(port).unlink(missing_ok=True)
    _token_file(port).unlink(missing_ok=True)
    return len(procs)


def status(port: int) -> dict:
    state = _state_file(port)
    if not state.exists() or not _alive(_temp_dir(port)):
        raise ClusterError(f"no local cluster on port {port}; start one with `streamlearn cluster up`")
    return json.loads(state.read_text())


def cluster_processes(port: int) -> list[psutil.Process]:
    """Every process of the local cluster on `port`: head, autoscaler, nodes, workers."""
    return _processes(_temp_dir(port))


def _processes(temp_dir: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(temp_dir in arg for arg in (p.info["cmdline"] or [])) and p.pid != os.getpid():
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _alive(temp_dir: str) -> bool:
    return bool(_processes(temp_dir))


def _signal(process: psutil.Process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
