"""Availability traces: at each moment, how many GPUs of each type each zone of the pool has.

A trace is what a replay follows: every state is a pool that can be planned on its own, so every
state covers exactly the (GPU type, zone) pairs of the scenario's pool. Traces are read from files
(``shoal.io.traces.load_trace``) or generated from a seed (``synthetic``); either way their states
come from events (``Event``, ``apply_events``, ``merged``).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from shoal.errors import SpecError, close_match
from shoal.problem import Problem

Pair = tuple[str, str]  # (canonical GPU name, zone)

# How long the last state lasts when the file cannot tell: a trace of a single row (or of events at
# a single time) gives no gap to go by, and an hour is long enough for any plan to pay back a move.
DEFAULT_LAST_S = 3600.0

SYNTHETIC_KINDS = ("spot", "scarcity", "outage")

# Defaults of the synthetic generators; each can be overridden by name through ``synthetic``.
_SYNTHETIC_PARAMS: dict[str, dict[str, float]] = {
    # GCP spot VMs: preemptions with 30 s of warning; capacity comes back after a while.
    "spot": {"mean_gap_s": 1800.0, "mean_return_s": 2700.0, "notice_s": 30.0},
    # On-demand scarcity as in Sailor's Fig. 2: the count drifts by a few nodes at a time.
    "scarcity": {"mean_step_s": 1200.0, "max_step_nodes": 3},
    # A zone losing every GPU type at once, then getting them back.
    "outage": {"mean_gap_s": 3 * 3600.0, "mean_outage_s": 2400.0},
}


@dataclass(frozen=True)
class State:
    """The pool from ``time_s`` until the next state starts.

    ``notice_s`` is the warning given before the GPUs that leave at this moment go (a spot
    preemption notice): time in which the old plan can still save a checkpoint.
    """

    time_s: float
    avail: dict[Pair, int]  # every pair of the scenario's pool, in the pool's order
    notice_s: float = 0.0


@dataclass(frozen=True)
class Trace:
    """States sorted by time, strictly increasing, each differing from the one before."""

    states: tuple[State, ...]
    end_s: float  # when the last state ends
    source: str  # file path or "synthetic:<kind>:seed=<n>"

    def durations(self) -> list[float]:
        ends = [s.time_s for s in self.states[1:]] + [self.end_s]
        return [end - s.time_s for s, end in zip(self.states, ends)]

    def to_json(self) -> dict:
        return {"source": self.source, "end_s": self.end_s, "states": [
            {"time_s": s.time_s, "notice_s": s.notice_s,
             "avail": {f"{g}@{z}": n for (g, z), n in s.avail.items()}}
            for s in self.states]}


@dataclass(frozen=True)
class Event:
    """From ``time_s`` on, ``pair`` has ``count`` GPUs; ``at`` locates it in its file."""

    time_s: float
    pair: Pair
    count: int
    notice_s: float = 0.0
    at: str = ""


# --------------------------------------------------------------------------------- events to states


def apply_events(problem: Problem, events: Iterable[Event]) -> list[State]:
    """States from events sorted by time (unchecked: the file readers check the order, the
    generators make them sorted)."""
    groups: dict[float, list[Event]] = {}
    for ev in events:
        groups.setdefault(ev.time_s, []).append(ev)
    avail = dict(problem.avail)
    states = [] if 0.0 in groups else [State(0.0, dict(avail))]
    for t, group in groups.items():
        before = dict(avail)
        for ev in group:
            avail[ev.pair] = ev.count
        # the warning is for the GPUs that leave: the shortest of theirs (none leave: none)
        notices = [ev.notice_s for ev in group if avail[ev.pair] < before[ev.pair]]
        states.append(State(t, dict(avail), min(notices, default=0.0)))
    return states


def merged(states: list[State]) -> tuple[State, ...]:
    """Drop states equal to the one before: a row that changes nothing is no new state (its
    notice is for GPUs that do not leave)."""
    kept: list[State] = []
    for st in states:
        if kept and st.avail == kept[-1].avail:
            continue
        kept.append(st)
    return tuple(kept)


def last_gap(times: list[float]) -> float:
    """How long the last of these times lasts: the median gap between them, which a trace with
    regular sampling continues, and which one odd interval does not skew."""
    if len(times) < 2:
        return DEFAULT_LAST_S
    return statistics.median(b - a for a, b in zip(times, times[1:]))


@dataclass(frozen=True)
class OverPool:
    """A (GPU type, zone) of the pool for which a trace gives more GPUs than the scenario's
    pool has: at most ``trace_count``, first at ``time_s``."""

    gpu: str
    zone: str
    trace_count: int
    pool_count: int
    time_s: float
    quota: int | None  # the scenario's pool.quotas cap on this GPU type, if any

    def message(self) -> str:
        cap = (f"; pool.quotas still caps {self.gpu} at {self.quota} in all"
               if self.quota is not None else "")
        return (f"the trace gives {self.trace_count} {self.gpu} in {self.zone} (first at "
                f"{self.time_s:g} s) where the scenario's pool has {self.pool_count}: shoal "
                f"plans those states with the trace's {self.trace_count} (a trace sets "
                f"availability){cap}")


def over_pool(problem: Problem, trace: Trace) -> list[OverPool]:
    """The pairs of the pool for which the trace gives more GPUs than the pool has, in the
    pool's order: each with the trace's largest count and when it first reaches it. A replay
    plans every state with the trace's counts (``Replanner.plan``), so these plans may use
    GPUs the scenario's pool never listed."""
    out = []
    for pair, have in problem.avail.items():
        most = max(trace.states, key=lambda st: st.avail.get(pair, 0))
        n = most.avail.get(pair, 0)
        if n > have:
            out.append(OverPool(pair[0], pair[1], n, have, most.time_s,
                                problem.quotas.get(pair[0])))
    return out


