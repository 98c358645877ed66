"""`streamlearn evaluate` with no broker at its address says so within seconds, as a sentence and
exit 2, rather than waiting out librdkafka's 10-s metadata timeout (issue 47). A real refused port."""

from __future__ import annotations

import subprocess
import sys
import time

from streamlearn.kafka.broker import free_port
from streamlearn.observe.evaluator import BROKER_WAIT_S


def test_evaluate_names_the_absent_broker_within_seconds(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamlearn.cli", "evaluate", "--bootstrap", address,
                           "--checkpoint-dir", str(tmp_path), "--duration", "1"],
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"no Kafka broker answers at {address} within {BROKER_WAIT_S:g} s" in done.stderr
    assert "Traceback" not in done.stderr
    assert took < BROKER_WAIT_S + 6, f"took {took:.1f} s"  # the interpreter's start and imports, then the wait
