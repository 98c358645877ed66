"""Embedded Apache Kafka 4.x (KRaft, each node broker and controller) run from Maven jars: one
broker (`EmbeddedKafka`), or a cluster of them replicating every topic (`KafkaCluster`).

No Docker and no tarball: `deploy/kafka/pom.xml` pulls the broker jars from Maven Central
once into a cache outside the repo, and `java -cp 'jars/*' kafka.Kafka` runs them. Data
lives in a persistent directory, so a restarted broker still has every event.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from streamlearn.config import KafkaSettings, cache_dir, repo_file
from streamlearn.errors import BrokerStartError, ConfigError, KafkaUnavailable
from streamlearn.kafka import secure
from streamlearn.logs import log
from streamlearn.procs import terminate, terminate_all

KAFKA_VERSION = "4.3.1"
JVM_FLAGS = ["-Xms128m", "-Xmx512m", "-Djava.awt.headless=true"]
# The collector and the compilers, named as Kafka's own scripts (kafka-run-class.sh) take them:
# $KAFKA_JVM_PERFORMANCE_OPTS, where set, replaces these. The test session sets C1 alone
# (-XX:TieredStopAtLevel=1): a short-lived broker then spends ~38 % less CPU (DECISIONS §7).
PERFORMANCE_OPTS_VAR = "KAFKA_JVM_PERFORMANCE_OPTS"
JVM_PERFORMANCE_FLAGS = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]


def jvm_flags() -> list[str]:
    """The broker JVM's flags: heap and headless, then $KAFKA_JVM_PERFORMANCE_OPTS or our defaults."""
    given = os.environ.get(PERFORMANCE_OPTS_VAR, "").strip()
    return [*JVM_FLAGS, *(shlex.split(given) if given else JVM_PERFORMANCE_FLAGS)]


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range (32768+ on Linux): a port
    from that range (what binding port 0 gives) can be taken by any process's outgoing
    connection before its new owner binds it (a Serve proxy failed to bind one in CI)."""
    return free_ports(1)[0]


_GIVEN: set[int] = set()  # ports this process handed out: none is handed out twice


def free_ports(n: int) -> list[int]:
    """`n` different free ports, none handed out before by this process: a port picked but not
    yet bound looks free, and two draws gave `ray start` one port for two of its servers
    (2026-11-26). Each is held bound until all are picked."""
    held: list[socket.socket] = []
    try:
        for port in random.sample(range(20000, 32768), 200 + n):
            if port in _GIVEN:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
            if len(held) == n:
                ports = [s.getsockname()[1] for s in held]
                _GIVEN.update(ports)
                return ports
        raise OSError(f"not {n} free loopback ports in 20000-32767")
    finally:
        for s in held:
            s.close()


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _holder(port: int) -> str:
    """" by pid N (name)" for the process listening on loopback `port`, where the OS tells us."""
    import psutil

    try:
        pid = next((c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                    and c.laddr and c.laddr.port == port and c.pid), None)
        return f" by pid {pid} ({psutil.Process(pid).name()})" if pid else ""
    except (psutil.Error, OSError):
        return ""


def fetch_jars(version: str = KAFKA_VERSION) -> Path:
    """Download the broker jars once; later calls return the cached directory."""
    jars = cache_dir() / f"kafka-{version}"
    if (jars / f"kafka_2.13-{version}.jar").exists():
        return jars
    if not shutil.which("mvn"):
        raise ConfigError("Maven (mvn) is needed once to fetch the Kafka jars: apt-get install maven")
    jars.mkdir(parents=True, exist_ok=True)
    cmd = ["mvn", "-q", "-B", "-f", str(repo_file("deploy/kafka/pom.xml")), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-Dkafka.version={version}", f"-DoutputDirectory={jars}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (jars / f"kafka_2.13-{version}.jar").exists():
        shutil.rmtree(jars, ignore_errors=True)
        raise BrokerStartError(f"fetching Kafka {version} jars failed: {(done.stdout + done.stderr)[-600:]}")
    return jars


def metadata_ok(bootstrap: str, timeout: float = 2.0, conf: dict | None = None) -> bool:
    """True when a broker at `bootstrap` answers a metadata request (not just accepts TCP)."""
    return probe({"bootstrap.servers": bootstrap, **(conf or {})}, timeout)[0]


# Errors that retrying cannot fix: the client's credentials or trust settings are wrong.
_AUTH_CODES = {"_AUTHENTICATION": "authentication failed", "SASL_AUTHENTICATION_FAILED": "authentication failed",
               "_SSL": "TLS handshake failed"}


def probe(conf: dict, timeout: float) -> tuple[bool, str | None]:
    """(answers, why not): a metadata request with client config `conf`; stops at the first
    authentication or TLS error instead of letting librdkafka reconnect until the timeout."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list = []
    admin = AdminClient({**conf, "socket.timeout.ms": max(int(timeout * 1000), 100), "log_level": 0,
                         "logger": _silent, "error_cb": errors.append})
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            if admin.list_topics(timeout=max(min(0.25, left), 0.05)).brokers:
                return True, None
        except KafkaException:
            pass
        admin.poll(0)  # serves error_cb
        for err in errors:
            kind = _AUTH_CODES.get(err.name())
            if kind:
                return False, f"{kind}: {err.str()}"
        if left <= 0:
            return False, None


