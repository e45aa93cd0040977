"""The planner's compiled loops: the stage split's dynamic program, the refined levels and
costs per option, the least level a pool allows, and the pipelines' floors."""

from __future__ import annotations

import numpy as np

from shoal.estimate.pipeline import stage_span
from shoal.jit import compiled

ANY_REGIONS = np.zeros(1, dtype=bool)  # least_level's one-region flags of one row
NO_FLOOR, NONE_YET = np.full(1, -np.inf), np.full(1, np.inf)  # its floor, best of one degree


@compiled("f8[:, ::1], i8, i8[:, ::1], f8[:, ::1]", hot=True)
def min_max_cuts(cum, L, arg, best):
    """``linear_partition``'s dynamic program over cuts, compiled: in ``best[i, j]`` (shape
    (stages, L + 1)) the smallest slowest stage placing layers [0, j) on stages 0..i
    (``cum[i]``: stage i's cumulative layer times), and in ``arg[i, j]`` where stage i starts
    in it (of equal ones, the first)."""
    P = cum.shape[0]
    best[:] = np.inf
    for j in range(1, L + 1):
        best[0, j] = cum[0, j] - cum[0, 0]
    for i in range(1, P):
        for j in range(i + 1, L + 1):
            q = i
            for c in range(i, j):
                v = best[i - 1, c]
                if cum[i, j] - cum[i, c] > v:
                    v = cum[i, j] - cum[i, c]
                if c == i or v < best[i, j]:
                    best[i, j], q = v, c
            arg[i, j] = q


def refined_levels(rows, upd, ring, stage, *rest):
    """``Bounds.refined``'s levels per option (``_refine_parts``' arrays, one row per set of
    option times: ``rows`` is ``fpre``, ``t``, ``f``, ``post`` (rows, options) and ``bsum``
    (rows, stages); ``ring``: its ring terms (move, latency), as ``kernel.ring_from_terms`` combines
    them; ``rest``: the stages P, microbatches n per pipeline, the degree D, ``sync``
    (``Bounds.sync_terms``) and whether the plans run 1F1B): each option's own least exposed
    ring over D members and update; per row and stage the least of those; and L(s, o) per row
    (``stage_span``). (rows, options)."""
    fpre, t, f, post, bsum = rows
    P, _, _, sync, _ = rest
    level = np.empty(t.shape)
    _refined_levels(fpre, t, f, post, upd / sync[3], *ring, stage, bsum, *rest, level,
                    np.empty((3, P)))
    return level


@compiled("f8[:, ::1], f8[:, ::1], f8[:, ::1], f8[:, ::1], f8[::1], f8[:, ::1], f8[:, ::1], "
          "i8[::1], f8[:, ::1], i8, i8, i8, f8[::1], b1, f8[:, ::1], f8[:, ::1]", hot=True)
def _refined_levels(fpre, t, f, post, own, move, lat, stage, bsum, P, n, D, sync, one_f1b,
                    level, work):
    """``refined_levels``, compiled: ``own`` starts as each option's update and is given its
    ring; writes ``level``; ``work``: (3, P) scratch."""
    sync_scale, overlap, sync_on = sync[0], sync[1], sync[2]
    busy, least, earlier = work[0], work[1], work[2]
    if D > 1:
        # the ring hides behind the backward of the replica that ends its stage last: of
        # any option of the stage (the most time per microbatch bounds it)
        busy[:] = 0.0
        for i in range(len(own)):
            if t[0, i] > busy[stage[i]]:
                busy[stage[i]] = t[0, i]
        d = float(D)
        c_move, c_lat = 2.0 * (d - 1) / d, 2.0 * (d - 1)
        for i in range(len(own)):
            best = np.inf
            for j in range(move.shape[1]):
                ring = (c_move * move[i, j] + c_lat * lat[i, j]) * sync_scale
                if ring < best:
                    best = ring
            exposed = best - overlap * busy[stage[i]]
            own[i] += sync_on * (0.0 if exposed < 0.0 else exposed)
    least[:] = np.inf  # per stage, its least ring and update
    for i in range(len(own)):
        if own[i] < least[stage[i]]:
            least[stage[i]] = own[i]
    for r in range(t.shape[0]):
        # per stage s, the most max_{s' < s} (bsum[s] - bsum[s'] + least[s']) (none for s = 0)
        most = -np.inf
        for s in range(P):
            earlier[s] = most + bsum[r, s]
            if least[s] - bsum[r, s] > most:
                most = least[s] - bsum[r, s]
        for i in range(len(own)):
            after = P - 1 - stage[i]
            # at floats, as the other loops call it: one compiled signature
            span = stage_span(float(n), float(n if n < after else after), f[r, i],
                              t[r, i] - f[r, i], post[r, i], one_f1b)
            wait = earlier[stage[i]]
            level[r, i] = fpre[r, i] + span + (wait if wait > own[i] else own[i])


