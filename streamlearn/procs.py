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


def terminate(pid: int, alive: Callable[[int], bool], timeout_s: float) -> None:
    """SIGTERM (a clean shutdown flushes what the process holds), SIGKILL if it hangs.
    `alive` says whether `pid` is still the process we mean, not a reused pid."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


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


def _kill_children() -> None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


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

    def watch() -> None:
        while (number := os.read(read, 1)[0]) not in (signal.SIGINT, signal.SIGTERM):
            continue  # another signal with a Python handler (Ray's): not a stop
        exit_within(seconds, 128 + number)

    threading.Thread(target=watch, name="stop-on-signal", daemon=True).start()
