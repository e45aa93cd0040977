"""The resource-stage allocator: the three-kind Pareto sweep and the completion test give the
same allocations as the plain program; a deadline stops a program and leaves nothing behind."""

from __future__ import annotations

import time

import numpy as np
import pytest
from tests.test_planners import small_problem

from shoal.training.planners import allocate, auto, search
from shoal.training.planners.allocate import Option, OutOfTime, PoolMemo, fastest, tradeoffs


def dominated(U: np.ndarray) -> np.ndarray:
    le = (U[None, :, :] <= U[:, None, :]).all(axis=2)  # [i, j]: j <= i everywhere
    return (le & ~np.eye(len(U), dtype=bool)).any(axis=1)


@pytest.mark.parametrize("seed", range(20))
def test_three_kind_front_is_the_undominated_set(seed):
    rng = np.random.default_rng(seed)
    U = rng.integers(0, int(rng.integers(2, 30)), size=(int(rng.integers(1, 300)), 3))
    first = np.unique(U, axis=0, return_index=True)[1]
    keep = allocate._front3(U)
    assert set(np.flatnonzero(keep)) == set(first[~dominated(U[first])])
    # the same indices, in the same order, as the general program's prune of the distinct rows
    price = rng.random(3)
    assert list(allocate._prune3(U, price)) == list(first[allocate._prune(U[first], price)])


def random_stages(rng, K: int, P: int) -> list[list[Option]]:
    stages = []
    for _ in range(P):
        opts = [Option(k, tp, float(rng.uniform(0.5, 2.0)) / tp)
                for k in range(K) for tp in (1, 2) if rng.random() < 0.8]
        stages.append(opts or [Option(0, 1, 1.0)])
    return stages


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("seed", range(6))
def test_pruned_program_gives_the_plain_programs_allocations(K, seed, monkeypatch):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(4):
        P, D = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        avail = rng.integers(0, 3 * D + 2, size=K)
        price = rng.uniform(0.5, 3.0, size=K)
        region_of = [int(k % 2) if seed % 2 else 0 for k in range(K)]
        cases.append((random_stages(rng, K, P), D, avail, price, region_of, 8 * P))

    def run():
        return [(fastest(o, D, a, p, r, total=n), tradeoffs(o, D, a, p, r, total=n))
                for o, D, a, p, r, n in cases]

    got = run()
    # the plain program: no completion test, the general dominance prune
    monkeypatch.setattr(allocate, "_weights", lambda K: np.zeros((K, 1), dtype=np.int64))
    monkeypatch.setattr(allocate, "GRID_WORK", 0)
    assert got == run()
    assert any(f is not None for f, _ in got)


def test_a_deadline_stops_the_program_and_nothing_is_remembered():
    stages = random_stages(np.random.default_rng(0), 3, 3)
    avail, price = np.array([8, 8, 8]), np.array([1.0, 2.0, 3.0])
    memo = PoolMemo()
    with pytest.raises(OutOfTime):
        fastest(stages, 2, avail, price, [0, 0, 0], memo=memo, key=("k",),
                deadline=time.perf_counter() - 1.0)
    assert memo.get(("fastest", 2, None, "k"), avail) is None
    assert fastest(stages, 2, avail, price, [0, 0, 0], memo=memo, key=("k",)) is not None


def test_a_budget_that_runs_out_inside_an_allocation_returns_the_plans_found(monkeypatch):
    pb = small_problem({"us-central1-a": (4, 4)}, 6, 1024, 32, 4)
    full = search(pb, strategy="auto", objective="max-throughput")
    calls = []
    real = auto._specs

    def specs(*args):
        if calls:  # the budget runs out in the second pair's allocation
            raise OutOfTime
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(auto, "_specs", specs)
    cut = search(pb, strategy="auto", objective="max-throughput")
    assert cut.stats.truncated and not full.stats.truncated
    assert cut.ranked and cut.ranked[0].iteration_time_s >= full.ranked[0].iteration_time_s
