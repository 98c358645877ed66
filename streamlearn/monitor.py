"""A real Prometheus scraping the running Ray cluster: `streamlearn monitor up|down|status`.

Prometheus comes from the OS (Debian's `prometheus` package; scripts/setup.sh installs it).
Its config is deploy/prometheus/prometheus.yml with the service-discovery path pointed at
the cluster to watch: Ray's head keeps the list of every node's metrics endpoint in that
file, so Prometheus follows nodes as they come and go. Data, config, log and the state file
(pid, port) live in one directory, the cache's `prometheus/` unless given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from streamlearn.config import cache_dir, repo_file
from streamlearn.errors import ConfigError, StreamlearnError
from streamlearn.kafka.broker import free_port, port_in_use
from streamlearn.procs import terminate

TEMPLATE = "deploy/prometheus/prometheus.yml"
RULES = Path("deploy/prometheus/alerts.yml")  # alerting rules the template loads (rule_files)
DISCOVERY_NAME = "prom_metrics_service_discovery.json"  # ray._private.ray_constants, Ray 2.60
TEMPLATE_DISCOVERY = f"/tmp/ray/{DISCOVERY_NAME}"
DEFAULT_PORT = 9090
PROMETHEUS_HOST_VAR = "RAY_PROMETHEUS_HOST"  # Ray's dashboard reads it once, when its modules start


class MonitorError(StreamlearnError):
    """Prometheus did not start or answer; the message points at its log."""


def default_discovery_file(ray_temp_dir: str | Path | None = None) -> Path:
    """Where Ray's head keeps the service-discovery file: a link at <temp dir>/ to the current
    session's copy. The temp dir is /tmp/ray unless Ray was started with --temp-dir/RAY_TMPDIR."""
    base = ray_temp_dir or (Path(os.environ["RAY_TMPDIR"]) / "ray" if os.environ.get("RAY_TMPDIR") else "/tmp/ray")
    return Path(base) / DISCOVERY_NAME


def session_discovery_file() -> Path:
    """The discovery file of the Ray cluster this process is connected to (driver on the head)."""
    import ray

    if not ray.is_initialized():
        raise ConfigError("not connected to Ray: call ray.init() first, or pass the discovery file")
    return Path(ray._private.worker.global_worker.node.get_session_dir_path()) / DISCOVERY_NAME