def _silent(*_args) -> None:
    """librdkafka logs every refused connection; a probe expects refusals."""


@dataclass
class EmbeddedKafka:
    """One broker on loopback; `port=0` picks free ports. Alone (`quorum` None) it is its own
    controller quorum; in a `KafkaCluster` it is node `node_id` of the quorum `quorum` names."""

    port: int = 9092
    controller_port: int = 0
    data_dir: Path | None = None
    version: str = KAFKA_VERSION
    start_timeout_s: float = 90.0
    security: secure.BrokerSecurity | None = None  # None: PLAINTEXT; else SASL_SSL + SCRAM for clients
    node_id: int = 1
    quorum: str | None = None  # controller.quorum.voters ("1@host:port,2@..."): a cluster's node
    replicas: int = 1  # copies of each partition (the cluster's size, up to 3)
    cluster_id: str | None = None  # a cluster's nodes are formatted with one id; alone, a new one
    dump_classes_to: Path | None = None  # build_class_archive's: the classes it loaded, written at exit

    def __post_init__(self):
        self.port = self.port or free_port()
        self.data_dir = Path(self.data_dir or cache_dir() / f"broker-{self.port}")
        self.controller_port = self.controller_port or self._controller_port()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / "tls"

    def client_settings(self, user: str | None = None, password=None) -> KafkaSettings:
        """Settings a client needs for this broker (as `user` when it runs SASL_SSL)."""
        if self.security is None:
            return KafkaSettings(bootstrap=self.bootstrap)
        user = user or next(iter(self.security.users))
        return secure.client_settings(self.bootstrap, self.security, self.tls_dir, user, password)

    def _serving(self, timeout: float) -> bool:
        return metadata_ok(self.bootstrap, timeout, self.client_settings().confluent())

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "broker.json"

    def pid(self) -> int | None:
        try:
            pid = json.loads(self._state_file.read_text())["pid"]
            os.kill(pid, 0)
            return pid
        except (OSError, KeyError, ValueError):
            return None

    def start(self) -> EmbeddedKafka:
        if self.pid() and self._serving(2.0):
            return self  # already ours and serving: `up` is idempotent
        self.wait_serving(self.launch())
        return self

    def launch(self) -> subprocess.Popen:
        """Start the broker's JVM and return at once: a cluster's nodes serve only once a majority
        of its controllers runs, so they are all launched before any is waited for."""
        if not shutil.which("java"):
            raise ConfigError("Java 17+ is needed to run Kafka: apt-get install openjdk-17-jre-headless")
        for port in (self.port, self.controller_port):
            deadline = time.monotonic() + 5.0  # a JVM just killed may still be closing its sockets
            while port_in_use(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if port_in_use(port):
                raise BrokerStartError(f"port {port} is taken{_holder(port)}; stop what uses it or pick another "
                                       "with --port")
        jars = fetch_jars(self.version)
        props = self._write_properties()
        self._format_storage(jars, props)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        out = open(self.data_dir / "logs" / "stdout.log", "ab")
        classes = [f"-XX:ArchiveClassesAtExit={self.dump_classes_to}"] if self.dump_classes_to else _classes(jars)
        proc = subprocess.Popen(
            ["java", *jvm_flags(), *classes,
             f"-Dlog4j2.configurationFile={repo_file('deploy/kafka/log4j2.properties')}",
             f"-Dkafka.logs.dir={self.data_dir / 'logs'}", "-cp", f"{jars}/*", "kafka.Kafka", str(props)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._state_file.write_text(json.dumps({"pid": proc.pid, "port": self.port,
                                                "controller_port": self.controller_port}))
        return proc

    def wait_serving(self, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerStartError(f"Kafka exited with code {proc.returncode} at start; see {self.log_file}")
            if self._serving(1.0):
                return
            time.sleep(0.3)
        self.stop()
        raise BrokerStartError(f"Kafka did not serve metadata within {self.start_timeout_s:.0f}s; see {self.log_file}")

    def kill(self) -> int:
        """SIGKILL, as a machine's crash would: no flush, no controlled shutdown. Returns the pid."""
        pid = self.pid()
        if pid is None:
            raise BrokerStartError(f"no broker of ours runs for {self.data_dir}")
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.02)
        self._state_file.unlink(missing_ok=True)
        return pid

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM (clean shutdown, flushes logs), SIGKILL if it hangs. False if it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        self._stopped(killed=terminate(pid, _alive, timeout_s), waited_s=timeout_s)
        return True

    def _stopped(self, killed: bool, waited_s: float) -> None:
        self._state_file.unlink(missing_ok=True)
        if killed:  # its logs may be torn, and the next start recovers them: worth a line
            log("kafka_broker_killed", level="warning", node=self.node_id, waited_s=waited_s,
                log_file=str(self.log_file))

    def _controller_port(self) -> int:
        # KRaft records the controller's endpoint in its log, so a restart must reuse it.
        props = self.data_dir / "server.properties"
        if props.exists():
            found = re.search(r"^controller\.quorum\.bootstrap\.servers=127\.0\.0\.1:(\d+)$", props.read_text(), re.M)
            if found:
                return int(found.group(1))
        return self.port + 1 if self.port == 9092 else free_port()

    def _write_properties(self) -> Path:
        base = repo_file("deploy/kafka/server.properties").read_text()
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        props = self.data_dir / "server.properties"
        if self.security is None:
            listeners = [f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                         f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}"]
        else:  # later keys win, so these replace the base file's PLAINTEXT listener settings
            listeners = secure.listener_properties(self.security, self.tls_dir, self.port, self.controller_port)
        if self.security is not None:  # it will hold the broker's own SCRAM password: private from the start
            props.touch(mode=0o600)
            os.chmod(props, 0o600)
        quorum = [f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}"] if self.quorum is None \
            else [f"node.id={self.node_id}", f"controller.quorum.voters={self.quorum}", *_replication(self.replicas),
                     f"broker.heartbeat.interval.ms={HEARTBEAT_MS}"]
        props.write_text(base + "\n".join([
            "", "# Filled in by streamlearn for this broker:", *listeners, *quorum,
            f"log.dirs={self.data_dir / 'data'}", ""]))
        return props

    def _format_storage(self, jars: Path, props: Path) -> None:
        if (self.data_dir / "data" / "meta.properties").exists():
            return  # formatted before: keep its data
        cluster_id = self.cluster_id or new_cluster_id()
        users = secure.scram_format_args(self.security, self.tls_dir) if self.security else []
        # Alone, the broker is a quorum of one (--standalone); a cluster's quorum is in its properties.
        alone = ["--standalone"] if self.quorum is None else []
        done = subprocess.run([*_storage_tool(jars), "format", "-t", cluster_id, "-c", str(props), *alone, "-g",
                               *users], capture_output=True, text=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-600:]
            for secret in self.security.users.values() if self.security else ():
                output = output.replace(secret.get_secret_value(), "**********")
            raise BrokerStartError(f"formatting Kafka storage failed: {output}")


@dataclass
class KafkaCluster:
    """`size` brokers on loopback, each also one of the KRaft controller quorum's voters, every
    topic replicated to min(size, 3) of them: the failover a bank's Kafka does, on one machine.
    `port=0` picks free ports; else broker i listens on port + 2i (its controller on the next).
    The layout is kept in `data_dir`/cluster.json, so `up` again restarts the same cluster."""

    size: int = 3
    port: int = 9092
    data_dir: Path | None = None
    version: str = KAFKA_VERSION
    start_timeout_s: float = 120.0

    def __post_init__(self):
        if self.size < 1:
            raise ConfigError(f"a Kafka cluster needs at least 1 broker, not {self.size}")
        self.data_dir = Path(self.data_dir or cache_dir() / f"cluster-{self.port or 'any'}")
        layout = self.data_dir / "cluster.json"
        if layout.exists():
            ports, controllers = json.loads(layout.read_text())["nodes"]
        else:
            ports = free_ports(2 * self.size) if self.port == 0 \
                else [self.port + k for k in range(2 * self.size)]
            ports, controllers = ports[0::2], ports[1::2]
        quorum = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, c in enumerate(controllers))
        self.nodes = [EmbeddedKafka(port=p, controller_port=c, data_dir=self.data_dir / f"node-{i + 1}",
                                    version=self.version, start_timeout_s=self.start_timeout_s, node_id=i + 1,
                                    quorum=quorum, replicas=min(len(ports), 3))
                      for i, (p, c) in enumerate(zip(ports, controllers, strict=True))]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> KafkaCluster:
        """Start every node not serving (idempotent), then wait until each one serves."""
        todo = [node for node in self.nodes if not (node.pid() and node._serving(1.0))]
        if todo:
            cluster_id = None if self._formatted() else new_cluster_id()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir / "cluster.json").write_text(json.dumps(
                {"nodes": [[n.port for n in self.nodes], [n.controller_port for n in self.nodes]]}))
            for node in todo:
                node.cluster_id = cluster_id
            launched = [(node, node.launch()) for node in todo]
            for node, proc in launched:
                node.wait_serving(proc)
        return self

    def _formatted(self) -> bool:
        return any((node.data_dir / "data" / "meta.properties").exists() for node in self.nodes)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop every node cleanly, all at once (one at a time, the last had no quorum left and
        waited out its SIGKILL); False if none was running. A node still waiting for its
        controlled shutdown's approval once most nodes are gone waits for what cannot come
        (`Stranded`): it is stopped at once, not at the timeout."""
        running = [(node, pid) for node in self.nodes if (pid := node.pid()) is not None]
        stranded = Stranded({pid: node for node, pid in running}, majority=len(self.nodes) // 2 + 1)
        killed = terminate_all([pid for _, pid in running], _alive, timeout_s, hopeless=stranded)
        for node, pid in running:
            node._stopped(killed=pid in killed and pid not in stranded.judged, waited_s=timeout_s)
            if pid in stranded.judged:
                log("kafka_node_stranded", level="warning", node=node.node_id, log_file=str(node.log_file),
                    why="its controlled shutdown waited for an approval from a controller quorum that had "
                        "stopped; stopped with SIGKILL (the next start recovers its logs)")
        return bool(running)


# What a broker logs once the active controller lets its controlled shutdown go on (Kafka 4.x's
# BrokerLifecycleManager), or when it has none to ask for (a broker still starting).
SHUTDOWN_APPROVED = ("The controller has asked us to exit controlled shutdown.", "Skipping controlled shutdown")
STRANDED_AFTER_S = 2.0  # past the quorum's end: an approval sent just before has been logged


class Stranded:
    """`terminate_all`'s `hopeless` for a cluster stopped together: a node's controlled shutdown
    ends with the active controller's approval, committed by a majority of the quorum. Signalled
    together, each node's controller leaves ~1 s after its own broker's approval; a broker not
    approved by then (its replay behind, under load: 2 of 39 stops here, and in CI after a broker
    restart) asks a quorum that has gone, until Kafka's 5-minute limit. Once fewer than a majority
    of the nodes run, a node that has not logged its approval `STRANDED_AFTER_S` later never will."""

    def __init__(self, nodes: dict[int, EmbeddedKafka], majority: int):
        self.nodes, self.majority = nodes, majority
        self.marks = {pid: _log_size(node.log_file) for pid, node in nodes.items()}  # the log before the signal
        self.quorum_gone_at: float | None = None
        self.judged: set[int] = set()
        self.approved: set[int] = set()  # read once: asked every poll, its log is not read again

    def __call__(self, pid: int, running: list[int]) -> bool:
        if len(running) >= self.majority:
            return False
        self.quorum_gone_at = self.quorum_gone_at or time.monotonic()
        if pid in self.approved or time.monotonic() - self.quorum_gone_at < STRANDED_AFTER_S:
            return False
        text = _log_since(self.nodes[pid].log_file, self.marks[pid])
        if any(line in text for line in SHUTDOWN_APPROVED):
            self.approved.add(pid)
            return False  # approved: its own shutdown is under way, with the timeout's time
        self.judged.add(pid)
        return True


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_since(path: Path, offset: int) -> str:
    """The log written since `offset` (all of it if it rolled over since)."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) < offset:
                offset = 0
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def class_archive(jars: Path) -> Path:
    """The broker's class-data archive (AppCDS) beside its jars, for this JDK: a start maps the
    classes it would otherwise load, parse and verify from its jars. Named by the java binary's
    real path and time, so another JDK (an upgrade in place too) never meets it; one made for other
    jars would be passed over, with a warning in the broker's stdout.log (-Xshare:auto)."""
    java = Path(os.path.realpath(shutil.which("java") or "java"))
    stamp = int(java.stat().st_mtime) if java.exists() else 0
    tag = hashlib.sha256(f"{java}:{stamp}".encode()).hexdigest()[:12]
    return jars / f"broker-classes-{tag}.jsa"


