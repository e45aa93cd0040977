"""Pipeline schedule times: when each stage of each pipeline ends.

For a pipeline of S stages running m microbatches, with ``f[s]``/``b[s]`` the forward/backward
time of one microbatch on stage s (blocking sends and receives included), the schedule (1F1B or
GPipe) is computed exactly by a max-plus recurrence over its operations in a topological order,
run for all pipelines of the same shape at once (compiled, ``_recurrence``): an operation ends
at max(end of the previous operation on its stage, end of its input) + its duration. Beyond
``4 S`` microbatches the recurrence runs ``4 S`` and adds the steady-state period per further
microbatch (``max_s(f+b)`` for 1F1B, ``max_s f + max_s b`` for GPipe); on random stage times
(forward and backward drawn independently) that was never optimistic and at most 0.6%
pessimistic (``benchmarks/estimate_vs_simulation.py``). The recurrence is monotone in the stage
times, so a faster stage never makes the estimate slower. (The textbook
``(m-1) max_s t_s + sum_s t_s`` is exact only for identical stages: with unequal
backward/forward ratios it can be optimistic.)
"""

from __future__ import annotations

from functools import cache

import numpy as np

from shoal.jit import compiled

STEADY_AFTER = 4  # x stages: microbatches simulated before extrapolating at the steady period
LANES = 32  # pipelines the compiled recurrence runs at once (their ends stay in the cache)


