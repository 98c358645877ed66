"""Stopping processes this project started: by pid (the one way broker and Prometheus go),
and on Ctrl-C or SIGTERM, within seconds."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager


def terminate(pid: int, alive: Callable[[int], bool], timeout_s: float) -> bool:
    """SIGTERM (a clean shutdown flushes what the process holds), SIGKILL if it hangs (True).
    `alive` says whether `pid` is still the process we mean, not a reused pid."""
    return bool(terminate_all([pid], alive, timeout_s))


def terminate_all(pids: list[int], alive: Callable[[int], bool], timeout_s: float) -> list[int]:
    """`terminate` for processes that must go down together: all are signalled before any is
    waited for. The last broker of a KRaft quorum stopped one at a time has no quorum to hand
    its leadership over to, and hung until its SIGKILL (30 s for a 3-broker cluster, measured;
    signalled together, the three were gone in 6 s). Returns the pids that needed SIGKILL."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    hung = [pid for pid in pids if alive(pid)]
    for pid in hung:
        _signal(pid, signal.SIGKILL)
    return hung


def _signal(pid: int, sig: signal.Signals) -> None:
    """A process that exited since it was found is already where the signal would send it; with
    several, one gone must not leave the rest unsignalled."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def ctrl_c_left_to_us():
    """Processes started inside it ignore SIGINT (they inherit that). Ray's head processes are
    this process's children, in its process group, so a terminal's Ctrl-C reached them too, and
    the demo's orderly stop then hung on a half-dead dashboard (stopping the training job waited
    forever). Ctrl-C is the demo's to handle: it stops them itself, in order. Ignored, not
    blocked: Ray blocks SIGINT in the head's processes itself, and the demo's stop still hung
    with that alone (measured: test_demo's Ctrl-C waited out its 150 s)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers, and only it gets Ctrl-C anyway
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


_exiting = threading.Event()


def adopt_orphans() -> None:
    """Make this process its descendants' reaper (Linux's PR_SET_CHILD_SUBREAPER): a process whose
    parent dies under it (a Ray dashboard's forkserver as Ray's shutdown kills the dashboard, a
    worker the raylet started as the head went down) stays this command's descendant, so its stop
    finds it. Elsewhere than Linux, or refused: the stop sees less, nothing fails."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _kill_children() -> None:
    """SIGKILL every descendant, pass after pass until none is left: one killed in a pass leaves
    its own children to us (adopt_orphans), and they are the next pass's."""
    import psutil

    for _ in range(5):
        children = psutil.Process().children(recursive=True)
        if not children:
            return
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(children, timeout=0.5)  # reaps our own children; the rest die with theirs


def _reap_if_stopped(read_fd: int) -> None:
    """The last thing at exit (registered before Ray's hooks, so run after them): after a stop
    signal, kill what is left of the command's descendants. Ray's driver takes SIGTERM over during
    `ray.init`, so a SIGTERM while the local head starts exits through Ray's SystemExit, possibly
    before the watcher thread has set the exit clock; Ray's shutdown then stops its head's
    processes but not what they had just started (a fresh-clone CI run of test_signals: the
    dashboard's multiprocessing forkserver and resource tracker outlived the command)."""
    # The watcher may have just read the signal and not yet set the clock: give it a moment.
    if not _exiting.wait(0.05):
        try:
            os.set_blocking(read_fd, False)
            pending = os.read(read_fd, 64)
        except OSError:
            pending = b""
        if not any(number in (signal.SIGINT, signal.SIGTERM) for number in pending):
            return
    _kill_children()


def exit_within(seconds: float, code: int) -> None:
    """After Ctrl-C or SIGTERM: the command unwinds, and whatever still runs `seconds` later is
    killed with its children (os._exit), so no command outlives its user's patience; once it has
    unwound, it exits at once the same way, its children with it (a local Ray head half-started
    when the signal came left its agents behind)."""
    if _exiting.is_set():
        return
    _exiting.set()

    def force() -> None:
        _kill_children()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    # At exit, registered last so run first: Ray's own shutdown hook, with its head half-dead, held
    # the GIL in a 5-s RPC timeout, and the clock's thread could not run until it ended (measured).
    atexit.register(force)

    timer = threading.Timer(seconds, force)
    timer.daemon = True  # runs on through the interpreter's exit, where Ray's shutdown hook waits
    timer.start()


def stop_on_signals(seconds: float) -> None:
    """Ctrl-C and SIGTERM both unwind the command as KeyboardInterrupt, and start the clock on its
    exit at once, from a thread of its own: Python runs a signal handler only between bytecodes of
    the main thread, and a main thread inside Ray's start-up (C++) did not get back to one for 30 s
    and more. Python's C-level handler writes each signal's number to the wake-up fd as it comes,
    whatever the main thread does (and goes on doing so after Ray's driver sets its own SIGTERM
    handler, a SystemExit(15))."""
    def handler(signum, _frame) -> None:
        exit_within(seconds, 128 + signum)  # here too: a library's event loop may take the wake-up fd over
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    adopt_orphans()
    atexit.register(_reap_if_stopped, read)

    def watch() -> None:
        while (number := os.read(read, 1)[0]) not in (signal.SIGINT, signal.SIGTERM):
            continue  # another signal with a Python handler (Ray's): not a stop
        exit_within(seconds, 128 + number)

    threading.Thread(target=watch, name="stop-on-signal", daemon=True).start()