# ---------------------------------------------------------------------------------------- synthetic


def synthetic(problem: Problem, kind: str, *, seed: int, duration_s: float = 8 * 3600,
              **params: float) -> Trace:
    """A generated trace, the same for the same seed, starting from the scenario's full pool.

    The scenario's counts are the capacity: a pair never has more, nor fewer than none.
    ``params`` override the kind's defaults (``_SYNTHETIC_PARAMS``). Event times are whole
    seconds, so changes within the same second make one state.
    """
    if kind not in SYNTHETIC_KINDS:
        raise SpecError("unknown kind of synthetic trace", field="--synthetic", value=kind,
                        allowed=", ".join(SYNTHETIC_KINDS),
                        suggestion=close_match(kind, SYNTHETIC_KINDS))
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError("the trace must last some time", field="duration_s", value=duration_s,
                        allowed="more than 0 seconds")
    defaults = _SYNTHETIC_PARAMS[kind]
    for name, value in params.items():
        if name not in defaults:
            raise SpecError(f"unknown parameter of a {kind} trace", field=name,
                            allowed=", ".join(defaults), suggestion=close_match(name, defaults))
        if not (math.isfinite(value) and value > 0):
            raise SpecError("must be more than 0", field=name, value=value)
    options = {**defaults, **params}
    rng = np.random.default_rng(seed)
    make = {"spot": _spot, "scarcity": _scarcity, "outage": _outage}[kind]
    events = make(problem, rng, float(duration_s), **options)
    events.sort(key=lambda ev: ev.time_s)  # stable: one pair's same-second changes stay in order
    return Trace(merged(apply_events(problem, events)), float(duration_s),
                 f"synthetic:{kind}:seed={seed}")


def _second(t: float) -> float:
    """Whole seconds, never 0: the trace starts from the full pool."""
    return float(max(1, math.ceil(t)))


def _node(problem: Problem, pair: Pair) -> int:
    """GPUs that come and go together: a VM, or the whole pair when it is smaller than one."""
    return max(1, min(problem.gpus[pair[0]].gpus_per_node, problem.avail[pair]))


def _spot(problem: Problem, rng: np.random.Generator, duration_s: float, *, mean_gap_s: float,
          mean_return_s: float, notice_s: float) -> list[Event]:
    """Per pair, preemptions as a Poisson process, each taking whole nodes of those still there;
    each preemption's GPUs come back together after an exponential delay."""
    events: list[Event] = []
    for pair in sorted(problem.avail):
        node = _node(problem, pair)
        have = problem.avail[pair]
        back: list[tuple[float, int]] = []  # (when, GPUs) of preempted GPUs yet to return
        preempt = rng.exponential(mean_gap_s)
        while True:
            now = min(preempt, back[0][0] if back else math.inf)
            t = _second(now)
            if t >= duration_s:
                break
            if back and back[0][0] == now:
                have += heapq.heappop(back)[1]
                events.append(Event(t, pair, have))
                continue
            nodes = math.ceil(have / node)
            if nodes:
                gone = min(have, int(rng.integers(1, nodes + 1)) * node)
                have -= gone
                events.append(Event(t, pair, have, notice_s))
                heapq.heappush(back, (now + rng.exponential(mean_return_s), gone))
            preempt = now + rng.exponential(mean_gap_s)
    return events


def scarcity_down_p(have: float, cap: float) -> float:
    """The chance that a scarcity step goes down from ``have`` of ``cap`` GPUs: the pull
    towards 5/8 of capacity, between 0.1 and 0.9."""
    return min(0.9, max(0.1, 0.5 + (have - 0.625 * cap) / max(cap, 1)))


def _scarcity(problem: Problem, rng: np.random.Generator, duration_s: float, *,
              mean_step_s: float, max_step_nodes: float) -> list[Event]:
    """Per pair, a random walk of a few nodes at a time, pulled towards 5/8 of capacity so that it
    stays mostly between a quarter and all of it."""
    events: list[Event] = []
    for pair in sorted(problem.avail):
        cap = problem.avail[pair]
        node = _node(problem, pair)
        have, now = cap, 0.0
        while True:
            now += rng.exponential(mean_step_s)
            t = _second(now)
            if t >= duration_s:
                break
            step = int(rng.integers(1, int(max_step_nodes) + 1)) * node
            down = rng.random() < scarcity_down_p(have, cap)
            new = min(cap, max(0, have - step if down else have + step))
            if new != have:
                have = new
                events.append(Event(t, pair, have))
    return events


def _outage(problem: Problem, rng: np.random.Generator, duration_s: float, *, mean_gap_s: float,
            mean_outage_s: float) -> list[Event]:
    """One zone at a time loses every GPU type, then gets its capacity back.

    The gap is counted from the end of the previous outage, so outages never overlap and a
    zone always returns to its full pool.
    """
    zones = sorted({z for _, z in problem.avail})
    events: list[Event] = []
    now = 0.0
    while zones:
        now += rng.exponential(mean_gap_s)
        start = _second(now)
        if start >= duration_s:
            break
        zone = zones[int(rng.integers(len(zones)))]
        now += rng.exponential(mean_outage_s)
        stop = _second(now)
        pairs = [p for p in sorted(problem.avail) if p[1] == zone]
        events += [Event(start, p, 0) for p in pairs]
        if stop >= duration_s:
            break
        events += [Event(stop, p, problem.avail[p]) for p in pairs]
    return events
