"""Sailor's dynamic program over stages on one or two kinds (Sailor §4.2.2, Listing 1)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from shoal.jit import compiled
from shoal.training.planners.allocate.base import BIG, Allocation, Mixes, Option, OutOfTime, caps
from shoal.training.planners.allocate.greedy import keep_options
from shoal.training.planners.allocate.mixes import class_options, layouts_of, mixes_of


@dataclass(frozen=True)
class Tables:
    """A program's stages as ``dp_stages`` reads them, at any bound. Stages of equal options
    form a class (``of_stage``); class ``c`` has options ``opt_start[c]`` to
    ``opt_start[c + 1]`` (``kinds``, ``tps``, ``times``; sorted by kind, then TP) and combos
    ``cstart[c]`` to ``cend[c]``: every mix of one or two of its options of one region
    (``mix_layout``; ``ia``, ``ib`` index the class's options, ``na`` replicas on the first),
    with their first- and second-kind GPUs (``ca``, ``cb``). The combos depend only on the
    options' kinds and TPs, so classes of the same kinds and TPs share them; their times are
    read from the options'. A bound allows a subset of each class's options (``allowed_options``),
    and the combos of that subset are, in order, those of the class's combos whose options it
    all holds."""

    D: int
    K: int
    of_stage: np.ndarray
    opt_start: np.ndarray
    kinds: np.ndarray
    tps: np.ndarray
    times: np.ndarray
    cstart: np.ndarray
    cend: np.ndarray
    ia: np.ndarray
    ib: np.ndarray
    na: np.ndarray
    ca: np.ndarray
    cb: np.ndarray
    kind_tps: tuple[tuple[tuple[int, int], ...], ...]  # per class, its options' kinds and TPs
    region_of: tuple[int, ...]
    _made: list = field(default_factory=list, compare=False, repr=False)

    def mixes(self, c: int) -> Mixes:
        """Class ``c``'s combos as ``Mixes`` (to trace an allocation back), made once."""
        if not self._made:
            self._made.extend([None] * len(self.kind_tps))
        got = self._made[c]
        if got is None:
            got = self._made[c] = mixes_of(self.kind_tps[c], self.D, self.region_of)
        return got


def tables_of(stage_opts: list[list[Option]], D: int, region_of: list[int]) -> Tables:
    """The program's ``Tables``, from its stages' options (built once per program)."""
    classes: dict[tuple[Option, ...], int] = {}
    of_stage = np.empty(len(stage_opts), dtype=np.int64)
    parts: list[tuple[tuple[tuple[int, int], ...], np.ndarray]] = []
    for s, opts in enumerate(stage_opts):
        c = classes.get(key := tuple(opts))
        if c is None:
            c = classes[key] = len(parts)
            parts.append(class_options(key))
        of_stage[s] = c
    kind_tps = tuple(kt for kt, _ in parts)
    layouts: dict[tuple[tuple[int, int], ...], int] = {}
    lay = np.array([layouts.setdefault(kt, len(layouts)) for kt in kind_tps], dtype=np.int64)
    ia, ib, na, ca, cb, lstart = layouts_of(tuple(layouts), D, tuple(region_of))
    rows = parts[0][1] if len(parts) == 1 else np.concatenate([r for _, r in parts])
    opt_start = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(kt) for kt in kind_tps], out=opt_start[1:])
    return Tables(D, len(region_of), of_stage, opt_start, rows[:, 0].astype(np.int64),
                   rows[:, 1].astype(np.int64), np.array(rows[:, 2]), lstart[lay],
                   lstart[lay + 1], ia, ib, na, ca, cb, kind_tps, tuple(region_of))


