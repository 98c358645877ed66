"""What the demo banner and `streamlearn status` tell a user about reaching Ray (token auth, the
`ray job` CLI, Prometheus), drawn without Ray; tests/integration/test_ray_job_cli.py runs it."""

from __future__ import annotations

from pathlib import Path

from streamlearn.demo import _start_prometheus, banner
from streamlearn.localray import client_auth
from streamlearn.observe.status import render_text

DASHBOARD = "http://127.0.0.1:8265"


def _banner(auth, prometheus="http://127.0.0.1:9191") -> str:
    return banner(DASHBOARD, "http://127.0.0.1:8000", "127.0.0.1:9092", "raysubmit_x", Path("/ckpt"), auth,
                  prometheus)


def test_a_new_local_head_wants_the_mode_exported_and_the_token_is_rays_default_file():
    auth = client_auth({"RAY_AUTH_MODE": "token"})  # what ray.init leaves when the mode was unset
    assert auth.env == {"RAY_AUTH_MODE": "token"} and auth.export == "export RAY_AUTH_MODE=token"
    assert auth.token_file == str(Path.home() / ".ray" / "auth_token")


def test_the_token_is_found_where_ray_finds_it():
    path = client_auth({"RAY_AUTH_MODE": "TOKEN", "RAY_AUTH_TOKEN_PATH": "/etc/my token"})
    assert path.export == "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH='/etc/my token'"
    assert path.token_file == "/etc/my token"
    in_env = client_auth({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "s3cret", "RAY_AUTH_TOKEN_PATH": "/x"})
    assert in_env.token_file is None and "$RAY_AUTH_TOKEN" in in_env.token_where and "s3cret" not in in_env.export
    off = client_auth({"RAY_AUTH_MODE": "disabled"})
    assert not off.enabled and off.export == ""


def test_banner_says_what_to_export_where_the_token_is_and_how_to_paste_it():
    text = _banner(client_auth({"RAY_AUTH_MODE": "token"}))
    lines = [line.strip() for line in text.splitlines()]
    assert any(line.startswith("Ray token auth  export RAY_AUTH_MODE=token   # token in ") for line in lines), text
    assert f"job list --address {DASHBOARD}" in text and "get-auth-token` prints" in text
    assert str(Path.home() / ".ray" / "auth_token") in text
    assert "Prometheus      http://127.0.0.1:9191" in text and "Grafana" in text
    assert len(text.splitlines()) <= 16  # short: one screen with the status line under it


def test_banner_without_auth_or_prometheus():
    text = _banner(client_auth({"RAY_AUTH_MODE": "disabled"}), prometheus=None)
    assert "export" not in text and "get-auth-token" not in text
    assert f"job list --address {DASHBOARD}" in text
    assert "Prometheus      none, so the dashboard has no metrics" in text


def test_the_demo_goes_on_without_a_prometheus_binary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without Prometheus installed
    monkeypatch.delenv("RAY_PROMETHEUS_HOST", raising=False)
    assert _start_prometheus(tmp_path / "prometheus") is None
    out = capsys.readouterr().out
    assert "WARNING: going on without Prometheus" in out and "apt-get install prometheus" in out


def test_status_says_how_to_reach_the_dashboard_and_the_job_cli():
    ray = {"dashboard": DASHBOARD, "auth_mode": "token", "export": "export RAY_AUTH_MODE=token",
           "token_file": "/home/u/.ray/auth_token", "ray": ".venv/bin/ray"}
    flat = " ".join(render_text(None, None, now=0.0, ray=ray).split())
    assert "export RAY_AUTH_MODE=token (token in /home/u/.ray/auth_token)" in flat, flat
    assert f".venv/bin/ray job list --address {DASHBOARD}" in flat, flat
    assert "paste what `.venv/bin/ray get-auth-token` prints" in flat, flat
    open_flat = " ".join(render_text(None, None, now=0.0, ray=ray | {"auth_mode": "disabled"}).split())
    assert "export" not in open_flat and f"job list --address {DASHBOARD}" in open_flat
