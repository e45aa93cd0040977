"""How long a node's batch takes: its per-layer times (``Clock``), what work reaching an idle
node pays (``woken``), and nodes that share a host's cores (``HostSharing``)."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from shoal.serving.simulator.events import BatchEnds, Item


class Clock:
    """Per-layer batch times of one node, as plain Python for the simulator's inner loop."""

    def __init__(self, times):
        self.t = times
        self.px = self.pt = self.dx = self.dt = None
        if times.prompt_x is not None:
            self.px, self.pt = list(map(float, times.prompt_x)), list(map(float, times.prompt_t))
            self.dx, self.dt = list(map(float, times.decode_x)), list(map(float, times.decode_t))

    @staticmethod
    def _at(x: float, xs: list[float], ts: list[float]) -> float:
        k = bisect.bisect_left(xs, x)
        if k == 0:
            return ts[0]
        if k >= len(xs):
            k = len(xs) - 1  # past the table: extend the last segment
        x0, x1 = xs[k - 1], xs[k]
        return ts[k - 1] + (ts[k] - ts[k - 1]) * (x - x0) / (x1 - x0) if x1 > x0 else ts[k]

    def layer_s(self, P: float, D: int, ctx: float) -> float:
        """One layer's time for ``P`` prompt tokens and ``D`` decode steps of mean context
        ``ctx``."""
        if self.px is None:
            return self.t.prompt_s(P) + self.t.decode_s(D, ctx)
        return ((self._at(P, self.px, self.pt) if P > 0 else 0.0)
                + (self._at(D, self.dx, self.dt) if D > 0 else 0.0))


def woken(gap: float, gaps: list[float], extra: list[float]) -> float:
    """``extra`` (per idle time of ``gaps``, as a ``WakeSpec`` gives them) at an idle time of
    ``gap``: linear from none at 0, the last value beyond the last idle time."""
    if gap <= 0:
        return 0.0
    if gap >= gaps[-1]:
        return extra[-1]
    k = bisect.bisect_left(gaps, gap)
    g0, e0 = (gaps[k - 1], extra[k - 1]) if k else (0.0, 0.0)
    return e0 + (extra[k] - e0) * (gap - g0) / (gaps[k] - g0)


class HostSharing:
    """Nodes sharing a host's cores: each of the k nodes of one host computing at once
    progresses at ``speed(k)`` of its own speed (processor sharing; the measured
    ``host_share`` or min(1, cores / k), ``Cluster.sharing``); nodes on other hosts (their
    ``host``; none: the coordinator's machine) do not count. A batch's end is moved whenever k
    changes: each move is a new ``BatchEnds`` of the node's next version, and only the current
    version's end counts. ``busy_s``: the nodes' busy seconds in the window [``warmup_s``,
    ``end_s``], added to as batches progress."""

    __slots__ = ("speed", "host_of", "running", "computing", "version", "since", "busy_s",
                 "warmup_s", "end_s")

    def __init__(self, speed: Callable[[int], float], host_of: tuple, busy_s: list[float],
                 warmup_s: float, end_s: float) -> None:
        self.speed, self.host_of, self.busy_s = speed, host_of, busy_s
        self.warmup_s, self.end_s = warmup_s, end_s
        self.running: dict[int, list] = {}  # node -> [its own seconds of work left, the batch]
        self.computing: dict = {}  # host -> its nodes computing now
        self.version = [0] * len(host_of)
        self.since = 0.0

    def advance(self, t: float) -> None:
        """Advance the running batches to ``t`` at the current rates."""
        if self.running:
            lo, hi = max(self.since, self.warmup_s), min(t, self.end_s)
            for u, job in self.running.items():
                job[0] -= (t - self.since) * self.speed(self.computing[self.host_of[u]])
                if hi > lo:
                    self.busy_s[u] += hi - lo
        self.since = t

    def reschedule(self, t: float) -> list[BatchEnds]:
        """The running batches' ends at the current rates (new versions)."""
        out = []
        version, computing, host_of, speed = (self.version, self.computing, self.host_of,
                                              self.speed)
        for u, (left, take) in self.running.items():
            version[u] += 1
            rate = speed(computing[host_of[u]])
            out.append(BatchEnds(t + max(left, 0.0) / rate, u, take, version[u]))
        return out

    def start(self, v: int, t: float, work_s: float, take: tuple[Item, ...]) -> list[BatchEnds]:
        """Node ``v`` starts ``work_s`` of its own seconds on ``take`` at ``t``."""
        self.advance(t)
        self.running[v] = [work_s, take]
        h = self.host_of[v]
        self.computing[h] = self.computing.get(h, 0) + 1
        return self.reschedule(t)

    def end(self, ev: BatchEnds) -> bool:
        """Whether ``ev`` is the current end of its node's batch; if so, the batch is done."""
        v = ev.node
        if ev.version != self.version[v]:
            return False  # moved since: the sharing changed
        self.advance(ev.time_s)
        del self.running[v]
        self.computing[self.host_of[v]] -= 1
        return True
