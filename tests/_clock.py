"""Time limits for tests that run on a machine shared with other work.

A test's own CPU work is timed in CPU seconds (``cpu_s``), which other processes on the machine
do not inflate. A wait on other processes (workers starting, a server answering) is bounded by
``patience``: the seconds it takes on an idle machine, stretched by how busy the machine is
(its load per core, sampled when the wait starts) and by ``SHOAL_TEST_SLOWDOWN`` (default 1)
for machines known to be slow."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def slowdown() -> float:
    """How many times longer than on an idle machine a wait may take now."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        load = 1.0
    return max(1.0, load) * max(1.0, float(os.environ.get("SHOAL_TEST_SLOWDOWN", "1")))


def patience(seconds: float) -> float:
    """``seconds`` (enough on an idle machine) stretched by ``slowdown``."""
    return seconds * slowdown()


def cpu_s(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the CPU seconds this process spent on it (all its threads)."""
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0