def build_class_archive(version: str = KAFKA_VERSION) -> Path | None:
    """Once per jars and JDK (`make setup`, through `kafka fetch-jars`): start a throwaway broker
    and stop it, its JVM writing the classes its start loaded. Every later broker starts with
    them: 3.0 instead of 4.9 CPU-s to serving, 2.8 instead of 3.8 s (medians of 3 alternating starts, here).
    None, and a broker starts as before, if Java is missing or the archive could not be made."""
    if not shutil.which("java"):
        return None
    archive = class_archive(fetch_jars(version))
    if archive.exists():
        return archive
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    scratch = cache_dir() / f"class-archive-broker-{os.getpid()}"  # its log kept if it fails
    broker = EmbeddedKafka(port=0, data_dir=scratch, version=version, dump_classes_to=partial)
    try:
        try:
            broker.start()
        finally:
            broker.stop()  # the JVM writes the archive as it exits (~3 s more)
        shutil.rmtree(scratch, ignore_errors=True)
    except BrokerStartError as e:  # a speed-up only: `make setup` goes on, brokers start without it
        log("kafka_class_archive_skipped", level="warning", reason=str(e))
    if partial.exists() and maps(partial, jars=archive.parent):
        os.replace(partial, archive)  # whole or not at all: a broker never meets a half-written file
    partial.unlink(missing_ok=True)
    return archive if archive.exists() else None


