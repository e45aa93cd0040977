"""The discrete-event core every shoal simulator runs on: typed events on a heap, handlers that
return the events they cause.

An event is a frozen dataclass, one class per kind of happening, carrying its time (``time_s``)
and what it is about. A simulation gives the loop one handler per event kind; the loop pops the
earliest event, calls its kind's handler with it and schedules the events the handler returns
(vidur's simulator loop; style anchors §3). Handlers change the simulation's own state; the loop
knows nothing of it.

Ties are deterministic: the heap is keyed by (time, kind order, sequence number). The kind order
is the order in which the handlers are listed (or an explicit ``order``, in which a tuple of
kinds shares one rank so that those kinds are handled first come, first served), and the
sequence number counts the events this loop has scheduled, so two runs of the same simulation
handle the same events in the same order. The counter belongs to the loop, not to a class, so
simulations in one process do not disturb each other.

A run ends when no event is left, or earlier at a stop condition: a time (``until_s``: events
after it stay queued, so a later ``run`` resumes there), a predicate on the event just handled
(``stop``), or a number of events (``max_events``). A ``trace`` hook sees every event as it is
handled, before its handler.

Serving and training simulators share it: request arrivals and timeouts are events like any
other (a timeout's handler checks whether its subject still waits, so nothing is ever removed
from the heap); a node's batch step is an event that returns the next step; a message hop is an
event scheduled one latency later.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happens at ``time_s`` (seconds from the start of the simulation).
    Subclass it once per kind, as a frozen dataclass with the fields the handler needs."""

    time_s: float

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-ready record: its kind (class name) and fields."""
        return {"kind": type(self).__name__} | {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


Handler = Callable[[Any], Iterable[Event] | None]


class EventLoop:
    """A heap of events and the handlers of their kinds.

    ``handlers`` maps each event class to a function taking one event of that class and returning
    the events it causes (an iterable, or None for none). Exactly these classes may be scheduled;
    subclasses are not matched to their parent's handler. ``order``: the kinds from first to last
    handled at equal times, a tuple for kinds of equal rank (first scheduled, first handled);
    default: the order of ``handlers``. ``trace``: called with every event as it is handled.
    """

    __slots__ = ("_handlers", "_rank", "_heap", "_seq", "_trace", "now_s", "handled")

    def __init__(self, handlers: Mapping[type[Event], Handler], *,
                 order: Sequence[type[Event] | tuple[type[Event], ...]] | None = None,
                 trace: Callable[[Event], None] | None = None) -> None:
        self._handlers: dict[type[Event], Handler] = dict(handlers)
        self._rank = _ranks(list(self._handlers), order)
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()
        self._trace = trace
        self.now_s = 0.0
        self.handled = 0

    def __len__(self) -> int:
        """Events scheduled and not yet handled."""
        return len(self._heap)

    def peek_s(self) -> float:
        """Time of the next event (infinity when none is left)."""
        return self._heap[0][0] if self._heap else math.inf

    def schedule(self, events: Iterable[Event]) -> None:
        """Queue events; none may lie before the time already reached."""
        rank, heap, seq = self._rank, self._heap, self._seq
        for ev in events:
            if not ev.time_s >= self.now_s:  # also refuses NaN, which would break the heap
                raise ValueError(f"{type(ev).__name__} at {ev.time_s!r} s: not at or after the "
                                 f"simulation's time {self.now_s!r} s")
            try:
                heapq.heappush(heap, (ev.time_s, rank[type(ev)], next(seq), ev))
            except KeyError:
                raise ValueError(f"no handler for {type(ev).__name__}; this loop handles "
                                 + ", ".join(k.__name__ for k in self._handlers)) from None

    def run(self, *, until_s: float = math.inf, stop: Callable[[Event], bool] | None = None,
            max_events: int | None = None) -> int:
        """Handle events in order until none is left or a stop condition holds; return how
        many were handled. ``until_s``: handle none later than this (they stay queued).
        ``stop``: end after the event for which it returns True. ``max_events``: end after
        this many."""
        heap, handlers, trace, rank, seq = (self._heap, self._handlers, self._trace, self._rank,
                                            self._seq)
        pop, push = heapq.heappop, heapq.heappush
        left = math.inf if max_events is None else max_events
        n = 0
        while heap and n < left and heap[0][0] <= until_s:
            now_s, _, _, ev = pop(heap)
            self.now_s = now_s
            if trace is not None:
                trace(ev)
            new = handlers[type(ev)](ev)
            n += 1
            if new:
                for e in new:  # ``schedule`` inlined: this loop is every simulator's hot path
                    t, r = e.time_s, rank.get(type(e))
                    if r is None or not t >= now_s:
                        self.schedule((e,))  # raises the error that names the fault
                    push(heap, (t, r, next(seq), e))
            if stop is not None and stop(ev):
                break
        self.handled += n
        return n


def _ranks(kinds: list[type[Event]],
           order: Sequence[type[Event] | tuple[type[Event], ...]] | None) -> dict[type[Event], int]:
    """Rank of each event kind at equal times: its place in ``order`` (a tuple's kinds share
    one), or in ``kinds``; every handled kind exactly once."""
    if order is None:
        return {k: i for i, k in enumerate(kinds)}
    rank: dict[type[Event], int] = {}
    for i, group in enumerate(order):
        for k in group if isinstance(group, tuple) else (group,):
            if k in rank:
                raise ValueError(f"event kind {k.__name__} appears twice in the order")
            rank[k] = i
    if set(rank) != set(kinds):
        missing = sorted(k.__name__ for k in set(kinds) - set(rank))
        extra = sorted(k.__name__ for k in set(rank) - set(kinds))
        raise ValueError("the order must list exactly the handled event kinds"
                         + (f"; missing: {', '.join(missing)}" if missing else "")
                         + (f"; without a handler: {', '.join(extra)}" if extra else ""))
    return rank


def run(handlers: Mapping[type[Event], Handler], initial: Iterable[Event], *,
        order: Sequence[type[Event] | tuple[type[Event], ...]] | None = None,
        trace: Callable[[Event], None] | None = None) -> EventLoop:
    """One simulation to its end: a loop with ``handlers`` (and ``order``, ``trace``), the
    ``initial`` events scheduled, every event handled. Returns the loop (its ``now_s`` is the
    time of the last event)."""
    loop = EventLoop(handlers, order=order, trace=trace)
    loop.schedule(initial)
    loop.run()
    return loop