def dp_front(tables: Tables, A: int, B: int, tau: float, relax: float, extra: int,
              deadline: float | None,
              back: list | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """A dynamic program over the stages that keeps, after each, the GPU-usage pairs no other
    dominates, held as one array: per count ``u`` of the first kind's GPUs (at most ``A``), the
    fewest of the second kind (at most ``B``) an allocation of the stages so far takes with
    exactly ``u`` of the first (a large number where none does, or where that pair is
    dominated). Each stage is a min-plus convolution of the array with the combos of the
    stage's options that ``allowed_options`` keeps (``dp_stages``). Of equal pairs it keeps the one
    whose earlier stages take the fewest of the first kind, then the first combo. Returns the
    last front as (first-kind counts, ascending; second-kind counts, descending), or None when
    it is empty; appends to ``back`` the stages' choices (with the tables).

    Counts enter only as caps: a pair of the front at caps (A, B) is one of the front at any
    larger caps, reached through the same choices, so a front computed for a pool answers
    every smaller pool (``Fronts``)."""
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime
    t = tables
    S = len(t.of_stage)
    fewest, pick, work, kept = scratch(t, A)
    done = dp_stages(t.of_stage, t.opt_start, t.kinds, t.tps, t.times, t.cstart, t.cend, t.ia,
                      t.ib, t.na, t.ca, t.cb, t.K, tau, tau * relax, t.D - extra, t.D, A, B,
                      fewest, pick, work, kept)
    if done < S:
        return None
    if back is not None:
        back.append((pick, t))
    at = np.flatnonzero(fewest < BIG)
    return at, fewest[at]


def scratch(t: Tables, A: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``dp_stages``' arrays at first-kind cap ``A``: ``fewest``, ``pick``, its ``work`` and
    ``kept`` (``shoal.jit``: a loop allocates no array)."""
    return (np.empty(A + 1, np.int64), np.empty((len(t.of_stage), A + 1), np.int64),
            np.empty(2 * (A + 1) + t.K, np.int64), np.empty(len(t.kinds), np.bool_))


@compiled("i8[::1], i8[::1], i8[::1], i8[::1], f8[::1], i8[::1], i8[::1], ro(i8[::1]), "
          "ro(i8[::1]), ro(i8[::1]), ro(i8[::1]), ro(i8[::1]), i8, f8, f8, i8, i8, i8, i8, "
          "i8[::1], i8[:, ::1], i8[::1], b1[::1]")
def dp_stages(of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
               tau, tau_relaxed, slow_cap, D, A, B, fewest, pick, work, kept_opt):
    """``dp_front``'s program (``Tables``' arrays), compiled. Per class, the options
    ``allowed_options`` keeps under ``tau`` and ``tau_relaxed``; a stage takes the combos of
    its class's kept options whose faster option is within ``tau`` and whose slower one is
    within ``tau_relaxed`` when at most ``slow_cap`` replicas are on it, else within ``tau``
    (of two equally fast options the first counts as the faster). Leaves the last front in
    ``fewest`` and each stage's combo per first-kind count in ``pick`` (relative to its
    class's first combo); returns how many stages kept a non-empty front. Scratch
    (``scratch``): ``work`` (2 (A + 1) + K) and ``kept_opt`` (per option)."""
    big = np.int64(1) << np.int64(60)
    kept_opt[:] = False
    keep_options(opt_start, kinds, tps, times, K, tau, tau_relaxed, kept_opt,
                 work[2 * (A + 1):])  # per class
    fewest[:] = big
    fewest[0] = 0
    raw = work[:A + 1]  # kept at big outside the counts a stage reaches
    raw[:] = big
    # the first-kind counts on the front so far, ascending (the only ones a combo extends):
    # the front holds at most min(A, B) + 1 pairs, so a pool of many GPUs of one kind costs
    # what the other kind's count does
    on = work[A + 1:2 * (A + 1)]
    on[0] = 0
    n_on = 1
    for s in range(len(of_stage)):
        cls = of_stage[s]
        o0, c0, c1 = opt_start[cls], cstart[cls], cend[cls]
        lo, hi = A + 1, -1  # the first-kind counts the stage reaches
        for c in range(c0, c1):
            if not kept_opt[o0 + ia[c]] or (ib[c] >= 0 and not kept_opt[o0 + ib[c]]):
                continue
            t_fast = times[o0 + ia[c]]
            t_slow, n_slow = t_fast, 0
            if ib[c] >= 0:
                t_b = times[o0 + ib[c]]
                if t_fast > t_b:
                    t_fast, t_slow, n_slow = t_b, t_fast, na[c]
                else:
                    t_slow, n_slow = t_b, D - na[c]
            if t_fast > tau or t_slow > (tau_relaxed if n_slow <= slow_cap else tau):
                continue
            a, b = ca[c], cb[c]
            if a > A or b > B:
                continue
            for k in range(n_on):
                u = on[k] + a
                if u > A:
                    break
                v = fewest[on[k]] + b
                # of equal counts, the combo taking the most of the first kind (the earlier
                # stages the fewest), then the first
                if v < raw[u] or (v == raw[u] and a > ca[c0 + pick[s, u]]):
                    raw[u] = v
                    pick[s, u] = c - c0
                    if u < lo:
                        lo = u
                    if u > hi:
                        hi = u
        # only pairs within the caps that no pair with fewer of the first kind dominates
        for k in range(n_on):
            fewest[on[k]] = big
        least = big
        n_on = 0
        for u in range(lo, hi + 1):
            v = raw[u]
            raw[u] = big
            if v <= B and v < least:
                fewest[u] = v
                on[n_on] = u
                n_on += 1
            if v < least:
                least = v
        if n_on == 0:
            return s
    return len(of_stage)


def cheapest_on(front: tuple[np.ndarray, np.ndarray], avail: np.ndarray,
              price: np.ndarray) -> tuple[int, ...] | None:
    """The cheapest usage of ``front`` (``dp_front``'s) within ``avail``; of equally cheap
    ones, the fewest of the first kind."""
    run = cheapest_at(front, *caps(avail))
    if run is None:
        return None
    at, vals = front
    U = np.stack([at[run], vals[run]], axis=1)[:, :len(avail)]
    return tuple(int(x) for x in U[int(np.argmin(U @ price))])


def cheapest_at(front: tuple[np.ndarray, np.ndarray], A: int, B: int) -> slice | None:
    """The pairs of ``front`` within caps (A, B): first-kind counts ascend and second-kind
    counts descend, so they are a run (None when empty)."""
    at, vals = front
    hi = int(np.searchsorted(at, A, side="right"))
    if hi == 0 or vals[hi - 1] > B:
        return None
    return slice(int(np.searchsorted(-vals, -B, side="left")), hi)


def solve_dp(tables: Tables, avail: np.ndarray, price: np.ndarray, tau: float, relax: float,
              extra: int, deadline: float | None) -> Allocation | None:
    """``solve`` for one or two kinds: the dynamic program of ``dp_front``, the cheapest GPU
    usage on its last front (of equally cheap ones, the fewest of the first kind), and the
    stages' combos traced back from it."""
    back: list[tuple[np.ndarray, Tables]] = []
    front = dp_front(tables, *caps(avail), tau, relax, extra, deadline, back)
    usage = None if front is None else cheapest_on(front, avail, price)
    return None if usage is None else trace(back, usage, tau)


def trace(back: list[tuple[np.ndarray, Tables]], usage: tuple[int, ...],
           tau: float) -> Allocation:
    """The allocation reaching ``usage`` on ``dp_front``'s last front, from its choices."""
    pick, t = back[0]
    per_stage = []
    x = usage[0]
    for s, c in reversed(list(enumerate(t.of_stage.tolist()))):
        stage, first = t.mixes(c).entry(int(pick[s, x]))
        per_stage.append(stage)
        x -= first
    per_stage.reverse()
    return Allocation(tuple(per_stage), usage, tau)


@compiled("i8[::1], i8[::1], i8[::1], i8[::1], f8[::1], i8[::1], i8[::1], ro(i8[::1]), "
          "ro(i8[::1]), ro(i8[::1]), ro(i8[::1]), ro(i8[::1]), i8, f8[::1], i8, i8, b1, b1, f8, "
          "i8, i8, i8, i8, i8[::1], i8[:, ::1], i8[::1], b1[::1]", hot=True)
def search_taus(of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
                 taus, lo, hi, near, check_hi, relax, slow_cap, D, A, B, fewest, pick, work,
                 kept):
    """``Program.search``, compiled: the tests of ``fastest_of`` (``dp_stages`` at caps A, B:
    a bound is met when every stage keeps a non-empty front; its arrays from ``scratch``)."""
    S = len(of_stage)
    if near and lo < hi and dp_stages(
            of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
            taus[lo], taus[lo] * relax, slow_cap, D, A, B, fewest, pick, work, kept) == S:
        return lo
    if check_hi and dp_stages(
            of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
            taus[hi], taus[hi] * relax, slow_cap, D, A, B, fewest, pick, work, kept) < S:
        return -1
    step = 1
    while near and lo < hi:
        probe = lo + step if lo + step < hi else hi
        if probe == hi or dp_stages(of_stage, opt_start, kinds, tps, times, cstart, cend, ia,
                                     ib, na, ca, cb, K, taus[probe], taus[probe] * relax,
                                     slow_cap, D, A, B, fewest, pick, work, kept) == S:
            hi = probe
            break
        lo, step = probe, 2 * step
    if near and lo < hi:
        lo += 1
    while lo < hi:
        mid = (lo + hi) // 2
        if dp_stages(of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb,
                      K, taus[mid], taus[mid] * relax, slow_cap, D, A, B, fewest, pick, work,
                      kept) == S:
            hi = mid
        else:
            lo = mid + 1
    return hi
