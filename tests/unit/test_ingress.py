"""Serve's HAProxy ingress settings, and the wrapper that keeps HAProxy's side ports on loopback."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from streamlearn.errors import ConfigError
from streamlearn.serve.ingress import LOOPBACK_WRAPPER, ingress_env, state_dir, with_ingress

# What Ray 2.60's template writes (stats and exporter on every interface) and what Serve's host gives.
RAY_CONFIG = """frontend prometheus
    bind :9101
    mode http
frontend http_frontend
    bind 127.0.0.1:8000
listen stats
  bind *:8404
"""


def test_wrapper_moves_every_wildcard_bind_to_loopback_then_runs_haproxy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(RAY_CONFIG)
    done = subprocess.run([str(LOOPBACK_WRAPPER), "-db", "-f", str(config), "-sf", "123"], capture_output=True,
                          text=True, env={"STREAMLEARN_HAPROXY_BINARY": "/bin/echo", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-db", "-f", str(config), "-sf", "123"]  # the real binary, same arguments
    binds = [line.split()[1] for line in config.read_text().splitlines() if line.strip().startswith("bind")]
    assert binds == ["127.0.0.1:9101", "127.0.0.1:8000", "127.0.0.1:8404"]


def test_environment_has_own_files_and_ports_and_the_user_wins():
    short = state_dir()
    env = ingress_env(short)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(LOOPBACK_WRAPPER)
    assert env["RAY_SERVE_HAPROXY_RETRY_ON"].split() == ["conn-failure", "empty-response"]  # never a 503: ours
    assert env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"].startswith(str(short))
    assert int(env["RAY_SERVE_HAPROXY_STATS_PORT"]) not in (8404, 9101)
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in ingress_env(short, loopback=False)  # a cluster: Ray's binds
    merged = with_ingress({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "HOME": "/h"}, short)
    assert merged["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0" and merged["HOME"] == "/h"
    opted_out = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert with_ingress(opted_out, short) == opted_out
    shutil.rmtree(short)


def test_a_state_directory_too_long_for_haproxys_sockets_is_refused_with_the_fix(tmp_path):
    # Ray adds a 56-character node id below it; HAProxy then refused to start, and Serve with it.
    with pytest.raises(ConfigError, match="too long for its sockets.*state_dir"):
        ingress_env(tmp_path / ("d" * 40))