def least_cost(level, rate, stage, P, least, overhead):
    """``Bounds.refined``'s cost per pipeline: a plan whose options (stage by stage, at
    ``level`` each) are all at or under theta takes at least max(theta, ``least``) +
    ``overhead`` seconds and pays each stage's replica at least the least ``rate`` (USD/s)
    of that stage's options at or under theta; the least such cost over theta (inf when no
    theta holds an option of every stage). The options are sorted by numpy, not in the
    compiled loop: a sort compiled costs a second at a first run."""
    return _least_cost(level, np.argsort(level), rate, stage, P, least, overhead, np.empty(P))


@compiled("f8[::1], i8[::1], f8[::1], i8[::1], i8, f8, f8, f8[::1]", hot=True)
def _least_cost(level, order, rate, stage, P, least, overhead, low):
    low[:] = np.inf  # per stage, its least rate so far
    best = np.inf
    i = 0
    while i < len(order):
        theta = level[order[i]]
        while i < len(order) and level[order[i]] == theta:  # options at theta join together
            o = order[i]
            if rate[o] < low[stage[o]]:
                low[stage[o]] = rate[o]
            i += 1
        total = 0.0
        for s in range(P):
            total += low[s]
        if total < np.inf:
            cost = ((least if least > theta else theta) + overhead) * total
            if cost < best:
                best = cost
    return best


def least_level(levels, one_region, floor, best, *pool):
    """``_least_level`` with each row's order (numpy's sort, as in ``least_cost``), from
    ``best`` (not changed): per degree, its answer. ``pool``: tp, kind, stage, P, Ds, avail,
    region_of, region_N, W, as ``_least_level`` takes them."""
    out = np.array(best, dtype=np.float64)
    P, avail, region_N = pool[3], pool[5], pool[7]
    _least_level(levels, np.argsort(levels, axis=1), one_region, floor, out, *pool,
                 np.empty((P, len(avail))), np.empty((2, P, len(region_N))))
    return out


@compiled("f8[:, ::1], i8[:, ::1], b1[::1], f8[::1], f8[::1], f8[::1], i8[::1], i8[::1], i8, "
          "i8[::1], f8[::1], i8[::1], f8[::1], f8[:, ::1], f8[:, ::1], f8[:, :, ::1]")
