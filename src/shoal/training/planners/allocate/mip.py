"""The MIP over the stages' choices on three kinds or more (HiGHS)."""

from __future__ import annotations

import time

import numpy as np

from shoal.mip import Model
from shoal.training.planners.allocate.base import (
    COMBO_COLUMNS_PER_OPTION,
    LAZY_ROUNDS,
    LP_INTEGRAL_TOL,
    MIP_OPTIONS,
    ONE_REGION_COMBOS,
    Allocation,
    Bound,
    Option,
    OutOfTime,
    Pool,
    allocation_of,
)
from shoal.training.planners.allocate.mixes import stage_combos


def solve_mip(allowed: list[list[Option]], D: int, pool: Pool, bound: Bound,
              deadline: float | None) -> Allocation | None:
    """``solve`` for three kinds or more, where the program's fronts grow large: a MIP solved
    by HiGHS. First without the rules on how a stage mixes its options (any replicas on any
    of them, ``by_option`` with no stage ``strict``): when its cheapest allocation keeps
    those rules anyway, as it mostly does (its basic solutions spread few stages over several
    options), no allocation is cheaper, since every allocation that keeps them is one of its.
    Else, on one region, the stages that broke them, and those of the same options, are held
    to them, and so on, for up to ``LAZY_ROUNDS`` solves; then (at once across regions) the
    MIP over the choices themselves (``by_choices``)."""
    avail, region_of, tau = pool.avail, pool.region_of, bound.tau
    K = len(avail)
    strict: set[int] = set()
    # binaries per region made the option form slow (``by_choices``): across regions, the
    # stages are held to the rules in the combo form at once
    one_region = len({region_of[o.kind] for al in allowed for o in al}) == 1
    for _ in range(LAZY_ROUNDS if one_region else 1):
        left = np.inf if deadline is None else deadline - time.perf_counter()
        m = Model(maximize=False)
        use: list[tuple[list[int], list[float]]] = [([], []) for _ in range(K)]
        got = mip_solve(m, use, by_option(m, use, allowed, D, pool, bound, strict), avail, left,
                        lp_first=not strict)
        if not isinstance(got, set):
            return allocation_of(got, K, tau)
        # the stages of equal options would take the same mix in turn
        classes = equal_stages(allowed)
        strict.update(i for b in got for i in classes[tuple(allowed[b])])
    return by_choices(allowed, D, pool, bound, deadline)


def equal_stages(allowed: list[list[Option]]) -> dict[tuple[Option, ...], list[int]]:
    """The stages of each list of options, in order of first appearance."""
    classes: dict[tuple[Option, ...], list[int]] = {}
    for i, al in enumerate(allowed):
        classes.setdefault(tuple(al), []).append(i)
    return classes


