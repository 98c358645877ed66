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
# Ray's log monitor lists the session's log folder after every pass over the files it follows (a
# pass every 0.1 s when nothing is new) until the folder holds 1,000 files, and every process Ray
# starts adds two or three: idle, 3.4 % of a core with 400 files (8 % late in `make test`). With
# the threshold at 0 it lists at most every 0.5 s, Ray's own back-off past it: 1.3 % with 400
# files. A new process's output then reaches a driver's log (`ray job logs`) up to 0.5 s later.
LOG_MONITOR_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}


def start_local_ray(**kwargs: Any):
    """`ray.init(address="local")` (never join a cluster someone else left running), then record
    this head as the machine's current cluster, as `ray start` does. Ray's job supervisor finds
    the cluster a submitted job's driver connects to through that record; without it, a stale
    record from an earlier cluster sends the job's driver to a dead address.

    Ray's processes inherit this process's environment, which first gets Serve's HAProxy
    ingress on loopback (streamlearn/serve/ingress.py): the scorer's fast path by default, and
    the log monitor's back-off (LOG_MONITOR_ENV); a variable already set is left as it is."""
    import ray
    from ray._private.utils import write_ray_address  # what `ray start --head` calls; pinned Ray 2.60

    from streamlearn.serve.ingress import state_dir, with_ingress

    os.environ.update(with_ingress(os.environ, state_dir()))
    os.environ.update({k: v for k, v in LOG_MONITOR_ENV.items() if k not in os.environ})
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


# ---- which Ray a command joins ---------------------------------------------------------------

ANSWER_WITHIN_S = 2.0  # a GCS that is up accepts a connection at once; a dead address refuses or times out


def recorded_cluster() -> tuple[str | None, str]:
    """The machine's current-cluster record (what `ray start` and `start_local_ray` write): the
    address it holds, or None, and the file's path (Ray's temp dir, RAY_TMPDIR if set)."""
    from ray._common.utils import get_ray_address_file  # pinned Ray 2.60, as write_ray_address above
    from ray._private.utils import read_ray_address

    return read_ray_address(), get_ray_address_file(None)


def forget_recorded(address: str) -> None:
    """What `ray stop` does for the record: remove it if it still names `address` (a cluster
    started later by someone else keeps its record). Left behind, the record sent every later
    `ray.init()` on the machine to a dead address, retrying for good (issue 47)."""
    from ray._common.utils import reset_ray_address

    if recorded_cluster()[0] == address:
        reset_ray_address()


def answers(address: str, timeout_s: float = ANSWER_WITHIN_S) -> bool:
    """Whether something accepts a TCP connection at `host:port` (`ray://` or not)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def join_ray(address: str | None = None, *, local_if_none: bool, **kwargs: Any):
    """`ray.init` for a streamlearn command, never waiting on an address that does not answer.

    The cluster is `address`, else RAY_ADDRESS, else the machine's record; "auto" means the last
    two. One that does not answer within ANSWER_WITHIN_S is refused with its source named, except
    a stale record where `local_if_none` (train): then, as with no cluster at all, a local head.
    Ray's own `ray.init()` retried a dead recorded address for over 11 minutes."""
    import ray

    from streamlearn.errors import ConfigError

    given = address if address not in (None, "auto") else os.environ.get("RAY_ADDRESS") or None
    source = "--address" if address not in (None, "auto") else "RAY_ADDRESS"
    if given not in (None, "auto", "local"):
        if ":" in given and not given.startswith(("http://", "https://")) and not answers(given):
            raise ConfigError(f"no Ray cluster answers at {given} ({source}): start it, point {source} at a "
                              f"running one" + (", or unset it to start a local Ray" if local_if_none else ""))
        return ray.init(address=given, **kwargs)
    recorded, record = recorded_cluster()
    if recorded and answers(recorded):
        return ray.init(address=recorded, **kwargs)
    if not local_if_none:
        said = (f"the machine's record {record} names {recorded}, where none answers (a cluster that stopped "
                f"without `ray stop`)" if recorded else "RAY_ADDRESS is unset and no cluster is recorded")
        raise ConfigError(f"no Ray cluster to join: {said}; start one (`streamlearn cluster up`, or "
                          f"`ray start --head`) or give --address HOST:PORT")
    if recorded:
        from streamlearn.logs import log

        log("ray_record_stale", level="warning", address=recorded, record=record,
            action="starting a local Ray head; the record is left for `ray stop` to remove")
    # No SIGINT ignored here, as the demo's head has it (procs.ctrl_c_left_to_us): a Ctrl-C while
    # the head starts would be lost and training go on. A head half-dead from a Ctrl-C is what the
    # CLI's exit clock (procs.stop_on_signals) kills, with its children.
    return ray.init(address="local", **kwargs)
