"""The compiled loops (``shoal.jit.compiled``) give exactly what their Python source gives, on
random inputs: the allocation program, the pipeline recurrence, the min-max layer split,
Stoer-Wagner's phases and the bounds' least level and least cost."""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest
from tests.test_allocate import random_stages

from shoal import jit
from shoal.estimate import pipeline
from shoal.training.planners import allocate, zorse
from shoal.training.planners.allocate import dp as alloc_dp
from shoal.training.planners.auto import kernels


def both(fn, *args):
    """(result, written arrays) of the compiled ``fn`` and of its Python source, each on its
    own copy of the arrays."""
    out = []
    for f in (fn, fn.py_func):
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        out.append((f(*copies), [a for a in copies if isinstance(a, np.ndarray)]))
    return out


def assert_same(a, b):
    assert a[0] == b[0]
    for x, y in zip(a[1], b[1], strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("seed", range(12))
def test_the_allocation_program(seed):
    rng = np.random.default_rng(seed)
    K, P, D = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
    stages = random_stages(rng, K, P)
    t = alloc_dp.tables_of(stages, D, [0, int(rng.integers(0, 2))][:K])
    A, B = int(rng.integers(0, 6 * D)), int(rng.integers(0, 6 * D)) if K > 1 else 0
    tau = float(rng.choice(sorted({o.time_s for st in stages for o in st})))
    args = (t.of_stage, t.opt_start, t.kinds, t.tps, t.times, t.cstart, t.cend, t.ia, t.ib, t.na,
            t.ca, t.cb, t.K, tau, tau * 1.2, D - 1, D, A, B, np.empty(A + 1, np.int64),
            np.zeros((P, A + 1), np.int64), *alloc_dp.scratch(t, A)[2:])
    compiled, python = both(alloc_dp.dp_stages, *args)
    assert_same(compiled, python)


@pytest.mark.parametrize("seed", range(12))
def test_the_search_over_bounds(seed):
    """``_search_taus`` (compiled, and its Python source) finds the least bound the program
    meets, as testing every bound in turn does, from a caller's bound (gallop) or not."""
    rng = np.random.default_rng(seed)
    K, P, D = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
    stages = random_stages(rng, K, P)
    t = alloc_dp.tables_of(stages, D, [0, int(rng.integers(0, 2))][:K])
    A, B = int(rng.integers(D, 6 * D)), int(rng.integers(D, 6 * D)) if K > 1 else 0
    taus = np.array(sorted({o.time_s for st in stages for o in st}))
    relax = 1.2
    tables = (t.of_stage, t.opt_start, t.kinds, t.tps, t.times, t.cstart, t.cend, t.ia, t.ib,
              t.na, t.ca, t.cb, t.K)

    def met(x: int) -> bool:
        return alloc_dp.dp_stages(*tables, taus[x], taus[x] * relax, D - 1, D, A, B,
                                   *alloc_dp.scratch(t, A)) == P

    least = next((x for x in range(len(taus)) if met(x)), -1)
    for lo in range(len(taus)):
        for near in (False, True):
            args = (*tables, taus, lo, len(taus) - 1, near, True, relax, D - 1, D, A, B)
            got = [f(*args, *alloc_dp.scratch(t, A))
                   for f in (alloc_dp.search_taus, alloc_dp.search_taus.py_func)]
            assert got[0] == got[1]
            # from lo up: the least met bound at or above lo (none: -1)
            want = -1 if least < 0 else max(least, lo)
            assert got[0] == want, (lo, near, got, want)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_pipeline_recurrence(schedule):
    rng = np.random.default_rng(1)
    for S, N, m in [(1, 1, 1), (3, 40, 7), (6, 5, 24)]:
        f, b = rng.uniform(0.1, 2.0, (S, N)), rng.uniform(0.1, 4.0, (S, N))
        compiled, python = both(pipeline._recurrence, pipeline.op_order(S, m, schedule), f, b, m,
                                np.empty((S, N)), np.zeros((2, S, m, pipeline.LANES)),
                                np.zeros((3, S, pipeline.LANES)))
        assert_same(compiled, python)


def test_the_layer_split_and_the_min_cut():
    rng = np.random.default_rng(2)
    for _ in range(20):
        L, P = int(rng.integers(2, 20)), int(rng.integers(1, 6))
        cum = np.concatenate([np.zeros((P, 1)), np.cumsum(rng.choice([1.0, 2.0, 0.5], (P, L)),
                                                           axis=1)], axis=1)
        compiled, python = both(kernels.min_max_cuts, cum, L, np.zeros((P, L + 1), np.int64),
                                np.zeros((P, L + 1)))
        assert_same(compiled, python)
        n = int(rng.integers(2, 9))
        W = np.triu(rng.choice([0.0, 1.0, 3.0, np.inf], (n, n)), 1)
        compiled, python = both(zorse._phases, W + W.T, np.empty(n - 1),
                                np.empty(n - 1, np.int64), np.empty(n - 1, np.int64),
                                np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.bool_))
        assert_same(compiled, python)