def cluster_discovery_file(address: str = "auto") -> Path:
    """Connect to a running cluster just long enough to learn its session directory (run this on
    its head node: the file is local there). Finds clusters started with any --temp-dir."""
    import ray

    from streamlearn.localray import join_ray  # refuses in seconds an address nothing answers at

    if ray.is_initialized():
        return session_discovery_file()
    try:
        join_ray(address, local_if_none=False, configure_logging=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(f"no running Ray cluster at {address!r} ({str(e)[:200]}); start one first, or pass "
                          f"--discovery-file <ray temp dir>/{DISCOVERY_NAME}") from None
    try:
        return session_discovery_file()
    finally:
        ray.shutdown()  # a connected driver only disconnects; the cluster keeps running


@dataclass
class Monitor:
    data_dir: Path = field(default_factory=lambda: cache_dir() / "prometheus")
    port: int = DEFAULT_PORT  # 0: a free one
    host: str = "127.0.0.1"
    discovery_file: Path | None = None  # None: Ray's default location
    scrape_interval_s: float | None = None  # None: the config's (5 s); test_metrics' uses 2 s
    start_timeout_s: float = 30.0

    def __post_init__(self):
        self.data_dir = Path(self.data_dir)
        state = self._state()
        if state and self.port == 0:
            self.port = state["port"]  # the running one's port, so `status`/`down` with port 0 find it

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "prometheus.log"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "prometheus.yml"

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "monitor.json"

    def _state(self) -> dict | None:
        try:
            return json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return None

    def pid(self) -> int | None:
        """The pid of the Prometheus this directory started, if it still runs."""
        state = self._state()
        pid = state.get("pid") if state else None
        return pid if isinstance(pid, int) and _is_prometheus(pid) else None

    def ready(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=timeout) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def up(self) -> Monitor:
        """Start Prometheus (or find the one this directory already runs) and wait until ready."""
        if self.pid() is not None:
            state = self._state() or {}
            self.port = state.get("port", self.port)
            if self.ready():
                return self
        binary = shutil.which("prometheus")
        if binary is None:
            raise ConfigError("Prometheus is not installed: run scripts/setup.sh (it installs Debian's "
                              "`prometheus` package), or `apt-get install prometheus`")
        discovery = Path(self.discovery_file or default_discovery_file())
        if not discovery.exists():
            raise ConfigError(f"no Ray service-discovery file at {discovery}: start the Ray cluster first "
                              "(`ray start --head` or `streamlearn demo`), or pass --discovery-file "
                              f"<ray temp dir>/session_latest/{DISCOVERY_NAME}")
        if self.port == 0:
            self.port = free_port()
        elif port_in_use(self.port):
            raise ConfigError(f"port {self.port} is taken; stop what uses it or pick another with --port (0: any)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config(discovery)
        out = open(self.log_file, "ab")
        proc = subprocess.Popen(
            [binary, f"--config.file={self.config_file}", f"--storage.tsdb.path={self.data_dir / 'data'}",
             f"--web.listen-address={self.host}:{self.port}", "--storage.tsdb.retention.time=15d"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self._proc = proc
        self._state_file.write_text(json.dumps({"pid": proc.pid, "port": self.port, "host": self.host,
                                                "url": self.url, "discovery_file": str(discovery)}))
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._state_file.unlink(missing_ok=True)
                raise MonitorError(f"Prometheus exited with code {proc.returncode} at start: "
                                   f"{_tail(self.log_file)} (log: {self.log_file})")
            if self.ready(1.0):
                return self
            time.sleep(0.3)
        self.down()
        raise MonitorError(f"Prometheus did not answer /-/ready within {self.start_timeout_s:.0f}s; "
                           f"see {self.log_file}")

    def down(self, timeout_s: float = 20.0) -> bool:
        """SIGTERM (Prometheus flushes its head block), SIGKILL if it hangs. False if not running."""
        pid = self.pid()
        if pid is None:
            self._state_file.unlink(missing_ok=True)  # a stale record of one that died
            return False
        terminate(pid, _is_prometheus, timeout_s)  # SIGTERM lets Prometheus flush its head block
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.pid == pid:
            proc.wait(timeout_s)  # started by this process: reap it, leave no zombie
        self._state_file.unlink(missing_ok=True)
        return True

    def status(self) -> dict:
        state = self._state() or {}
        pid = self.pid()
        return {"running": pid is not None, "pid": pid, "url": state.get("url") if pid else None,
                "ready": pid is not None and self.ready(), "discovery_file": state.get("discovery_file"),
                "data_dir": str(self.data_dir), "log": str(self.log_file)}

    def _write_config(self, discovery: Path) -> None:
        text = repo_file(TEMPLATE).read_text()
        if TEMPLATE_DISCOVERY not in text:
            raise ConfigError(f"{TEMPLATE} no longer names {TEMPLATE_DISCOVERY}; monitor cannot point it at "
                              "the cluster")
        text = text.replace(TEMPLATE_DISCOVERY, str(discovery))
        if self.scrape_interval_s is not None:
            interval = f"{round(self.scrape_interval_s * 1000)}ms"  # Prometheus durations take whole units
            timeout = f"{round(self.scrape_interval_s * 800)}ms"  # must not exceed the interval
            text = re.sub(r"(?m)^(\s*(?:scrape|evaluation)_interval:) \S+", rf"\1 {interval}", text)
            text = re.sub(r"(?m)^(\s*scrape_timeout:) \S+", rf"\1 {timeout}", text)
        # The rules file goes first: the config names it, relative to the config's own folder.
        for path, content in ((self.data_dir / RULES.name, repo_file(str(RULES)).read_text()),
                              (self.config_file, text)):
            fd, tmp = tempfile.mkstemp(dir=self.data_dir, suffix=".yml")
            with os.fdopen(fd, "w") as f:
                f.write(content)
            os.replace(tmp, path)


TARGETS_NAME = "ray_targets.json"


def up_before_head(data_dir: Path, scrape_interval_s: float | None = None) -> Monitor:
    """Prometheus for a Ray head this process is about to start. The dashboard reads Prometheus's
    URL once, when it starts, but Ray writes its discovery file only into the session it creates:
    so Prometheus starts first, on a targets file of its own that names no one yet, and
    `follow_session` then makes that file a link to the session's (re-read every 5 s)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    targets = data_dir / TARGETS_NAME
    _replace(targets, lambda tmp: tmp.write_text("[]"))  # not an old session's link: those ports are dead
    return Monitor(data_dir=data_dir, port=0, discovery_file=targets, scrape_interval_s=scrape_interval_s).up()


def follow_session(monitor: Monitor) -> None:
    """Point `up_before_head`'s Prometheus at the Ray session this process started."""
    _replace(Path(monitor.discovery_file), lambda tmp: tmp.symlink_to(session_discovery_file()))


def _replace(path: Path, make) -> None:
    """Swap the file in one rename: Prometheus never reads a missing or half-written one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    make(tmp)
    os.replace(tmp, path)


def query(base_url: str, expr: str, timeout: float = 5.0) -> list[dict]:
    """An instant PromQL query: the `result` list of /api/v1/query."""
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        raise MonitorError(f"Prometheus refused {expr!r}: {e.read()[:300]!r}") from None
    if body.get("status") != "success":
        raise MonitorError(f"Prometheus query {expr!r} failed: {body.get('error')}")
    return body["data"]["result"]


def _is_prometheus(pid: int) -> bool:
    """Alive, not a zombie, and still Prometheus (a recycled pid must never be signalled)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"prometheus" in f.read().split(b"\0")[0]
    except OSError:
        return False


def _tail(path: Path, chars: int = 400) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return "(no log)"