def _least_level(levels, orders, one_region, floor, out, tp, kind, stage, P, Ds, avail,
                 region_of, region_N, W, c, work):
    """Per degree D in ``Ds``, ``Bounds.refined``'s level: over the rows of ``levels`` (each
    a level per option), the smallest level at which the pool holds D replicas of each of
    the P stages among the options at or under it in that row, by the conditions of
    ``Bounds._tau`` (per stage in one region, the stages per region, and the GPUs all stages
    take from each kind together: LP dual bounds at weights ``W``; on the rows where
    ``one_region`` is set, also all stages in one region), when under ``best`` (a degree's
    answer so far; inf: none). Once a degree's answer is down to its ``floor`` the later rows
    are not searched. Feasibility only grows with the level, so a bisection over a row's
    sorted levels finds it; it only shrinks as D grows, so a degree at least the one before
    starts where that one's answer is in the row. ``out`` holds a degree's answer so far and
    is lowered in place; ``c`` (P, kinds) and ``work`` (2, P, regions) are scratch."""
    K, R = len(avail), len(region_N)
    # c: fewest GPUs per replica of stage s from kind k; per stage and region, the replicas
    # it can hold (cap) and the fewest GPUs of one (low)
    cap, low = work[0], work[1]
    for v in range(levels.shape[0]):
        level, order = levels[v], orders[v]
        start = 0
        for i in range(len(Ds)):
            D = Ds[i]
            lo = start if i > 0 and Ds[i - 1] <= D else 0
            if out[i] <= floor[i]:
                start = lo
                continue
            # only levels under the best answer so far can improve on it
            a, b = 0, len(order)  # the first level at or over out[i]
            while a < b:
                if level[order[(a + b) // 2]] < out[i]:
                    a = (a + b) // 2 + 1
                else:
                    b = (a + b) // 2
            hi = a if a > lo else lo
            end = hi
            while lo < hi:
                mid = (lo + hi) // 2
                theta = level[order[mid]]
                c[:] = np.inf
                for o in range(len(level)):
                    if level[o] <= theta and tp[o] < c[stage[o], kind[o]]:
                        c[stage[o], kind[o]] = tp[o]
                cap[:] = 0.0
                low[:] = np.inf
                for s in range(P):
                    for k in range(K):
                        if c[s, k] < np.inf:
                            cap[s, region_of[k]] += np.floor(avail[k] / c[s, k])
                            if c[s, k] < low[s, region_of[k]]:
                                low[s, region_of[k]] = c[s, k]
                ok = True
                for s in range(P):
                    most = 0.0
                    for r in range(R):
                        if cap[s, r] > most:
                            most = cap[s, r]
                    if most < D:
                        ok = False
                if ok:
                    stages = 0.0
                    for r in range(R):
                        gmin = np.inf
                        for s in range(P):
                            if low[s, r] < gmin:
                                gmin = low[s, r]
                        if gmin < np.inf:
                            stages += np.floor(region_N[r] / (gmin * D))
                    ok = stages >= P
                if ok and one_region[v]:
                    ok = False
                    for r in range(R):
                        need = 0.0  # GPUs of region r that D replicas of every stage take
                        for s in range(P):
                            need += D * low[s, r] if cap[s, r] >= D else np.inf
                        if need <= region_N[r]:
                            ok = True
                m = 0
                while ok and m < W.shape[0]:
                    den, have = 0.0, 0.0
                    for k in range(K):
                        have += W[m, k] * avail[k]
                    for s in range(P):
                        fewest = np.inf  # the stage's fewest weighted GPUs per replica
                        for k in range(K):
                            if c[s, k] < np.inf and W[m, k] * c[s, k] < fewest:
                                fewest = W[m, k] * c[s, k]
                        den += fewest
                    ok = not (den > 0 and D * den > have)
                    m += 1
                if ok:
                    hi = mid
                else:
                    lo = mid + 1
            if lo < end:
                out[i] = level[order[lo]]
            start = lo


def pipeline_ends(f, b, m, one_f1b):
    """``stage_floors_s``' ends over the pipelines (columns of ``f``, ``b``: forward and
    backward per microbatch per stage; ``m``: their microbatches): per stage."""
    out = np.empty(f.shape[0])
    _pipeline_ends(f, b, m, one_f1b, out, np.empty(f.shape[0] + 1))
    return out


@compiled("f8[:, ::1], f8[:, ::1], f8[::1], b1, f8[::1], f8[::1]", hot=True)
def _pipeline_ends(f, b, m, one_f1b, out, before):
    """``pipeline_ends``, compiled, into ``out`` (``before``: P + 1 scratch)."""
    P, D = f.shape
    out[:] = 0.0
    for j in range(D):
        later = 0.0
        end = 0.0
        before[0] = 0.0
        for s in range(P):
            before[s + 1] = before[s] + f[s, j]
        for s in range(P - 1, -1, -1):
            w = m[j] if m[j] < P - 1 - s else P - 1 - s
            own = before[s] + stage_span(m[j], w, f[s, j], b[s, j], later, one_f1b)
            after = end + b[s, j]
            end = after if s < P - 1 and after > own else own
            if end > out[s]:
                out[s] = end
            later += f[s, j] + b[s, j]
