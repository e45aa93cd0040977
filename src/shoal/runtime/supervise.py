"""Keeping a run's processes on a leash: children that end when their parent ends, signals
passed on to the processes that must act on them, and which rank of a failed run failed first.

A process that starts workers (the elastic controller, ``shoal train`` through torchrun) may
itself be killed with SIGKILL, which it cannot catch: so each child asks the kernel to signal it
when its parent ends (``PR_SET_PDEATHSIG`` on Linux), and, where that does not exist, polls its
parent process id.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int, parent_pid: int) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (``parent_pid``) ends;
    False where the platform cannot (callers then poll ``parent_alive``). A parent that ended
    before the request was made gets the same signal sent at once."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
    return True


def parent_alive(parent_pid: int) -> bool:
    """Whether this process's parent is still ``parent_pid`` (an orphan is adopted by
    another)."""
    return os.getppid() == parent_pid


@contextlib.contextmanager
def signals_raise(make_error, signals=(signal.SIGTERM,)):
    """Inside the block, each of ``signals`` raises ``make_error(name)`` in the main thread
    (so the ``finally`` and ``except`` clauses that stop the workers run, as they do for
    Ctrl-C); the previous handlers are put back after it. Outside the main thread it does
    nothing (Python delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise make_error(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ------------------------------------------------------------- which rank of a run failed first

_PEER_MARKS = ("gloo", "Connection closed", "Connection reset", "Broken pipe", "NCCL")


def lost_a_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a communication failure (a peer went away, or did not answer in
    time): most often the consequence of another rank's failure, not a cause."""
    import torch.distributed as dist

    return isinstance(exc, getattr(dist, "DistError", ())) or (
        isinstance(exc, RuntimeError) and any(m in str(exc) for m in _PEER_MARKS))


class RankReport:
    """What one rank of a torchrun-launched run says about itself, in ``report_dir``:
    ``running`` from its start, then ``done``, ``failed`` (with the error, its time and
    whether it was a lost peer) or ``stopped`` (a signal from the launcher). A rank whose
    report still says ``running`` after the run ended was killed without a word (SIGKILL,
    the out-of-memory killer)."""

    def __init__(self, report_dir: str | Path, rank: int):
        self.path = Path(report_dir) / f"rank{rank}.json"
        self.rank = rank
        self._lock = threading.Lock()
        self._final = False
        self._write({"status": "running"})

    def _write(self, doc: dict) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"rank": self.rank, "pid": os.getpid(), "time": time.time(),
                                   **doc}))
        tmp.replace(self.path)

    def final(self, status: str, **fields) -> bool:
        """Record the rank's end once (the first of a failure and a stop signal wins)."""
        with self._lock:
            if self._final:
                return False
            self._final = True
            self._write({"status": status, **fields})
            return True

    def failed(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        self.final("failed", error=text, lost_peer=lost_a_peer(exc))

    def stop_on_signals(self) -> None:
        """End this process on SIGTERM or SIGINT, after recording that it was stopped: a
        thread waits for them (the main thread may be inside a blocking collective, where a
        Python signal handler would not run). Call before any other thread starts: threads
        inherit the signal mask."""
        sigs = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)

        def wait() -> None:
            got = signal.sigwait(sigs)
            self.final("stopped", signal=signal.Signals(got).name)
            os._exit(128 + got)

        threading.Thread(target=wait, daemon=True, name="stop-on-signal").start()


def first_failure(report_dir: str | Path) -> str | None:
    """Which rank failed first and why, from the ranks' reports (None when there are none):
    a rank that ended without a word (killed) or with an error of its own comes before ranks
    whose communication failed because a peer went away and ranks the launcher stopped."""
    reports = []
    for f in Path(report_dir).glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError):
            reports.append(json.loads(f.read_text()))
    if not reports:
        return None
    silent = sorted((r for r in reports if r.get("status") == "running"),
                    key=lambda r: r["rank"])
    failed = [r for r in reports if r.get("status") == "failed"]
    own = sorted((r for r in failed if not r.get("lost_peer")), key=lambda r: r["time"])
    peer = sorted((r for r in failed if r.get("lost_peer")), key=lambda r: r["time"])
    stopped = sorted((r for r in reports if r.get("status") == "stopped"), key=lambda r: r["time"])

    def what(r: dict) -> str:
        if r.get("status") == "running":
            return (f"ended without an error of its own (pid {r.get('pid')}: killed by a "
                    "signal, or by the out-of-memory killer)")
        if r.get("status") == "stopped":
            return f"stopped by {r.get('signal', 'a signal')} (the launcher ending the run)"
        return r.get("error", "an error")

    order = silent + own + peer + stopped
    if not order:
        return None
    text = f"rank {order[0]['rank']} failed first: {what(order[0])}"
    if order[1:]:
        text += "; after it: " + "; ".join(f"rank {r['rank']}: {what(r)}" for r in order[1:])
    return text


# ------------------------------------------------------------------ a launcher run under watch

def run_supervised(cmd: list[str], *, env: dict, on_line, grace_s: float = 60.0
                   ) -> tuple[int, str | None]:
    """Run ``cmd`` (a launcher such as ``shoal.runtime.torchrun``) in a session of its own,
    so that a Ctrl-C at the terminal reaches this process only; each of its stderr lines goes
    to ``on_line``. SIGINT and SIGTERM sent to this process are passed on to it (a second one
    kills it); on any way out of this function, an exception included, it is stopped (SIGTERM,
    then SIGKILL after ``grace_s``). It learns this process's id (``SHOAL_PARENT_PID``) to end
    with it if this process is killed. Returns its exit code and the name of the signal passed
    on (None if none)."""
    import subprocess

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**env, "SHOAL_PARENT_PID": str(os.getpid())},
                            start_new_session=True)
    got: list[str] = []

    def forward(signum, frame):
        got.append(signal.Signals(signum).name)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum if len(got) == 1 else signal.SIGKILL)

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for line in proc.stderr:
            on_line(line)
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stderr.close()
    return rc, (got[0] if got else None)