def stage_order(schedule: str, n_stages: int, s: int, m: int) -> list[tuple[str, int]]:
    """The order in which stage ``s`` of ``n_stages`` runs forwards and backwards of m microbatches."""
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    warm = min(n_stages - s - 1, m)
    order = [("F", k) for k in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


@cache
def op_order(n_stages: int, m: int, schedule: str) -> np.ndarray:
    """A topological order of the operations, one row each: (stage, is_backward, microbatch,
    dependency code): each stage's operations in its order (``stage_order``), the stages taken
    in turn as far as their inputs are done.

    Dependency code: 0 none, 1 forward of the previous stage, 2 backward of the next stage,
    3 forward of the same stage (last stage's backward)."""
    orders = np.array([[(kind == "B", k) for kind, k in stage_order(schedule, n_stages, s, m)]
                       for s in range(n_stages)], dtype=np.int64).reshape(n_stages, 2 * m, 2)
    ops = np.empty((2 * n_stages * m, 4), dtype=np.int64)
    if _merge(orders, ops, np.empty((2, n_stages, m), np.bool_),
              np.empty(n_stages, np.int64)) < len(ops):
        raise RuntimeError("schedule has a cycle")
    ops.flags.writeable = False
    return ops


@compiled("i8[:, :, ::1], i8[:, ::1], b1[:, :, ::1], i8[::1]", hot=True)
def _merge(orders, ops, done, pos):
    """``op_order``'s merge of the stages' orders into ``ops``; returns the operations placed
    (fewer than all: a cycle). Scratch: ``done`` (backward?, stage, microbatch), ``pos`` per
    stage."""
    S, n_ops = orders.shape[0], orders.shape[1]
    done[:] = False
    pos[:] = 0
    placed = 0
    while placed < S * n_ops:
        progressed = False
        for s in range(S):
            while pos[s] < n_ops:
                bk, k = orders[s, pos[s], 0], orders[s, pos[s], 1]
                if not bk:
                    code = 1 if s > 0 else 0
                    ready = s == 0 or done[0, s - 1, k]
                elif s < S - 1:
                    code, ready = 2, done[1, s + 1, k]
                else:
                    code, ready = 3, done[0, s, k]
                if not ready:
                    break
                ops[placed, 0], ops[placed, 1], ops[placed, 2], ops[placed, 3] = s, bk, k, code
                done[bk, s, k] = True
                placed += 1
                pos[s] += 1
                progressed = True
        if not progressed:
            break
    return placed


def exact_ends(f: np.ndarray, b: np.ndarray, m: int, schedule: str) -> np.ndarray:
    """Exact end of each stage's last operation, for lanes ``f, b`` of shape (S, N) that all run
    m microbatches: a max-plus recurrence over the operations in topological order."""
    S, N = f.shape
    out = np.empty((S, N))
    _recurrence(op_order(S, m, schedule), np.ascontiguousarray(f, dtype=np.float64),
                np.ascontiguousarray(b, dtype=np.float64), m, out,
                np.empty((2, S, m, LANES)), np.empty((3, S, LANES)))
    return out


@compiled("ro(i8[:, ::1]), f8[:, ::1], f8[:, ::1], i8, f8[:, ::1], f8[:, :, :, ::1], "
          "f8[:, :, ::1]", hot=True)
def _recurrence(ops, f, b, m, out, ends, work):
    """``exact_ends``' recurrence: an operation starts at the later of its stage's last end and
    its input's end. Lanes run LANES at a time. Scratch: ``ends`` (backward?, stage,
    microbatch, lane) and ``work`` (3, stage, lane): each stage's last end so far, then its
    forward and backward."""
    S, N = f.shape
    free, dur = work[0], work[1:]
    for j0 in range(0, N, LANES):
        n = N - j0 if N - j0 < LANES else LANES
        for s in range(S):
            for j in range(n):
                free[s, j] = 0.0
                dur[0, s, j] = f[s, j0 + j]
                dur[1, s, j] = b[s, j0 + j]
        for i in range(ops.shape[0]):
            s, bk, k, code = ops[i, 0], ops[i, 1], ops[i, 2], ops[i, 3]
            if code == 0:
                for j in range(n):
                    e = free[s, j] + dur[bk, s, j]
                    ends[bk, s, k, j] = e
                    free[s, j] = e
            else:
                db, ds = (0, s - 1) if code == 1 else ((1, s + 1) if code == 2 else (0, s))
                for j in range(n):
                    e = free[s, j]
                    if ends[db, ds, k, j] > e:
                        e = ends[db, ds, k, j]
                    e += dur[bk, s, j]
                    ends[bk, s, k, j] = e
                    free[s, j] = e
        for s in range(S):
            for j in range(n):
                out[s, j0 + j] = free[s, j]


def schedule_times(f_all: np.ndarray, b_all: np.ndarray, m: np.ndarray, gpipe: np.ndarray,
                   n_stages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(makespan (B, R), end of each stage's last backward (B, S, R)) for every pipeline.

    ``f_all``, ``b_all``: (B, S, R), padded stages zero; ``m``: (B, R) microbatches;
    ``gpipe``: (B,) bool; ``n_stages``: (B,) real stage counts. Every pipeline is simulated for
    ``min(m, STEADY_AFTER * S)`` microbatches and extended at the steady-state period.
    """
    B, S, R = f_all.shape
    t = f_all + b_all
    period = np.where(gpipe[:, None], f_all.max(axis=1) + b_all.max(axis=1), t.max(axis=1))
    ends = np.zeros((B, S, R))
    live = m > 0
    bi, ri = np.nonzero(live)
    if len(bi):
        S_of = n_stages[bi].astype(np.int64)
        mm = m[bi, ri].astype(np.int64)
        m_sim = np.minimum(mm, STEADY_AFTER * S_of)
        keys = (S_of * 1_000_000 + m_sim) * 2 + gpipe[bi]
        order = np.argsort(keys, kind="stable")
        uniq, starts = np.unique(keys[order], return_index=True)
        bounds = [*starts.tolist(), len(order)]
        for u, key in enumerate(uniq.tolist()):
            sel = order[bounds[u]:bounds[u + 1]]
            gp, rest = key % 2, key // 2
            n, ms = rest // 1_000_000, rest % 1_000_000
            b_, r_ = bi[sel], ri[sel]
            ex = exact_ends(np.ascontiguousarray(f_all[b_, :n, r_].T),
                            np.ascontiguousarray(b_all[b_, :n, r_].T), ms, "gpipe" if gp else "1f1b")
            ends[b_, :n, r_] = (ex + ((mm[sel] - ms) * period[b_, r_])[None, :]).T
    return ends.max(axis=1), ends


def makespan(f_all: np.ndarray, b_all: np.ndarray, m: np.ndarray, gpipe: np.ndarray,
             n_stages: np.ndarray) -> np.ndarray:
    """Makespan per pipeline (B, R); see ``schedule_times``."""
    return schedule_times(f_all, b_all, m, gpipe, n_stages)[0]


@compiled()
def stage_span(m, w, f, b, later, one_f1b):
    """The least seconds from a stage's first forward to the end of its last backward in a
    pipeline of m microbatches, as ``schedule_times`` runs it (the planners' bounds): f and b
    are the stage's forward and backward per microbatch (sends included), ``later`` the least
    forward and backward of one microbatch through the stages after it. Under any schedule
    the stage runs all 2m operations, and its last backward follows the last forward's trip
    down the later stages and back. Under 1F1B (``one_f1b``) it runs w = min(stages after
    it, m) forwards before its first backward, which waits for microbatch 0's trip; then
    m - 1 - w forwards and backwards in turn up to its last forward; its last backward waits
    for microbatch m - 1's trip while its w backwards before it run. That path through every
    wait is exact for equal stages and more microbatches than stages (the bubble of
    (stages - 1) x (f + b)), which ``(m - 1) max_s t_s + sum_s t_s`` would not bound: with
    unequal stages the recurrence can end below it."""
    # max and min written out: numba compiles its builtins apart per type, at a first run
    span = m * (f + b)
    if m * f + later + b > span:
        span = m * f + later + b
    if one_f1b:
        first_b = (m if m < w + 1 else w + 1) * f  # microbatch 0's backward starts
        if f + later > first_b:
            first_b = f + later
        if m - 1 <= w:
            end = first_b + m * b
        else:
            end = first_b + (m - 1 - w) * (f + b) + (later if later > w * b else w * b) + b
        if end > span:
            span = end
    return span


def stage_spans(m, w, f, b, later, one_f1b):
    """``stage_span`` of every stage (rows: ``w``, ``f``, ``b``, ``later``) at every count of
    microbatches in ``m`` (columns of ``w``): (stages, counts)."""
    w = np.ascontiguousarray(w, dtype=np.float64)
    out = np.empty(w.shape)
    _stage_spans(np.ascontiguousarray(m, dtype=np.float64), w, f, b, later, one_f1b, out)
    return out


@compiled("f8[::1], f8[:, ::1], f8[::1], f8[::1], f8[::1], b1, f8[:, ::1]", hot=True)
def _stage_spans(m, w, f, b, later, one_f1b, out):
    """``stage_spans``, compiled, into ``out``."""
    for s in range(w.shape[0]):
        for i in range(w.shape[1]):
            out[s, i] = stage_span(m[i], w[s, i], f[s], b[s], later[s], one_f1b)
