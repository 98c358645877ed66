"""A stop signal ends a command within seconds even while its main thread holds the GIL in C code
(streamlearn/procs.py's watchdog): the exit clock, a thread of the command, cannot run then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from streamlearn.config import REPO_ROOT

HOLDS_THE_GIL = """
import subprocess, sys
from streamlearn.procs import stop_on_signals
stop_on_signals(1.0)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
sum(range(10**13))  # C code that never returns to the interpreter loop: no thread of ours runs
"""

LEAVES = """
import psutil, time
from streamlearn.procs import stop_on_signals
stop_on_signals(1.0)
print(*(child.pid for child in psutil.Process().children()), flush=True)
time.sleep(1)
"""


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether `pid` has exited (a zombie counts: it runs nothing) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_a_command_holding_the_gil_is_killed_with_its_children_after_the_clock():
    command = _start(HOLDS_THE_GIL)
    child = int(command.stdout.readline())
    try:
        time.sleep(0.5)  # into the sum
        signalled = time.monotonic()
        command.send_signal(signal.SIGTERM)
        command.wait(timeout=10)
        took = time.monotonic() - signalled
    finally:  # a test that fails leaves nothing spinning (and kills no process but its own)
        if command.poll() is None:
            command.kill()
            command.wait(timeout=10)
        try:
            if "time.sleep(600)" in " ".join(psutil.Process(child).cmdline()):
                psutil.Process(child).kill()
        except psutil.Error:
            pass
    assert command.returncode == -signal.SIGKILL and 1.0 <= took < 3.5, (command.returncode, took)
    assert _gone_within(child, 2), f"its child {child} outlived it"


def test_the_watchdog_holds_none_of_the_command_s_files_and_leaves_with_it():
    """A caller reading a command's output to its end (`$(streamlearn status)`) must not wait
    for the watchdog: it holds /dev/null and its two pipes, nothing the command had open."""
    command = _start(LEAVES)
    watchdogs = [int(pid) for pid in command.stdout.readline().split()]
    assert len(watchdogs) == 1, watchdogs
    held = {int(fd): os.readlink(f"/proc/{watchdogs[0]}/fd/{fd}") for fd in os.listdir(f"/proc/{watchdogs[0]}/fd")}
    assert all(held[fd] == os.devnull for fd in (0, 1, 2)), held
    assert all(target.startswith("pipe:") for fd, target in held.items() if fd > 2) and len(held) == 5, held
    assert command.stdout.read() == "" and command.wait(timeout=10) == 0
    assert _gone_within(watchdogs[0], 2), f"the watchdog {watchdogs[0]} outlived its command"
