"""Pipeline stages' forwards and backwards on their workers, simulated on the event core
(``shoal.estimate.events``).

Worker (s, j) is replica j of stage s. Stage s runs its operations, (is_backward, microbatch)
pairs, in one order (its 1F1B or GPipe order); the replica that owns microbatch i there
(``owners``) runs its operations, in that order, one at a time. An operation starts when its
worker is free and the operation it waits for has ended: a forward of microbatch i waits for the
forward of i on the previous stage (none on the first); a backward for the backward of i on the
next stage (the last stage's, for its own forward of i). Stages of different replica counts and
shares thus hand microbatches to each other; with the same owners on every stage they form
pipelines.

One event kind: an operation ends. Its handler records the end, frees the worker and starts
whatever that made ready: the worker's next operation and the operation of the neighbouring
stage that waited for this one. A start time is the later of the worker's free time and the
awaited end, so the times do not depend on the order in which ties are handled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shoal.estimate.events import Event, EventLoop

# (stage, replica, is_backward, microbatch, start_s, end_s) of every operation, as it ends
Trace = list[tuple[int, int, int, int, float, float]]


@dataclass(frozen=True, slots=True)
class OperationEnds(Event):
    """The operation that worker ``worker`` (an index over every stage's replicas in turn) was
    running ends."""

    worker: int


@dataclass(frozen=True)
class Graph:
    """The operations of one iteration, numbered ``(2 s + is_backward) M + i`` for stage s and
    microbatch i of M. Per operation: its seconds, the operation it waits for (-1: none) and the
    worker whose operation waits for it on a neighbouring stage (-1: none). Per worker: its
    operations in order, and its (stage, replica)."""

    M: int
    seconds: list[float]
    awaits: list[int]
    waiter: list[int]
    ops: list[list[int]]
    where: list[tuple[int, int]]


def graph(orders: Sequence[Sequence[tuple[int, int]]], owners: np.ndarray, replicas: Sequence[int],
          fwd_s: np.ndarray, bwd_s: np.ndarray) -> Graph:
    """The ``Graph`` of stages whose orders are ``orders[s]`` ((is_backward, microbatch) pairs
    over all M microbatches), ``owners[s, i]`` the replica of stage s (of ``replicas[s]``) that
    runs microbatch i, ``fwd_s[s, i]``/``bwd_s[s, i]`` the seconds of its forward/backward."""
    S, M = owners.shape
    first = np.concatenate([[0], np.cumsum(replicas)])  # each stage's first worker
    s_ = np.arange(S)[:, None]
    i_ = np.arange(M)[None, :]
    awaits = np.empty((S, 2, M), dtype=np.int64)
    awaits[:, 0] = np.where(s_ > 0, (2 * s_ - 2) * M + i_, -1)
    awaits[:, 1] = np.where(s_ + 1 < S, (2 * s_ + 3) * M + i_, 2 * s_ * M + i_)
    waiter = np.full((S, 2, M), -1, dtype=np.int64)
    waiter[:-1, 0] = first[1:S, None] + owners[1:]
    waiter[1:, 1] = first[:S - 1, None] + owners[:-1]
    ops: list[list[int]] = []
    for s in range(S):
        mine: list[list[int]] = [[] for _ in range(replicas[s])]  # each replica's part, in order
        who = owners[s].tolist()
        base = 2 * s * M
        for bk, i in orders[s]:
            mine[who[i]].append(base + bk * M + i)
        ops += mine
    return Graph(M=M, seconds=np.stack([fwd_s, bwd_s], axis=1).ravel().tolist(),
                 awaits=awaits.ravel().tolist(), waiter=waiter.ravel().tolist(), ops=ops,
                 where=[(s, j) for s in range(S) for j in range(replicas[s])])


def simulate(g: Graph, trace: Trace | None = None) -> list[float]:
    """Per worker, when its last operation ends (0 for a worker without any). ``trace``: a list
    to which every operation is appended as (stage, replica, is_backward, microbatch, start_s,
    end_s) when it ends. Raises RuntimeError if an operation's input never arrives (cyclic
    orders)."""
    seconds, awaits, waiter, ops, M = g.seconds, g.awaits, g.waiter, g.ops, g.M
    n = len(ops)
    pos, free_s, start_s, running = [0] * n, [0.0] * n, [0.0] * n, [False] * n
    end_s: list[float | None] = [None] * len(seconds)

    def start(w: int) -> OperationEnds | None:
        """Worker w's next operation, if the worker is free and the operation's input is
        there: started now, its end returned."""
        mine = ops[w]
        if running[w] or pos[w] == len(mine):
            return None
        k = mine[pos[w]]
        t = free_s[w]
        if awaits[k] >= 0:
            ready = end_s[awaits[k]]
            if ready is None:
                return None
            if ready > t:
                t = ready
        running[w] = True
        start_s[w] = t
        return OperationEnds(t + seconds[k], w)

    def ends(ev: OperationEnds) -> list[OperationEnds]:
        """Handler: the operation ended; start the worker's next one and the one that waited
        for it on the neighbouring stage."""
        w = ev.worker
        k = ops[w][pos[w]]
        end_s[k] = free_s[w] = ev.time_s
        pos[w] += 1
        running[w] = False
        if trace is not None:
            s2, i = divmod(k, M)
            trace.append((*g.where[w], s2 % 2, i, start_s[w], ev.time_s))
        out = []
        e = start(w)
        if e is not None:
            out.append(e)
        v = waiter[k]
        if v >= 0 and not running[v]:
            e = start(v)
            if e is not None:
                out.append(e)
        return out

    loop = EventLoop({OperationEnds: ends})
    loop.schedule(e for e in map(start, range(n)) if e is not None)
    loop.run()
    if any(p < len(o) for p, o in zip(pos, ops, strict=True)):
        raise RuntimeError("the schedule deadlocked: some operation's input never arrived")
    return free_s
