"""The resource-stage allocator: the dynamic program (two kinds) and the MIP (three or more)
give the cheapest allocation of every combination tried; a deadline stops a program and leaves
nothing behind."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from tests.test_planners import small_problem

from shoal.training.planners import allocate, search
from shoal.training.planners.allocate import (
    Bound,
    Memoised,
    Option,
    OutOfTime,
    Pool,
    PoolMemo,
    fastest,
    tradeoffs,
)
from shoal.training.planners.allocate import greedy as alloc_greedy
from shoal.training.planners.allocate import mip as alloc_mip
from shoal.training.planners.allocate import mixes as alloc_mixes
from shoal.training.planners.allocate import solve as alloc_solve
from shoal.training.planners.auto import branch


def random_stages(rng, K: int, P: int) -> list[list[Option]]:
    stages = []
    for _ in range(P):
        opts = [Option(k, tp, float(rng.uniform(0.5, 2.0)) / tp)
                for k in range(K) for tp in (1, 2) if rng.random() < 0.8]
        stages.append(opts or [Option(0, 1, 1.0)])
    return stages


def random_program(rng, K: int, most_D: int = 4):
    """A random allocation program: (D, stages, avail, price, total)."""
    P, D = int(rng.integers(1, 4)), int(rng.integers(1, most_D + 1))
    stages = random_stages(rng, K, P)
    avail = rng.integers(0, 3 * D + 2, size=K)
    price = rng.uniform(0.5, 3.0, size=K)
    return D, stages, avail, price, int(rng.integers(D, 4 * D + 1))


def allowed_options(opts, tau, relax):
    """The options a stage may use under the bound, by the rule itself: per GPU kind, its
    smallest TP (then the fastest) within ``tau``, and within ``tau * relax``; by kind, then
    TP."""
    keep = set()
    for lim in (tau, tau * relax):
        for k in {o.kind for o in opts}:
            fits = [o for o in opts if o.kind == k and o.time_s <= lim]
            if fits:
                keep.add(min(fits, key=lambda o: (o.tp, o.time_s)))
    return sorted(keep, key=lambda o: (o.kind, o.tp))


def every_allocation(stage_opts, D, avail, price, region_of, tau, total):
    """The cheapest allocation under the bound by trying every combination of the stages'
    combos (the program's choices, enumerated): (cost, usage) or None."""
    relax, extra = allocate.slots(D, total)
    K = len(avail)
    per_stage = []
    for opts in stage_opts:
        al = allowed_options(opts, tau, relax)
        combos, use, t_fast, t_slow, n_slow = alloc_mixes.combos_of(tuple(al), D, tuple(region_of), K)
        ok = (t_fast <= tau) & np.where(n_slow <= D - extra, t_slow <= tau * relax, t_slow <= tau)
        per_stage.append(use[ok])
    best = None
    for pick in itertools.product(*(range(len(u)) for u in per_stage)):
        usage = sum((u[i] for u, i in zip(per_stage, pick, strict=True)), np.zeros(K, int))
        if (usage <= avail).all():
            cost = float(usage @ price)
            if best is None or cost < best[0] - 1e-9:
                best = (cost, tuple(int(x) for x in usage))
    return best


FORMS = {"combo": 10**9, "option": 0}  # COMBO_COLUMNS_PER_OPTION that forces each MIP form


@pytest.mark.parametrize("form", ["combo", "option"])
@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("seed", range(8))
def test_the_program_finds_the_cheapest_allocation_under_a_bound(K, seed, form, monkeypatch):
    """Two kinds by the dynamic program, three and four by the MIP in each of its forms: the
    same cheapest cost (and the same feasibility) as every combination tried."""
    monkeypatch.setattr(alloc_mip, "COMBO_COLUMNS_PER_OPTION", FORMS[form])
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(6):
        D, stages, avail, price, total = random_program(rng, K)
        region_of = [int(k % 2) if seed % 2 or form == "combo" else 0 for k in range(K)]
        times = sorted({o.time_s for st in stages for o in st})
        tau = times[int(rng.integers(0, len(times)))] * float(rng.choice([1.0, 1.2]))
        got = alloc_solve.solve_at(stages, D, Pool(avail, price, region_of), tau, total)
        want = every_allocation(stages, D, avail, price, region_of, tau, total)
        assert (got is None) == (want is None)
        if got is not None:
            checked += 1
            assert float(np.asarray(got.usage) @ price) == pytest.approx(want[0], rel=1e-9)
            assert (np.asarray(got.usage) <= avail).all()
            assert all(sum(n for _, _, n in st) == D and len(st) <= 2 for st in got.per_stage)
            # the usage is the replicas' GPUs
            use = np.zeros(K, int)
            for st in got.per_stage:
                for k, tp, n in st:
                    use[k] += tp * n
            assert tuple(use) == got.usage
            if K > allocate.DP_KINDS:  # the MIP alone, also where each stage's cheapest fits
                relax, extra = allocate.slots(D, total)
                allowed = [alloc_greedy.allowed_options(o, tau, relax) for o in stages]
                for solve in (alloc_mip.solve_mip, alloc_mip.by_choices):  # and in each form
                    mip = solve(allowed, D, Pool(avail, price, region_of), Bound(tau, relax, extra), None)
                    assert float(np.asarray(mip.usage) @ price) == pytest.approx(want[0],
                                                                                 rel=1e-9)
    assert checked  # the seeds do reach feasible cases


@pytest.mark.parametrize("seed", range(4))
def test_the_mips_lp_relaxation_answers_only_when_its_vertex_is_integral(seed, monkeypatch):
    """The MIP without the mixing rules is first solved as its LP relaxation: its integral
    optimal vertices answer (no MIP run), fractional ones go on to the MIP; either way the
    cheapest cost of every combination tried. Both routes are taken over these programs."""
    from shoal import mip

    runs = {"integral": 0, "fractional": 0}
    solve = mip.Model.solve

    def counted(self, **kwargs):
        sol = solve(self, **kwargs)
        if kwargs.get("relaxed") and sol.x is not None:
            runs["integral" if np.allclose(sol.x, np.rint(sol.x), atol=1e-6)
                 else "fractional"] += 1
        return sol

    monkeypatch.setattr(mip.Model, "solve", counted)
    rng = np.random.default_rng(900 + seed)
    for _ in range(30):
        D, stages, avail, price, total = random_program(rng, 3, most_D=5)
        relax, extra = allocate.slots(D, total)
        times = sorted({o.time_s for st in stages for o in st})
        tau = times[int(rng.integers(0, len(times)))] * float(rng.choice([1.0, 1.2]))
        allowed = [alloc_greedy.allowed_options(o, tau, relax) for o in stages]
        if any(not al for al in allowed):
            continue
        got = alloc_mip.solve_mip(allowed, D, Pool(avail, price, [0, 0, 0]), Bound(tau, relax, extra), None)
        want = every_allocation(stages, D, avail, price, [0, 0, 0], tau, total)
        assert (got is None) == (want is None)
        if got is not None:
            assert float(np.asarray(got.usage) @ price) == pytest.approx(want[0], rel=1e-9)
            assert (np.asarray(got.usage) <= avail).all()
            assert all(sum(n for _, _, n in st) == D and len(st) <= 2 for st in got.per_stage)
    assert runs["integral"] > 0 and runs["fractional"] > 0
    # one stage, one replica: half a replica of TP 2 on the one GPU of kind 0 is the LP's
    # optimum (cost 2.5); the MIP's is the replica on kind 1 (cost 3)
    one = [[Option(0, 2, 1.0), Option(1, 1, 1.0)]]
    got = alloc_mip.solve_mip(one, 1, Pool(np.array([1, 4, 0]), np.array([1.0, 3.0, 1.0]),
                                           [0, 0, 0]), Bound(1.0, 1.0, 0), None)
    assert got.per_stage == (((1, 1, 1),),) and got.usage == (0, 1, 0)


def test_an_lp_cut_short_does_not_answer_for_the_mip(monkeypatch):
    """A relaxation stopped before its optimum (here: an integral point that keeps every row
    but is not the cheapest) is not read as the MIP's answer: the MIP runs."""
    from shoal import mip

    solve = mip.Model.solve

    def cut_short(self, **kwargs):
        if kwargs.get("relaxed"):
            return mip.Solution(status="Time limit reached", x=np.array([0.0, 1.0]),
                                objective=3.0, bound=0.0, time_s=0.0, infeasible=False)
        return solve(self, **kwargs)

    monkeypatch.setattr(mip.Model, "solve", cut_short)
    one = [[Option(0, 2, 1.0), Option(1, 1, 1.0)]]
    got = alloc_mip.solve_mip(one, 1, Pool(np.array([2, 4, 0]), np.array([1.0, 3.0, 1.0]),
                                           [0, 0, 0]), Bound(1.0, 1.0, 0), None)
    assert got.per_stage == (((0, 2, 1),),) and got.usage == (2, 0, 0)


def test_a_model_checks_a_point_against_its_bounds_and_rows():
    from shoal.mip import Model

    m = Model(maximize=False)
    x, y = m.var(0, 3, 1.0, integer=True), m.var(0, 2, 1.0, integer=True)
    m.row([x, y], [1, 2], lo=2, hi=5)
    assert m.satisfied(np.array([1.0, 1.0]))
    assert not m.satisfied(np.array([4.0, 0.0]))  # x over its bound
    assert not m.satisfied(np.array([2.0, 2.0]))  # the row over 5
    assert not m.satisfied(np.array([1.0, 0.0]))  # the row under 2
    assert not m.satisfied(np.array([1.0]))
    # the relaxation of x + y >= 1.5, min x + 2y: x = 1.5 (the MIP: x = 2)
    m2 = Model(maximize=False)
    a, b = m2.var(0, 5, 1.0, integer=True), m2.var(0, 5, 2.0, integer=True)
    m2.row([a, b], [2, 2], lo=3)
    assert m2.solve(time_limit_s=10, relaxed=True).x[a] == pytest.approx(1.5)
    assert m2.solve(time_limit_s=10, exact=True).x[a] == pytest.approx(2.0)


def test_each_stage_on_its_cheapest_combo_is_the_cheapest_allocation_when_it_fits():
    """Three kinds, a pool large enough for every stage's own cheapest combo: the program
    answers without the MIP, at the cost of every combination tried."""
    rng = np.random.default_rng(7)
    for _ in range(10):
        P, D = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        stages = random_stages(rng, 3, P)
        avail, price = np.full(3, 2 * D * P), rng.uniform(0.5, 3.0, size=3)
        tau = max(min(o.time_s for o in st) for st in stages) * 1.5
        relax, extra = allocate.slots(D, None)
        allowed = [alloc_greedy.allowed_options(o, tau, relax) for o in stages]
        own = alloc_greedy.each_cheapest(allowed, D, Pool(avail, price, [0, 0, 0]), Bound(tau, relax, extra))
        want = every_allocation(stages, D, avail, price, [0, 0, 0], tau, None)
        assert own is not None and want is not None
        assert float(np.asarray(own.usage) @ price) == pytest.approx(want[0], rel=1e-9)
        assert alloc_solve.solve_at(stages, D, Pool(avail, price, [0, 0, 0]), tau) == own
        assert alloc_greedy.each_cheapest(allowed, D, Pool(np.asarray(own.usage) - 1, price,
                                                           [0, 0, 0]),
                                          Bound(tau, relax, extra)) is None


@pytest.mark.parametrize("K", [3, 4])
@pytest.mark.parametrize("seed", range(6))
def test_the_quick_tests_agree_with_every_combination(K, seed):
    """The compiled tests before the MIP, against every combination tried: the LP bound
    (``_load``) rules out only bounds no allocation meets, and a greedy fill, in one stage
    order or in several, is an allocation under the bound within the pool (D replicas a
    stage, at most two options of one region, no option over the bound for the busiest
    pipelines)."""
    rng = np.random.default_rng(500 + seed)
    W = allocate.kind_weights(K).T
    seen = {"ruled out": 0, "filled": 0}
    for _ in range(12):
        P, D = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        stages = random_stages(rng, K, P)
        avail = rng.integers(0, 3 * D + 2, size=K)
        regions = [int(k % 2) for k in range(K)] if seed % 2 else [0] * K
        total = int(rng.integers(D, 4 * D + 1))
        relax, extra = allocate.slots(D, total)
        times = sorted({o.time_s for st in stages for o in st})
        tau = times[int(rng.integers(0, len(times)))] * float(rng.choice([1.0, 1.2]))
        flat = alloc_greedy.flatten(stages)
        keep = np.zeros(len(flat.opts), dtype=bool)
        if not alloc_greedy.keep_options(flat.start, flat.kinds, flat.tps, flat.times, K, tau,
                                         tau * relax, keep, np.empty(K, np.int64)):
            continue
        assert flat.allowed(keep) == [allowed_options(st, tau, relax) for st in stages]
        want = every_allocation(stages, D, avail, np.ones(K), regions, tau, total)
        load, at = alloc_greedy.gpu_load(flat.start, flat.kinds, flat.tps, flat.times, keep,
                                  avail.astype(float), W, tau, D, extra)
        if load > 1.0:
            assert want is None
            seen["ruled out"] += 1
            continue
        found = []
        for orders in (1, allocate.GREEDY_ORDERS):
            left = np.empty(K, dtype=np.int64)
            out = np.empty((P, 6), dtype=np.int64)
            found.append(alloc_greedy.greedy(flat.start, flat.kinds, flat.tps, flat.times, keep,
                                          np.array(regions), avail.astype(np.int64), tau,
                                          extra, D, W[:, at], orders, left, out))
            if not found[-1]:
                continue
            assert want is not None
            seen["filled"] += 1
            assert (left >= 0).all()
            use = np.zeros(K, dtype=np.int64)
            for (ka, ta, na, kb, tb, nb), opts in zip(out.tolist(), stages, strict=True):
                t = {(o.kind, o.tp): o.time_s for o in opts}
                mix = [(ka, ta, na)] + ([(kb, tb, nb)] if kb >= 0 else [])
                assert sum(n for _, _, n in mix) == D and all(n >= 1 for _, _, n in mix)
                assert len({regions[k] for k, _, _ in mix}) == 1
                assert min(t[(k, tp)] for k, tp, _ in mix) <= tau
                for k, tp, n in mix:
                    assert t[(k, tp)] <= tau * relax * (1 + 1e-12)
                    assert t[(k, tp)] <= tau or n <= D - extra
                    use[k] += n * tp
            assert (use == avail - left).all()
        assert found[0] <= found[1]  # the first orders are tried first
    assert seen["filled"]


@pytest.mark.parametrize("slow", [0, 1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_a_bound_that_leaves_two_kinds_is_the_dynamic_program_on_them(slow, seed, monkeypatch):
    """Three kinds, one of them (``slow``) over the bound on every stage: the program answers
    on the other two by the dynamic program (no MIP), with the cheapest cost of every
    combination tried, in the pool's own kind numbers."""
    def no_mip(*args, **kwargs):
        raise AssertionError("the MIP was run")

    monkeypatch.setattr(alloc_solve, "solve_mip", no_mip)
    rng = np.random.default_rng(300 + seed)
    checked = 0
    for _ in range(6):
        P, D = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        stages = [[Option(o.kind, o.tp, 50.0 if o.kind == slow else o.time_s) for o in st]
                  for st in random_stages(rng, 3, P)]
        stages = [st if any(o.kind != slow for o in st) else [*st, Option((slow + 1) % 3, 1, 1.5)]
                  for st in stages]
        avail = rng.integers(0, 3 * D + 2, size=3)
        price = rng.uniform(0.5, 3.0, size=3)
        regions = [0, 0, 0] if seed % 2 else [0, 1, 1]
        total = int(rng.integers(D, 4 * D + 1))
        tau = max(min(o.time_s for o in st) for st in stages) * float(rng.choice([1.0, 1.3]))
        for cheapest in (True, False):
            got = alloc_solve.solve_at(stages, D, Pool(avail, price, regions), tau, total, cheapest=cheapest)
            want = every_allocation(stages, D, avail, price, regions, tau, total)
            assert (got is None) == (want is None)
            if got is None:
                continue
            checked += 1
            assert float(np.asarray(got.usage) @ price) == pytest.approx(want[0], rel=1e-9)
            assert got.usage[slow] == 0 and (np.asarray(got.usage) <= avail).all()
            use = np.zeros(3, int)
            for st, opts in zip(got.per_stage, stages, strict=True):
                assert sum(n for _, _, n in st) == D and len({regions[k] for k, _, _ in st}) == 1
                for k, tp, n in st:
                    assert (k, tp) in {(o.kind, o.tp) for o in opts}
                    use[k] += tp * n
            assert tuple(use) == got.usage
    assert checked


@pytest.mark.parametrize("form", ["combo", "option"])
@pytest.mark.parametrize("regions", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_the_mip_over_the_choices_finds_the_cheapest_allocation(seed, regions, form,
                                                                monkeypatch):
    """``_by_choices`` in each form, on one region and on two (one region takes combos where
    they are few): the cheapest cost and the feasibility of every combination tried."""
    monkeypatch.setattr(alloc_mip, "COMBO_COLUMNS_PER_OPTION", FORMS[form])
    rng = np.random.default_rng(300 + seed)
    checked = 0
    for _ in range(6):
        D, stages, avail, price, total = random_program(rng, 3)
        region_of = [k % regions for k in range(3)]
        relax, extra = allocate.slots(D, total)
        times = sorted({o.time_s for st in stages for o in st})
        tau = times[int(rng.integers(0, len(times)))] * float(rng.choice([1.0, 1.2]))
        allowed = [allowed_options(st, tau, relax) for st in stages]
        if not all(any(o.time_s <= tau for o in al) for al in allowed):
            continue  # a stage with no replica for the busiest pipelines: never asked
        got = alloc_mip.by_choices(allowed, D, Pool(avail, price, region_of), Bound(tau, relax, extra), None)
        want = every_allocation(stages, D, avail, price, region_of, tau, total)
        assert (got is None) == (want is None)
        if got is not None:
            checked += 1
            assert float(np.asarray(got.usage) @ price) == pytest.approx(want[0], rel=1e-9)
            assert all(sum(n for _, _, n in st) == D for st in got.per_stage)
    assert checked


@pytest.mark.parametrize("form", ["combo", "option"])
@pytest.mark.parametrize("seed", range(6))
def test_fastest_is_the_smallest_bound_met(seed, form, monkeypatch):
    """``fastest`` (a search over feasibility tests, the cheapest at the end) against every
    bound tried in turn, with three kinds (the MIP), from no bound and from every bound up to
    the answer."""
    monkeypatch.setattr(alloc_mip, "COMBO_COLUMNS_PER_OPTION", FORMS[form])
    rng = np.random.default_rng(100 + seed)
    regions = [0, 1, 1] if form == "combo" else [0, 0, 0]
    for _ in range(4):
        D, stages, avail, price, total = random_program(rng, 3)
        relax, _ = allocate.slots(D, total)
        taus = sorted({t for st in stages for o in st for t in (o.time_s, o.time_s / relax)})
        want = next((t for t in taus
                     if every_allocation(stages, D, avail, price, regions, t, total)), None)
        got = fastest(stages, D, Pool(avail, price, regions), total=total)
        assert (got is None) == (want is None)
        # any allocation at the least bottleneck, not necessarily the cheapest
        met = fastest(stages, D, Pool(avail, price, regions), total=total, cheapest=False)
        assert (met is None) == (want is None)
        if got is not None:
            assert got.bottleneck_s == want
            cheapest = every_allocation(stages, D, avail, price, regions, want, total)[0]
            assert float(np.asarray(got.usage) @ price) == pytest.approx(cheapest, rel=1e-9)
            assert met.bottleneck_s == want and (np.asarray(met.usage) <= avail).all()
            assert float(np.asarray(met.usage) @ price) >= cheapest * (1 - 1e-9)
            relax, extra = allocate.slots(D, total)
            use = np.zeros(3, dtype=np.int64)
            for st, opts in zip(met.per_stage, stages, strict=True):
                assert sum(n for _, _, n in st) == D and len(st) <= 2
                assert len({regions[k] for k, _, _ in st}) == 1
                t = {(o.kind, o.tp): o.time_s for o in opts}
                assert min(t[(k, tp)] for k, tp, _ in st) <= want
                assert all(t[(k, tp)] <= want * relax for k, tp, _ in st)
                for k, tp, n in st:
                    use[k] += n * tp
            assert tuple(use) == met.usage
        # from any bound at or below the answer (a caller's), the search gallops up from it
        # and finds the same allocation
        for t in taus:
            if want is not None and t > want:
                break
            again = fastest(stages, D, Pool(avail, price, regions), at_least=t, total=total)
            assert (again is None) == (got is None)
            assert again is None or again == got


def test_any_allocation_at_the_least_bottleneck_is_not_always_the_cheapest():
    """``fastest(cheapest=False)`` on three kinds answers with the allocation the search met
    at the least bottleneck (the greedy fill's), which is not always the cheapest one."""
    differ = same = 0
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        for _ in range(4):
            D, stages, avail, price, total = random_program(rng, 3)
            cheapest = fastest(stages, D, Pool(avail, price, [0, 0, 0]), total=total)
            met = fastest(stages, D, Pool(avail, price, [0, 0, 0]), total=total, cheapest=False)
            if cheapest is not None:
                assert met.bottleneck_s == cheapest.bottleneck_s
                differ += float(np.asarray(met.usage) @ price) > float(
                    np.asarray(cheapest.usage) @ price) * (1 + 1e-9)
                same += met == cheapest
    assert differ and same


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_fronts_kept_for_a_larger_pool_answer_smaller_pools_as_fresh_programs(K, seed):
    """One memo whose program fronts are computed for a large pool, asked about smaller pools
    in turn (and at other bounds): the same allocations, bottlenecks and trade-offs as
    programs run from scratch on each pool."""

    rng = np.random.default_rng(300 + seed)
    reused = 0
    for _ in range(6):
        P, D = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        stages = random_stages(rng, K, P)
        price = rng.uniform(0.5, 3.0, size=K)
        region_of = [0, int(rng.integers(0, 2))][:K]
        total = int(rng.integers(D, 4 * D + 1))
        big = rng.integers(D, 6 * D + 4, size=K)
        memo = PoolMemo()
        memo.fronts.raise_ceiling(big)
        first = fastest(stages, D, Pool(big, price, region_of), total=total)
        tight = big if first is None else np.array(first.usage)  # no GPU to spare
        for step in range(6):
            avail = {0: big, 1: tight}.get(step, np.array([int(rng.integers(0, b + 1))
                                                           for b in big]))
            at_least = float(rng.choice([0.0, 0.0, 0.6]))
            shared = PoolMemo()  # a fresh allocation memo, the fronts shared
            shared.fronts = memo.fronts
            kept = sum(len(v) for v in memo.fronts._fronts.values())
            for fn in (fastest, tradeoffs):
                want = fn(stages, D, Pool(avail, price, region_of), at_least=at_least, total=total)
                got = fn(stages, D, Pool(avail, price, region_of), at_least=at_least, total=total,
                         memo=Memoised(shared, ("shape",)))
                assert got == want
            reused += step > 0 and kept > 0
    assert reused  # later pools did find fronts kept


def test_a_deadline_stops_the_program_and_nothing_is_remembered():
    stages = random_stages(np.random.default_rng(0), 3, 3)
    avail, price = np.array([8, 8, 8]), np.array([1.0, 2.0, 3.0])
    memo = PoolMemo()
    with pytest.raises(OutOfTime):
        fastest(stages, 2, Pool(avail, price, [0, 0, 0]), memo=Memoised(memo, ("k",)),
                deadline=time.perf_counter() - 1.0)
    assert memo.get(("fastest", 2, None, "k"), avail) is None
    assert fastest(stages, 2, Pool(avail, price, [0, 0, 0]), memo=Memoised(memo, ("k",))) is not None


def test_a_budget_that_runs_out_inside_an_allocation_returns_the_plans_found(monkeypatch):
    pb = small_problem({"us-central1-a": (4, 4)}, 6, 1024, 32, 4)
    full = search(pb, strategy="auto", objective="max-throughput")
    calls = []
    real = branch.pair_specs

    def specs(*args):
        if calls:  # the budget runs out in the second pair's allocation
            raise OutOfTime
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(branch, "pair_specs", specs)
    cut = search(pb, strategy="auto", objective="max-throughput")
    assert cut.stats.truncated and not full.stats.truncated
    assert cut.ranked and cut.ranked[0].iteration_time_s >= full.ranked[0].iteration_time_s
