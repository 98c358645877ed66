"""A cluster stopped together: a node its quorum left waiting is stopped at once, not at the
timeout (the whole-cluster run is tests/integration/test_kafka_cluster.py)."""

import subprocess
import sys
import time

import pytest

from streamlearn.kafka import broker
from streamlearn.kafka.broker import EmbeddedKafka, Stranded
from streamlearn.procs import terminate_all

DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def deaf_process() -> subprocess.Popen:
    """A process that ignores SIGTERM, as a broker waiting for its approval does."""
    proc = subprocess.Popen([sys.executable, "-c", DEAF], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_hopeless_process_is_killed_at_once_and_the_others_at_the_timeout():
    procs = [deaf_process(), deaf_process()]
    pids = [p.pid for p in procs]
    alive = lambda pid: next(p for p in procs if p.pid == pid).poll() is None  # noqa: E731  reaps the dead
    started = time.monotonic()
    killed = terminate_all(pids, alive, timeout_s=1.5, hopeless=lambda pid, running: pid == pids[1])
    assert killed == [pids[1], pids[0]]  # judged first, then the one that outlived the timeout
    assert 1.5 <= time.monotonic() - started < 5


@pytest.fixture
def nodes(tmp_path):
    out = {}
    for pid in (101, 102, 103):
        node = EmbeddedKafka(port=1, controller_port=2, data_dir=tmp_path / str(pid))
        node.log_file.parent.mkdir(parents=True)
        node.log_file.write_text("[earlier] INFO The controller has asked us to exit controlled shutdown.\n")
        out[pid] = node
    return out


def test_a_node_is_stranded_only_unapproved_and_past_the_quorum_s_end(nodes, monkeypatch):
    monkeypatch.setattr(broker, "STRANDED_AFTER_S", 0.2)
    stranded = Stranded(nodes, majority=3)  # as a 5-node cluster's quorum
    assert not stranded(103, [101, 102, 103])  # a majority still runs: its approval can come
    assert not stranded(103, [102, 103])  # the quorum has just gone: an approval may still be on its way
    with open(nodes[102].log_file, "a") as f:  # approved since the signal: its shutdown is under way
        f.write("[now] INFO The controller has asked us to exit controlled shutdown.\n")
    time.sleep(0.25)
    assert not stranded(102, [102, 103])
    assert stranded(103, [102, 103])  # the approval logged before the signal does not count
    assert stranded.judged == {103}
