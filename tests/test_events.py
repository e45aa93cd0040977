"""The event-simulation core: ordering of ties, determinism, handlers that return several events,
stop conditions, and the errors it raises; and the pipeline operations simulated on it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.estimate import operations
from shoal.estimate.events import Event, EventLoop, run


@dataclass(frozen=True, slots=True)
class Arrive(Event):
    who: int


@dataclass(frozen=True, slots=True)
class Step(Event):
    who: int


@dataclass(frozen=True, slots=True)
class Timeout(Event):
    who: int


def recorder(seen: list, then=None):
    """A handler that records (kind, time, who) and returns ``then(event)`` (default: nothing)."""
    def handle(ev):
        seen.append((type(ev).__name__, ev.time_s, ev.who))
        return then(ev) if then else None
    return handle


def test_ties_go_by_kind_order_then_by_scheduling_order():
    seen: list = []
    h = recorder(seen)
    loop = EventLoop({Step: h, Arrive: h, Timeout: h})
    loop.schedule([Timeout(1.0, 0), Arrive(1.0, 1), Step(1.0, 2), Arrive(1.0, 3), Step(0.5, 4),
                   Step(1.0, 5)])
    assert loop.run() == 6
    assert seen == [("Step", 0.5, 4), ("Step", 1.0, 2), ("Step", 1.0, 5), ("Arrive", 1.0, 1),
                    ("Arrive", 1.0, 3), ("Timeout", 1.0, 0)]
    assert loop.now_s == 1.0 and len(loop) == 0


def test_kinds_grouped_in_the_order_tie_first_come_first_served():
    seen: list = []
    h = recorder(seen)
    loop = EventLoop({Step: h, Arrive: h, Timeout: h}, order=[Timeout, (Arrive, Step)])
    loop.schedule([Step(1.0, 0), Arrive(1.0, 1), Timeout(1.0, 2), Step(1.0, 3)])
    loop.run()
    assert [w for _, _, w in seen] == [2, 0, 1, 3]


def test_events_a_handler_returns_are_all_scheduled_in_the_order_returned():
    seen: list = []

    def fan_out(ev):
        if ev.who == 0:  # three events at the same time as this one, and one later
            return [Step(ev.time_s, 3), Step(ev.time_s, 1), Step(ev.time_s + 1.0, 4),
                    Step(ev.time_s, 2)]
        return []

    loop = EventLoop({Step: recorder(seen, fan_out)})
    loop.schedule([Step(2.0, 0)])
    assert loop.run() == 5
    assert seen == [("Step", 2.0, 0), ("Step", 2.0, 3), ("Step", 2.0, 1), ("Step", 2.0, 2),
                    ("Step", 3.0, 4)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([Arrive, Step, Timeout])),
                min_size=1, max_size=40),
       st.integers(0, 3))
def test_order_is_time_then_kind_then_sequence_and_the_same_every_run(items, fanout):
    """Any mix of times and kinds, with handlers scheduling more events: every run handles the
    same events in the same order, and that order is sorted by (time, kind rank, sequence)."""
    rank = {Step: 0, Arrive: 1, Timeout: 2}

    def simulate():
        seen, seq = [], {}
        counter = iter(range(10**6))

        def then(ev):
            if ev.time_s >= 6 or ev.who % 4 >= fanout:
                return []
            new = [type(ev)(ev.time_s, ev.who + 1), type(ev)(ev.time_s + 1.0, ev.who + 4)]
            for e in new:
                seq[id(e)] = next(counter)
            return new

        h = recorder(seen, then)
        loop = EventLoop({Step: h, Arrive: h, Timeout: h}, trace=lambda e: seen.append(
            (rank[type(e)], seq[id(e)])))
        first = [kind(float(t), i) for i, (t, kind) in enumerate(items)]
        for e in first:
            seq[id(e)] = next(counter)
        loop.schedule(first)
        loop.run()
        return seen

    a, b = simulate(), simulate()
    assert a == b
    keys = [(t, r, q) for (r, q), (_, t, _) in zip(a[::2], a[1::2], strict=True)]
    assert keys == sorted(keys)


def test_until_leaves_later_events_queued_and_a_later_run_resumes():
    seen: list = []
    loop = EventLoop({Arrive: recorder(seen, lambda ev: [Arrive(ev.time_s + 1.0, ev.who)]
                                       if ev.time_s < 5 else [])})
    loop.schedule([Arrive(0.0, 7)])
    assert loop.run(until_s=2.5) == 3
    assert [t for _, t, _ in seen] == [0.0, 1.0, 2.0]
    assert loop.peek_s() == 3.0 and len(loop) == 1 and loop.now_s == 2.0
    assert loop.run() == 3 and loop.handled == 6
    assert loop.peek_s() == float("inf")


def test_stop_predicate_and_event_budget():
    seen: list = []
    again = recorder(seen, lambda ev: [Step(ev.time_s + 0.25, ev.who + 1)])
    loop = EventLoop({Step: again})
    loop.schedule([Step(0.0, 0)])
    assert loop.run(stop=lambda ev: ev.who == 3) == 4
    assert seen[-1] == ("Step", 0.75, 3) and len(loop) == 1  # the event it returned is queued
    assert loop.run(max_events=2) == 2
    assert seen[-1] == ("Step", 1.25, 5)


def test_a_timeout_is_an_event_whose_handler_checks_its_subject():
    """The pattern the serving simulator needs: a request's timeout stays on the heap and is
    ignored if the request was served first."""
    waiting = {1, 2}
    log: list = []

    def arrive(ev):
        return [Timeout(ev.time_s + 1.0, ev.who), Step(ev.time_s + 0.5 * ev.who, ev.who)]

    def step(ev):
        if ev.who in waiting:
            waiting.discard(ev.who)
            log.append(("served", ev.who, ev.time_s))
        return None

    def timeout(ev):
        if ev.who in waiting:
            waiting.discard(ev.who)
            log.append(("timed out", ev.who, ev.time_s))
        return None

    loop = run({Arrive: arrive, Step: step, Timeout: timeout}, [Arrive(0.0, 1), Arrive(0.0, 3)])
    assert log == [("served", 1, 0.5)]
    waiting.add(3)
    loop = run({Arrive: arrive, Step: step, Timeout: timeout}, [Arrive(0.0, 3)])
    assert log[-1] == ("timed out", 3, 1.0) and loop.now_s == 1.5


def test_errors_name_the_fault():
    loop = EventLoop({Step: lambda ev: [Step(ev.time_s - 1.0, 0)]})
    loop.schedule([Step(2.0, 0)])
    with pytest.raises(ValueError, match="not at or after the simulation's time 2.0"):
        loop.run()
    with pytest.raises(ValueError, match="no handler for Arrive; this loop handles Step"):
        EventLoop({Step: lambda ev: None}).schedule([Arrive(0.0, 0)])
    with pytest.raises(ValueError, match="not at or after"):
        EventLoop({Step: lambda ev: None}).schedule([Step(float("nan"), 0)])
    with pytest.raises(ValueError, match="missing: Timeout"):
        EventLoop({Step: lambda ev: None, Timeout: lambda ev: None}, order=[Step])
    with pytest.raises(ValueError, match="appears twice"):
        EventLoop({Step: lambda ev: None}, order=[Step, (Step,)])
    with pytest.raises(ValueError, match="without a handler: Arrive"):
        EventLoop({Step: lambda ev: None}, order=[Step, Arrive])


def test_an_event_is_frozen_and_writes_itself_as_a_record():
    ev = Arrive(1.5, 4)
    with pytest.raises(AttributeError):
        ev.time_s = 2.0  # type: ignore[misc]
    assert ev.to_dict() == {"kind": "Arrive", "time_s": 1.5, "who": 4}


def test_operations_follow_their_orders_and_dependencies():
    """Two stages, the second with two replicas sharing the microbatches: each operation
    starts when its worker is free and its input is there."""
    owners = np.array([[0, 0, 0], [0, 1, 0]])
    orders = [[(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)],  # GPipe on both stages
              [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]]
    fwd = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    trace: operations.Trace = []
    g = operations.graph(orders, owners, [1, 2], fwd, 2 * fwd)
    ends = operations.simulate(g, trace)
    when = {(s, j, bk, i): (t0, t1) for s, j, bk, i, t0, t1 in trace}
    assert len(trace) == 12
    # stage 1 replica 0 runs microbatches 0 and 2; replica 1 runs microbatch 1
    assert when[(1, 0, 0, 0)] == (1.0, 3.0) and when[(1, 1, 0, 1)] == (2.0, 4.0)
    assert when[(1, 0, 0, 2)] == (3.0, 5.0)
    assert when[(1, 0, 1, 0)] == (5.0, 9.0)  # after its own forwards (GPipe)
    assert when[(0, 0, 1, 0)] == (9.0, 11.0)  # waits for stage 1's backward of 0
    assert ends == [15.0, 13.0, 8.0]
    assert when[(0, 0, 1, 2)][1] == 15.0


def test_operations_whose_order_waits_on_itself_deadlock():
    g = operations.graph([[(1, 0), (0, 0)]], np.array([[0]]), [1], np.ones((1, 1)),
                         np.ones((1, 1)))
    with pytest.raises(RuntimeError, match="deadlocked"):
        operations.simulate(g)