def maps(archive: Path, jars: Path) -> bool:
    """Whether this JDK maps `archive` for the broker's classpath. -Xshare:on refuses one made for
    another JDK or other jars (a broker's -Xshare:auto would pass over those), and a cut one (a JVM
    killed while writing it) crashes the JVM as it maps it (SIGBUS, with -Xshare:auto too): so no
    archive is adopted before this says yes. The crash report goes nowhere, not into the cwd."""
    done = subprocess.run(["java", "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-XX:ErrorFile=/dev/null",
                           "-XX:-CreateCoredumpOnCrash", "-cp", f"{jars}/*", "-version"], capture_output=True)
    return done.returncode == 0


def _storage_tool(jars: Path) -> list[str]:
    # A run of a second or so: the C1 compiler alone and the serial collector start it with ~25 %
    # less CPU than the JVM's server defaults, the broker's class archive (same classpath) with half
    # as much again: a format 1.7 -> 1.3 -> 0.8 CPU-s, 1.2 -> 0.6 s (measured here).
    return ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", *_classes(jars), "-cp", f"{jars}/*",
            "kafka.tools.StorageTool"]


def _classes(jars: Path) -> list[str]:
    """The JVM flag that maps the class archive, for a broker or the storage tool (same classpath)."""
    archive = class_archive(jars)
    return [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []


def new_cluster_id() -> str:
    """What `kafka-storage random-uuid` prints, without starting a JVM for it (~1.2 CPU-s): Kafka's
    Uuid.randomUuid, a random UUID as unpadded URL-safe base64, never one that starts with "-"."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


# A broker's controlled shutdown ends when the active controller approves it, on a heartbeat; one
# refused asks again a heartbeat interval later (2 s by default). Stopped together (`kafka down`),
# each node's controller leaves ~1 s after its own broker's approval, so a broker refused once found
# no quorum 2 s later and waited out its SIGKILL. Asking every 250 ms, it is approved in time.
HEARTBEAT_MS = 250


def _replication(replicas: int) -> list[str]:
    """A bank's durability: every partition (the consumer groups' offsets too) on `replicas`
    brokers, and a write acknowledged (acks=all) only once 2 of them hold it, so one broker
    lost loses nothing and leaves the partition writable."""
    insync = min(2, replicas)
    return [f"default.replication.factor={replicas}", f"min.insync.replicas={insync}",
            f"offsets.topic.replication.factor={replicas}", f"transaction.state.log.replication.factor={replicas}",
            f"transaction.state.log.min.isr={insync}", f"share.coordinator.state.topic.replication.factor={replicas}"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child of ours is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def require_broker(target: str | KafkaSettings, timeout: float = 3.0) -> None:
    """Fail fast, with what to fix, unless a broker answers with these settings."""
    settings = target if isinstance(target, KafkaSettings) else KafkaSettings(bootstrap=target)
    ok, problem = probe(settings.confluent(), timeout)
    if ok:
        return
    if problem:  # wrong credentials do not get better by retrying: say so now, once
        who = f" as {settings.sasl_username!r} ({settings.sasl_mechanism})" if settings.sasl_username else ""
        raise ConfigError(f"Kafka at {settings.bootstrap} refused the connection{who}: {problem}. Check "
                          "STREAMLEARN_KAFKA_SASL_USERNAME/_SASL_PASSWORD/_SECURITY_PROTOCOL and, for TLS, "
                          "STREAMLEARN_KAFKA_SSL_CAFILE (the CA that signed the broker's certificate)")
    raise KafkaUnavailable(f"no Kafka broker answers at {settings.bootstrap}; start one with `streamlearn kafka up`")
