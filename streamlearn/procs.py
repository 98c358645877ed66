"""Stopping processes this project started: by pid (the one way broker and Prometheus go),
and on Ctrl-C or SIGTERM, within seconds."""

from __future__ import annotations

import atexit
import itertools
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


def terminate_all(pids: list[int], alive: Callable[[int], bool], timeout_s: float,
                  hopeless: Callable[[int, list[int]], bool] | None = None) -> list[int]:
    """`terminate` for processes that must go down together: all are signalled before any is
    waited for. The last broker of a KRaft quorum stopped one at a time has no quorum to hand
    its leadership over to, and hung until its SIGKILL (30 s for a 3-broker cluster, measured;
    signalled together, the three were gone in 6 s). `hopeless(pid, running)`, asked while
    `pid` runs (with every pid still running), says it can no longer stop by itself: it gets its
    SIGKILL then, not at the timeout. Returns the pids that needed SIGKILL."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline, killed = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        running = [pid for pid in pids if pid not in killed and alive(pid)]
        if not running:
            return killed
        for pid in running:
            if hopeless is not None and hopeless(pid, running):
                _signal(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.1)
    hung = [pid for pid in pids if pid not in killed and alive(pid)]
    for pid in hung:
        _signal(pid, signal.SIGKILL)
    return killed + hung


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
# The watchdog's SIGKILL comes this long after the exit clock's own deadline (issue 47's bar is 5 s).
WATCHDOG_MARGIN_S = 1.0


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
        children = [c for c in psutil.Process().children(recursive=True) if not _zombie(c)]
        if not children:
            return
        _sigkill(children)
        psutil.wait_procs(children, timeout=0.5)  # reaps our own children; the rest die with theirs


def _zombie(proc) -> bool:
    """Dead already, waiting for its parent to read its status: nothing left to kill. Waiting on
    another process's zombie took each pass's whole 0.5 s, up to five passes."""
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True  # gone


def _sigkill(procs) -> None:
    """SIGKILL each of `procs` (psutil processes); one gone already is where it was sent."""
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass


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
    woken, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    read = _start_watchdog(woken, seconds + WATCHDOG_MARGIN_S)
    adopt_orphans()
    atexit.register(_reap_if_stopped, read)

    def watch() -> None:
        while (got := os.read(read, 1)) and got[0] not in (signal.SIGINT, signal.SIGTERM):
            continue  # another signal with a Python handler (Ray's): not a stop
        if got:  # else the watchdog is gone: this process is being stopped already
            exit_within(seconds, 128 + got[0])

    threading.Thread(target=watch, name="stop-on-signal", daemon=True).start()


def _start_watchdog(woken: int, seconds: float) -> int:
    """Fork a watchdog that reads the signal numbers from `woken` (the wake-up fd's pipe) and hands
    each on through the pipe whose read end it returns; `seconds` after a stop signal, if this
    process still runs, it SIGKILLs it and its descendants. The exit clock is a thread of this
    process and needs the GIL: C code that holds it (Ray's start-up, a library loading) held the
    clock past its 3 s, and a fresh-clone CI run's SIGTERM 5 s into `train` took 6.7 s to stop.
    Another process needs no GIL of ours. Forked before any thread starts; it leaves when this
    process does. If the fork fails, the clock works alone, as before."""
    read, forward = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        return woken
    if pid:
        os.close(forward)
        os.close(woken)
        return read
    try:
        _watch_over(os.getppid(), woken, forward, seconds)
    finally:
        os._exit(0)


def _watch_over(parent: int, woken: int, forward: int, seconds: float) -> None:
    """The watchdog's loop (see `_start_watchdog`): a terminal's Ctrl-C reaches it too (the same
    process group), and it stops on its parent's signals only."""
    import select

    # Hold none of the command's files: a caller reading its output to the end (`$(streamlearn
    # status)`, subprocess.run) would wait for the watchdog too.
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)
    for low, high in itertools.pairwise(sorted((2, woken, forward, os.sysconf("SC_OPEN_MAX")))):
        os.closerange(low + 1, high)
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    deadline = None
    while os.getppid() == parent:  # reparented: the command has exited, and so does its watchdog
        wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
        if select.select([woken], [], [], wait)[0]:
            numbers = os.read(woken, 64)
            if not numbers:
                return
            os.write(forward, numbers)
            if deadline is None and any(n in (signal.SIGINT, signal.SIGTERM) for n in numbers):
                deadline = time.monotonic() + seconds
        if deadline is not None and time.monotonic() >= deadline:
            _kill_tree(parent)
            return


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every descendant of it but this process, found before any is killed (once
    it is dead its orphans go elsewhere)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [p for p in root.children(recursive=True) if p.pid != os.getpid()]
    except psutil.Error:
        return
    _sigkill([root, *tree])
