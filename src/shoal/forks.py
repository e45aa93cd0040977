"""Copies of this process (``os.fork``) that compute alongside it: the compiled loops' helper
(``shoal.jit``) and the throughput-cost front's searches (``training.planners.Alongside``).
A copy has this process's modules and data loaded already, where a new interpreter spends most
of a second starting. Only on Linux, and only while one thread runs (macOS's system libraries
are not safe to use in a forked copy, Windows has no fork, and a lock another thread holds at
the fork stays held in the copy). A copy ignores Ctrl-C (the process that started it ends it),
writes nowhere but the files it is given, and ends when that process ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable


def can_fork() -> bool:
    """Whether this process may start a copy: on Linux, with no other thread running."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def spare_core() -> bool:
    """Whether this process may run on more than one core (a copy then runs at once)."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) > 1


class Forked:
    """A copy of this process, with what callers use of a ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, run: Callable[[], None], *, name: bytes, keep: tuple[int, ...] = ()
              ) -> Forked:
        """Fork a copy that runs ``run`` and exits (0, or 1 when ``run`` raised), its name
        ``name`` in ps and top, with no file descriptor of this process open but ``keep``
        (standard input and output are /dev/null). Call only when ``can_fork``."""
        pid = os.fork()
        if pid:
            return cls(pid)
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends it on Ctrl-C
            prctl(15, name)  # PR_SET_NAME
            prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: gone with the parent
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            start = 3
            for fd in sorted(k for k in keep if k >= 3):
                os.closerange(start, fd)
                start = fd + 1
            os.closerange(start, _open_fd_limit())
            run()
            code = 0
        finally:
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere, or not this process's child
                if not alive(self.pid):
                    self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie not yet reaped counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_fd_limit() -> int:
    """One more than the highest file descriptor this process has open."""
    try:
        return 1 + max(int(n) for n in os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return 1024


def prctl(option: int, value: int | bytes) -> None:
    """Linux's prctl for this process; nothing elsewhere, or where libc does not have it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None).prctl(option, value)
