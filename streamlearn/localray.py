"""Start a private local Ray head in this process, the way tests, benchmarks and the demo need it,
and say what a client outside this process needs to reach it."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTH_MODE_VAR = "RAY_AUTH_MODE"  # Ray 2.60 reads these three in every process (ray._raylet's token loader)
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"


def start_local_ray(**kwargs: Any):
    """`ray.init(address="local")` (never join a cluster someone else left running), then record
    this head as the machine's current cluster, as `ray start` does. Ray's job supervisor finds
    the cluster a submitted job's driver connects to through that record; without it, a stale
    record from an earlier cluster sends the job's driver to a dead address.

    Ray's processes inherit this process's environment, which first gets Serve's HAProxy
    ingress on loopback (streamlearn/serve/ingress.py): the scorer's fast path by default."""
    import ray
    from ray._private.utils import write_ray_address  # what `ray start --head` calls; pinned Ray 2.60

    from streamlearn.serve.ingress import state_dir, with_ingress

    os.environ.update(with_ingress(os.environ, state_dir()))
    with free_agent_port():
        ctx = ray.init(address="local", **kwargs)
    write_ray_address(ctx.address_info["gcs_address"])
    return ctx


@contextmanager
def free_agent_port():
    """Inside it, a `ray.init()` head gives its dashboard agent a free port. ray.init() has no
    argument for it and always takes 52365, so a second Ray on the machine (a user's other
    cluster, the test suite's) made ours fail to start. Pinned Ray 2.60: RayParams takes it."""
    import ray._private.parameter as ray_parameter

    from streamlearn.kafka.broker import free_port

    init, port = ray_parameter.RayParams.__init__, free_port()

    def with_agent_port(self, *args, **kwargs):
        kwargs.setdefault("dashboard_agent_listen_port", port)
        init(self, *args, **kwargs)

    ray_parameter.RayParams.__init__ = with_agent_port
    try:
        yield
    finally:
        ray_parameter.RayParams.__init__ = init


@dataclass(frozen=True)
class ClientAuth:
    """What a new shell needs for `ray job submit/list/logs --address http://...` to get in."""

    env: dict[str, str]  # to export; empty when the cluster has no auth
    token_file: str | None  # where the token lives; None when it is RAY_AUTH_TOKEN or auth is off

    @property
    def enabled(self) -> bool:
        return bool(self.env)

    @property
    def export(self) -> str:
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()) if self.env else ""

    @property
    def token_where(self) -> str:
        return self.token_file or f"${TOKEN_VAR} of the shell that started the cluster"


def client_auth(environ: Mapping[str, str] = os.environ, mode: str | None = None) -> ClientAuth:
    """From the environment Ray's head started with (after `ray.init`, which sets RAY_AUTH_MODE=token
    when it was unset). Ray's CLI sends the token only when RAY_AUTH_MODE=token is in its own
    environment, so a new shell must export it; the token is found as Ray finds it: RAY_AUTH_TOKEN,
    else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token."""
    if (mode or environ.get(AUTH_MODE_VAR, "")).lower() != "token":
        return ClientAuth(env={}, token_file=None)
    if environ.get(TOKEN_VAR):
        return ClientAuth(env={AUTH_MODE_VAR: "token"}, token_file=None)
    if environ.get(TOKEN_PATH_VAR):
        path = environ[TOKEN_PATH_VAR]
        return ClientAuth(env={AUTH_MODE_VAR: "token", TOKEN_PATH_VAR: path}, token_file=path)
    return ClientAuth(env={AUTH_MODE_VAR: "token"}, token_file=str(Path.home() / ".ray" / "auth_token"))


def ray_cli() -> str:
    """The `ray` next to this interpreter (same Ray version as the cluster), as `.venv/bin/ray`
    when that is the same file: `make setup` links .venv to a long path outside the clone."""
    path = Path(sys.executable).parent / "ray"
    local = Path(".venv/bin/ray")
    try:
        return str(local) if local.exists() and local.samefile(path) else str(path)
    except OSError:
        return str(path)
