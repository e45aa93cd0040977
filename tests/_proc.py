"""Processes for the runtime's supervision tests, from /proc (Linux): a ``shoal`` command in a
process of its own, the processes below it, and one rank of a ``shoal train`` run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


def shoal(*args, env: dict | None = None, **kwargs) -> subprocess.Popen:
    """``python -m shoal ARGS`` from the source tree these tests import."""
    import shoal.cli

    src = str(Path(shoal.cli.__file__).resolve().parents[2])
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "shoal", *map(str, args)], env=env, **kwargs)


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            children.setdefault(int(st[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie (an ended process its new parent has not reaped yet)."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def rank_pid(mark: str, rank: int) -> int | None:
    """The process id of rank ``rank`` of the ``shoal train`` run whose environment holds the
    ``mark`` (``NAME=value``)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if mark.encode() in env and f"RANK={rank}".encode() in env \
                and b"shoal.runtime.entry" in cmd:
            return int(d)
    return None


def left_after(pids, seconds: float) -> list[int]:
    """Which of ``pids`` still run ``seconds`` after now (returns as soon as none does)."""
    import time

    deadline = time.monotonic() + seconds
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def kill_all(pids) -> None:
    """SIGKILL each of ``pids`` still running (what a test started and left)."""
    for p in pids:
        if running(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