def _sorted(levels, *rest):
    """``least_cost``'s arguments to its compiled loop."""
    return (levels, np.argsort(levels, axis=-1), *rest, np.zeros(rest[2]))


def _least_level_args(levels, one_region, floor, best, tp, kind, stage, P, Ds, avail,
                      region_of, region_N, W):
    """``least_level``'s arguments to its compiled loop."""
    return (levels, np.argsort(levels, axis=-1), one_region, floor,
            np.array(best, dtype=np.float64), tp, kind, stage, P, Ds, avail, region_of,
            region_N, W, np.zeros((P, len(avail))), np.zeros((2, P, len(region_N))))


def py_least_level(*args):
    got = _least_level_args(*args)
    kernels._least_level.py_func(*got)
    return got[4]


def test_the_least_level():
    rng = np.random.default_rng(3)
    for _ in range(200):
        K, P = int(rng.integers(1, 5)), int(rng.integers(1, 7))
        avail = rng.integers(0, 40, K).astype(float)
        region_of = np.sort(rng.integers(0, 2, K))
        region_of -= region_of[0]
        region_N = np.bincount(region_of, weights=avail)
        O = int(rng.integers(P, 5 * P))
        stage = np.concatenate([np.arange(P), rng.integers(0, P, O - P)])
        Ds = rng.integers(1, 30, int(rng.integers(1, 8)))
        if rng.random() < 0.5:
            Ds = np.sort(Ds)
        V = int(rng.integers(1, 4))
        levels = np.round(rng.random((V, O)) * 10, 1)
        one_region = rng.random(V) < 0.5
        floor = np.where(rng.random(len(Ds)) < 0.3, rng.random(len(Ds)) * 10, -np.inf)
        best = np.where(rng.random(len(Ds)) < 0.3, rng.random(len(Ds)) * 10, np.inf)
        pool = (2.0 ** rng.integers(0, 4, O), rng.integers(0, K, O), stage, P)
        grid = (avail, region_of, region_N, allocate.kind_weights(K))
        args = (levels, one_region, floor, best, *pool, Ds, *grid)
        compiled, python = both(kernels._least_level, *_least_level_args(*args))
        assert_same(compiled, python)
        got = compiled[1][4]  # the answers, written over best's copy
        np.testing.assert_array_equal(got, kernels.least_level(*args))
        compiled = (got,)
        # each degree alone: starting a degree's search where the one before ended is exact
        alone = [py_least_level(levels, one_region, floor[i:i + 1], best[i:i + 1],
                                           *pool, Ds[i:i + 1], *grid)[0]
                 for i in range(len(Ds))]
        np.testing.assert_array_equal(compiled[0], alone)
        # each row alone, no floor: the least over the rows, where under best; the floor
        # only stops the search once an answer is down to it
        for i in range(len(Ds)):
            rows = [py_least_level(levels[v:v + 1], one_region[v:v + 1],
                                              np.array([-np.inf]), np.array([np.inf]), *pool,
                                              Ds[i:i + 1], *grid)[0] for v in range(V)]
            least = min([best[i], *rows])
            if least > floor[i]:
                assert compiled[0][i] == least
            else:
                assert floor[i] >= compiled[0][i] >= least


def test_the_least_cost():
    rng = np.random.default_rng(5)
    for _ in range(200):
        P = int(rng.integers(1, 6))
        O = int(rng.integers(P, 4 * P))
        stage = np.concatenate([np.arange(P), rng.integers(0, P, O - P)])
        level = np.round(rng.random(O) * 10, 1)  # ties on purpose
        args = (level, rng.random(O), stage, P, float(rng.random() * 10), 0.5)
        compiled, python = both(kernels._least_cost, *_sorted(*args))
        assert kernels.least_cost(*args) == compiled[0]
        assert compiled[0] == python[0]
        # against every threshold by brute force
        want = min((max(th, args[4]) + 0.5) * sum(args[1][(stage == s_) & (level <= th)].min()
                                                   for s_ in range(P))
                   for th in level if all(((stage == s_) & (level <= th)).any()
                                          for s_ in range(P)))
        assert compiled[0] == pytest.approx(want)



def test_the_hot_loops_allocate_no_arrays():
    """The loops a default search compiles on a first run, and those they call, take every
    array from their callers: numba compiles its array allocation apart for each type and
    shape, in each process."""
    allocating = {"empty", "zeros", "ones", "full", "array", "empty_like", "zeros_like",
                  "ones_like", "full_like", "copy", "arange"}
    hot = {k for h in jit._KERNELS if h.hot for k in h._closure()}
    assert len(hot) >= 10
    found = []
    for k in hot:
        tree = ast.parse(textwrap.dedent(inspect.getsource(k.py_func)))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in allocating):
                found.append(f"{k.name}: {ast.unparse(node)}")
    assert not found
