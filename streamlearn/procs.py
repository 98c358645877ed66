"""Stopping a process this project started, by its pid: the one way broker and Prometheus go."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def terminate(pid: int, alive: Callable[[int], bool], timeout_s: float) -> None:
    """SIGTERM (a clean shutdown flushes what the process holds), SIGKILL if it hangs.
    `alive` says whether `pid` is still the process we mean, not a reused pid."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