def by_choices(allowed: list[list[Option]], D: int, pool: Pool, bound: Bound,
               deadline: float | None) -> Allocation | None:
    """``solve_mip``'s MIP over the choices themselves, in one of two forms (``by_combo``,
    ``by_option``). The combo form has no big-M rows, no binaries per region and no symmetry
    between equal stages, which matters on pools of several regions; on one region the option
    form is the faster except where the combos are few (benchmarks/NOTES.md, the allocation
    MIP). So: combos when the combo columns are at most COMBO_COLUMNS_PER_OPTION times the
    option columns (ONE_REGION_COMBOS times that on one region)."""
    avail, region_of = pool.avail, pool.region_of
    K = len(avail)
    classes = equal_stages(allowed)  # equal stages share columns
    n_combo = 0
    for al in classes:
        per_region: dict[int, int] = {}
        for o in al:
            per_region[region_of[o.kind]] = per_region.get(region_of[o.kind], 0) + 1
        n_combo += sum(n + n * (n - 1) // 2 * (D - 1) for n in per_region.values())
    n_option = 2 * sum(len(al) for al in allowed)
    m = Model(maximize=False)
    use = [([], []) for _ in range(K)]
    regions = {region_of[o.kind] for al in classes for o in al}
    scale = 1.0 if len(regions) > 1 else ONE_REGION_COMBOS
    if n_combo <= scale * COMBO_COLUMNS_PER_OPTION * n_option:
        read = by_combo(m, use, classes, D, pool, bound)
    else:
        read = by_option(m, use, allowed, D, pool, bound)
    if read is None:
        return None
    left = np.inf if deadline is None else deadline - time.perf_counter()
    return allocation_of(mip_solve(m, use, read, avail, left), K, bound.tau)


def mip_solve(m: Model, use: list[tuple[list[int], list[float]]], read, avail: np.ndarray,
               left: float, lp_first: bool = False):
    """Solves ``m`` with a row per kind holding its columns (``use``) to the pool's GPUs, and
    returns ``read`` of its solution (None when nothing fits). Raises OutOfTime when the
    time ``left`` runs out first. ``lp_first``: the LP relaxation is solved first; when it
    is infeasible so is the MIP, and when its optimal vertex is integral and keeps every
    row it is the MIP's optimum, within the solvers' tolerances (the relaxation's optimum is
    a bound on the MIP's): the MIP is solved only otherwise."""
    if left <= 0:
        raise OutOfTime
    for k, (idx, val) in enumerate(use):
        if idx:
            m.row(idx, val, hi=float(avail[k]))
    if lp_first:
        started = time.perf_counter()
        lp = m.solve(time_limit_s=left, relaxed=True)
        if lp.infeasible:
            return None
        if lp.x is not None and lp.status == "Optimal":
            x = np.rint(lp.x)
            if np.abs(lp.x - x).max(initial=0.0) <= LP_INTEGRAL_TOL and m.satisfied(x):
                return read(x.astype(np.int64))
        left -= time.perf_counter() - started
        if left <= 0:
            raise OutOfTime
    sol = m.solve(time_limit_s=left, exact=True, options=MIP_OPTIONS)
    if sol.x is None:
        if sol.infeasible:
            return None
        raise OutOfTime
    return read(np.rint(sol.x).astype(np.int64))


def by_combo(m: Model, use, classes: dict[tuple[Option, ...], list[int]], D: int, pool: Pool,
             bound: Bound):
    """Columns: per class of equal stages, how many of them take each combo the bound allows
    (the dynamic program's choices); returns the reader of a solution, or None when a class
    has no combo."""
    price, region_of = pool.price, pool.region_of
    tau, relax, extra = bound
    K = len(use)
    cols = []
    for al, stages in classes.items():
        combos, CU, ok = stage_combos(list(al), D, region_of, K, tau, relax, extra)
        idx = np.flatnonzero(ok)
        if len(idx) == 0:
            return None
        cost = CU[idx] @ price
        vs = [m.var(0, len(stages), float(c), integer=True) for c in cost]
        m.row(vs, [1] * len(vs), lo=len(stages), hi=len(stages))
        for v, c in zip(vs, idx, strict=True):
            for k in np.flatnonzero(CU[c]):
                use[k][0].append(v)
                use[k][1].append(float(CU[c, k]))
        cols.append((stages, combos, idx, vs))

    def read(x: np.ndarray) -> list:
        per_stage: list = [()] * sum(len(st) for st, _, _, _ in cols)
        for stages, combos, idx, vs in cols:
            todo = iter(stages)
            for c, v in zip(idx, vs, strict=True):
                for _ in range(int(x[v])):
                    per_stage[next(todo)] = combos[c]
        return per_stage

    return read


def by_option(m: Model, use, allowed: list[list[Option]], D: int, pool: Pool, bound: Bound,
              strict: set[int] | None = None):
    """Columns: per stage, the replicas it takes of each allowed option, D in all, at most
    D - extra on the options over ``tau``; on the stages of ``strict`` (None: every stage)
    with a binary per option (at most two used, at most one over ``tau``) and per region
    (the options of one region only). Returns the reader of a solution: the allocation, or,
    when some stage outside ``strict`` breaks those rules, the set of such stages."""
    price, region_of = pool.price, pool.region_of
    tau, extra = bound.tau, bound.extra
    cols: list[list[tuple[Option, int]]] = []
    for s, al in enumerate(allowed):
        xs, zs, over = [], [], []
        regions: dict[int, list[int]] = {}
        binary = strict is None or s in strict
        for o in al:
            cap = D - extra if o.time_s > tau else D
            x = m.var(0, cap, float(price[o.kind] * o.tp), integer=True)
            xs.append(x)
            use[o.kind][0].append(x)
            use[o.kind][1].append(o.tp)
            if not binary:
                if o.time_s > tau:
                    over.append(x)
                continue
            z = m.var(0, 1, integer=True)
            m.row([x, z], [1, -cap], hi=0)  # replicas only on a used option
            zs.append(z)
            if o.time_s > tau:
                over.append(z)
            regions.setdefault(region_of[o.kind], []).append(z)
        m.row(xs, [1] * len(xs), lo=D, hi=D)
        if not binary:
            if len(over) > 1:
                m.row(over, [1] * len(over), hi=D - extra)
            cols.append(list(zip(al, xs, strict=True)))
            continue
        m.row(zs, [1] * len(zs), hi=2)
        if len(over) > 1:
            m.row(over, [1] * len(over), hi=1)
        if len(regions) > 1:
            rs = [m.var(0, 1, integer=True) for _ in regions]
            for r, zz in zip(rs, regions.values(), strict=True):
                m.row([*zz, r], [1] * len(zz) + [-2], hi=0)  # options of a chosen region only
            m.row(rs, [1] * len(rs), hi=1)
        cols.append(list(zip(al, xs, strict=True)))

    def read(x: np.ndarray) -> list | set[int]:
        per_stage = [[(o, int(x[c])) for o, c in st if x[c] > 0] for st in cols]
        broken = {s for s, mix in enumerate(per_stage)
                  if len(mix) > 2 or sum(o.time_s > tau for o, _ in mix) > 1
                  or len({region_of[o.kind] for o, _ in mix}) > 1}
        if broken:
            return broken
        return [tuple((o.kind, o.tp, n) for o, n in mix) for mix in per_stage]

    return read
