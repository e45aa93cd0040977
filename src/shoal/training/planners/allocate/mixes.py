"""A stage's combos of at most two options and their layouts."""

from __future__ import annotations

import functools
from functools import cache

import numpy as np

from shoal.training.planners.allocate.base import COMBO_CACHE, Mixes, Option


@cache
def mix_layout(kind_tp: tuple[tuple[int, int], ...], D: int, region_of: tuple[int, ...],
                K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The combos of options with these (kind, TP), in order: per region (in the order its
    first option comes), each option alone, then with each later option of the region at 1 to
    D - 1 replicas on the first. (ia, ib, na, usage matrix (combos, K))."""
    by_region: dict[int, list[int]] = {}
    for i, (k, _) in enumerate(kind_tp):
        by_region.setdefault(region_of[k], []).append(i)
    ia, ib, na = [], [], []
    counts = np.arange(1, D)
    for ros in by_region.values():
        for j, a in enumerate(ros):
            ia.append(np.array([a]))
            ib.append(np.array([-1]))
            na.append(np.array([D]))
            for b in ros[j + 1:]:
                ia.append(np.full(D - 1, a))
                ib.append(np.full(D - 1, b))
                na.append(counts)
    IA, IB, NA = (np.concatenate([np.zeros(0, np.int64), *x]).astype(np.int64)
                  for x in (ia, ib, na))
    kinds = np.array([k for k, _ in kind_tp], dtype=np.int64)
    tps = np.array([tp for _, tp in kind_tp], dtype=np.int64)
    use = np.zeros((len(IA), K), dtype=np.int64)
    rows = np.arange(len(IA))
    np.add.at(use, (rows, kinds[IA]), NA * tps[IA])
    two = IB >= 0
    np.add.at(use, (rows[two], kinds[IB[two]]), (D - NA[two]) * tps[IB[two]])
    for arr in (IA, IB, NA, use):
        arr.flags.writeable = False
    return IA, IB, NA, use


@functools.lru_cache(maxsize=COMBO_CACHE)
def combos_of(opts: tuple[Option, ...], D: int, region_of: tuple[int, ...], K: int):
    """Ways to give a stage D replicas from options of one region, mixing at most two options:
    (the combos (``Mixes``), usage matrix (combos, K), and per combo the faster option's time,
    the slower one's, and how many replicas are on the slower)."""
    kind_tp = tuple((o.kind, o.tp) for o in opts)
    IA, IB, NA, use = mix_layout(kind_tp, D, region_of, K)
    t = np.array([o.time_s for o in opts])
    two = IB >= 0
    ta, tb = t[IA], t[np.where(two, IB, IA)]
    # of two equally fast options the first counts as the faster
    swap = ta > tb
    t_fast, t_slow = np.minimum(ta, tb), np.maximum(ta, tb)
    n_slow = np.where(two, np.where(swap, NA, D - NA), 0).astype(float)
    return mixes_of(kind_tp, D, region_of), use, t_fast, t_slow, n_slow


@functools.lru_cache(maxsize=COMBO_CACHE)
def class_options(opts: tuple[Option, ...]) -> tuple[tuple[tuple[int, int], ...], np.ndarray]:
    """A stage's options sorted by kind, then TP: their (kind, TP) and rows (kind, TP,
    time)."""
    got = sorted(set(opts), key=lambda o: (o.kind, o.tp))
    rows = np.array(got, dtype=np.float64).reshape(len(got), 3)
    rows.flags.writeable = False
    return tuple((o.kind, o.tp) for o in got), rows


@functools.lru_cache(maxsize=COMBO_CACHE)
def layouts_of(kind_tps: tuple[tuple[tuple[int, int], ...], ...], D: int,
             region_of: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The combos (``mix_layout``) of several classes' kinds and TPs, one after the other:
    (ia, ib, na, first-kind GPUs, second-kind GPUs, where each class's start, and a last
    end)."""
    K = len(region_of)
    parts = [mix_layout(kt, D, region_of, K) for kt in kind_tps]
    lstart = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p[0]) for p in parts], out=lstart[1:])
    ia, ib, na, use = (np.concatenate(x) for x in zip(*parts, strict=True))
    out = (ia, ib, na, np.ascontiguousarray(use[:, 0]),
           np.ascontiguousarray(use[:, 1]) if K > 1 else np.zeros(len(use), np.int64), lstart)
    for a in out:
        a.flags.writeable = False
    return out


@functools.lru_cache(maxsize=COMBO_CACHE)
def mixes_of(kind_tp: tuple[tuple[int, int], ...], D: int, region_of: tuple[int, ...]) -> Mixes:
    """The combos of a stage's options of these kinds and TPs (sorted) as ``Mixes``."""
    IA, IB, NA, _ = mix_layout(kind_tp, D, region_of, len(region_of))
    return Mixes(kind_tp, IA, IB, NA, D)


def stage_combos(al: list[Option], D: int, region_of: list[int], K: int, tau: float,
                  relax: float, extra: int):
    """A stage's combos of its allowed options and their GPU usage, with the mask of those the
    bound allows: the slower replicas take the first pipelines, relaxed only if all of those
    run fewer microbatches."""
    combos, CU, t_fast, t_slow, n_slow = combos_of(tuple(al), D, tuple(region_of), K)
    ok = (t_fast <= tau) & np.where(n_slow <= D - extra, t_slow <= tau * relax, t_slow <= tau)
    return combos, CU, ok
