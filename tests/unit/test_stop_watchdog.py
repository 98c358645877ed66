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
    deadline = time.monotonic() + 2
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"its child {child} outlived it"
        time.sleep(0.05)


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
    deadline = time.monotonic() + 2
    while psutil.pid_exists(watchdogs[0]) and psutil.Process(watchdogs[0]).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"the watchdog {watchdogs[0]} outlived its command"
        time.sleep(0.05)
