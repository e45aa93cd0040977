"""Replay: switch costs, re-planning across pools, policies, the accounting properties, and the
`shoal replay` command."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from shoal.cli import app
from shoal.elastic.policy import (
    HORIZON_GAPS,
    POLICIES,
    Futures,
    Rollout,
    expected_gap_s,
    oracle_choices,
)
from shoal.elastic.replan import Replanner
from shoal.elastic.replay import plan_trace, simulate
from shoal.elastic.switch import (
    UnderWay,
    checkpoint_every_s,
    loss_gaps_s,
    running,
    switch_cost,
    training_share,
)
from shoal.elastic.traces import State, Trace
from shoal.errors import InfeasibleError, SpecError
from shoal.problem import build_problem
from shoal.specs.scenario import parse_scenario
from shoal.training.planners import Reuse, search
from shoal.training.planners.common import fits, usage
from shoal.units import parse_bandwidth

A, B = "us-central1-a", "us-central1-b"
A100, V100 = "A100-40GB", "V100-16GB"
KEYS = [(A100, A), (V100, A), (A100, B), (V100, B)]
SCENARIO = {
    "model": {"name": "small", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
              "vocab_size": 32000, "max_seq_len": 2048},
    # the stack of Sailor's runs: its slow gradient rings make the best plans of these pools
    # take both GPU types, which the switch cases below need
    "job": {"global_batch": 32, "seq_len": 2048, "stack": "sailor-testbed"},
    "pool": {"regions": {"us-central1": {"zones": {
        A: {"gpus": {A100: 4, V100: 4}}, B: {"gpus": {A100: 4, V100: 4}}}}},
        "gpus_per_node": {A100: 4, V100: 4}},
    "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "20us"},
                             "same_region": {"bandwidth": "25Gbps", "latency": "1ms"}}},
}


@pytest.fixture(scope="module")
def problem():
    return build_problem(parse_scenario(copy.deepcopy(SCENARIO)))


@pytest.fixture(scope="module")
def replanner(problem):
    """Shared across tests: each pool is searched once."""
    return Replanner(problem)


def every_10min(problem):
    """``problem`` with a checkpoint every 10 minutes of training (not Young's interval)."""
    return replace(problem, switching=problem.switching.model_copy(
        update={"checkpoint_interval": 600.0}))


def pool(a100a=4, v100a=4, a100b=4, v100b=4) -> dict:
    return dict(zip(KEYS, (a100a, v100a, a100b, v100b), strict=True))


def trace(states: list[tuple[float, dict]], end_s: float, notice: dict | None = None) -> Trace:
    notice = notice or {}
    return Trace(tuple(State(t, a, notice.get(i, 0.0)) for i, (t, a) in enumerate(states)),
                 end_s, "test")


# ------------------------------------------------------------------------------ switch costs


def test_switch_cost_parts(problem, replanner):
    big = running(problem, replanner.plan(pool()).ranked[0])
    small = running(problem, replanner.plan(pool(0, 0, 4, 4)).ranked[0])
    sw = problem.switching
    assert big.save_s > 0 and big.load_s >= big.save_s
    # a chosen move saves first, rebuilds, loads and warms up
    c = switch_cost(problem, big, small, forced=False, notice_s=0.0, since_checkpoint_s=300.0)
    assert c.save_s == big.save_s and c.redo_s == 0.0
    assert c.restart_s == sw.restart and c.load_s == small.load_s
    assert c.warmup_s == pytest.approx(sw.warmup_iterations * small.iteration_time_s)
    # forced without notice: the work since the last checkpoint is redone at the new speed
    c = switch_cost(problem, big, small, forced=True, notice_s=0.0, since_checkpoint_s=300.0)
    assert c.save_s == 0.0
    assert c.redo_s == pytest.approx(300.0 / big.iteration_time_s * small.iteration_time_s)
    # ... unless the notice leaves time to save
    c = switch_cost(problem, big, small, forced=True, notice_s=big.save_s + 1,
                    since_checkpoint_s=300.0)
    assert c.save_s == big.save_s and c.redo_s == 0.0
    # new VMs only when the new plan needs nodes the old one did not rent
    shrink = switch_cost(problem, big, small, forced=False, notice_s=0, since_checkpoint_s=0)
    grow = switch_cost(problem, small, big, forced=False, notice_s=0, since_checkpoint_s=0)
    fresh = switch_cost(problem, None, big, forced=False, notice_s=0, since_checkpoint_s=0)
    assert shrink.startup_s == (0.0 if all(small.nodes[k] <= big.nodes.get(k, 0)
                                           for k in small.nodes) else sw.node_startup)
    assert grow.startup_s == sw.node_startup and fresh.startup_s == sw.node_startup
    assert fresh.save_s == 0.0
    assert c.total_s == pytest.approx(c.save_s + c.redo_s + c.restart_s + c.startup_s
                                      + c.load_s + c.warmup_s)
    # moving again while a switch is under way: nothing new to save, no wait for VMs that
    # switch is not starting
    again = switch_cost(problem, big, small, forced=False, notice_s=0, since_checkpoint_s=0,
                        under_way=UnderWay(before_redo=True))
    assert again.save_s == 0.0 and again.wait_s == 0.0
    assert again.total_s == pytest.approx(shrink.total_s - shrink.save_s)
    # ... nor for VMs it is starting that the new plan does not take
    k = next(k for k in small.nodes if big.nodes.get(k, 0) > 0)
    others = {j: n for j, n in big.nodes.items() if j not in small.nodes}
    if others:
        c = switch_cost(problem, big, small, forced=False, notice_s=0, since_checkpoint_s=0,
                        under_way=UnderWay(before_redo=True, booting=others, boot_left_s=100.0))
        assert c.wait_s == 0.0
    # ... and for those it takes, as long as they take to come up (beyond its own start-up);
    # work owed is redone after that
    c = switch_cost(problem, big, small, forced=False, notice_s=0, since_checkpoint_s=0,
                    under_way=UnderWay(before_redo=True, booting={k: big.nodes[k]},
                                       boot_left_s=1000.0),
                    lost_iterations=3.0)
    assert c.wait_s == pytest.approx(1000.0 - c.startup_s) and c.save_s == 0.0
    assert c.redo_s == pytest.approx(3.0 * small.iteration_time_s)
    assert c.total_s == pytest.approx(again.total_s + c.wait_s + c.redo_s)
    assert c.up_s == pytest.approx(1000.0)
    # VMs up once the save and the start-up are done; none to start: 0
    assert grow.up_s == pytest.approx(grow.save_s + sw.node_startup) and again.up_s == 0.0


def test_checkpoint_interval_young_or_fixed(problem, replanner):
    """``auto``: Young's interval sqrt(2 x save x mean time between GPU losses), the losses
    counted over the trace so far with the prior gap as one; a number: that interval. Each
    checkpoint stalls training for the save: the share that trains is every / (every + save)."""
    big = running(problem, replanner.plan(pool()).ranked[0])
    assert big.save_s > 0
    assert checkpoint_every_s(problem, big, 5000.0) == pytest.approx(
        math.sqrt(2 * big.save_s * 5000.0))
    assert checkpoint_every_s(every_10min(problem), big, 5000.0) == 600.0
    assert training_share(big, 600.0) == pytest.approx(600.0 / (600.0 + big.save_s))
    assert training_share(replace(big, save_s=0.0), 0.0) == 1.0
    # losses at 100 s (zone b's A100s) and 700 s (zone a's V100s); GPUs coming back are none
    times = [0.0, 100.0, 400.0, 700.0]
    avails = [pool(), pool(4, 4, 0, 4), pool(), pool(4, 0, 4, 4)]
    assert loss_gaps_s(times, avails, 3600.0) == pytest.approx(
        [3600.0, 3700.0 / 2, 4000.0 / 2, 4300.0 / 3])


def test_young_interval_loses_less_work_to_a_forced_move(problem, replanner):
    """Zone b's GPUs go without notice after 50 minutes: at a checkpoint every 10 minutes the
    move redoes what was trained since the last one; at Young's interval (under a minute here)
    far less, for a few checkpoints' stalls, and more tokens."""
    tr = trace([(0.0, pool()), (3000.0, pool(4, 4, 0, 0))], 2 * 3600.0)
    opts = plan_trace(problem, tr, replanner)
    runs = {every: simulate(replace(problem, switching=problem.switching.model_copy(
        update={"checkpoint_interval": every})), tr, opts, "never") for every in ("auto", 600.0)}
    young, fixed = runs["auto"], runs[600.0]
    assert [s.decision for s in young.steps] == ["start", "forced"]
    first = fixed.steps[0]
    assert first.checkpoint_every_s == 600.0
    lost = first.train_s % 600.0 / first.plan.iteration_time_s
    assert fixed.steps[1].switch.redo_s == pytest.approx(
        lost * fixed.steps[1].plan.iteration_time_s)
    every = young.steps[0].checkpoint_every_s
    assert every == pytest.approx(math.sqrt(2 * first.plan.save_s * 3600.0)) and every < 60.0
    assert young.steps[1].switch.redo_s < every / first.plan.iteration_time_s * \
        young.steps[1].plan.iteration_time_s
    assert young.checkpoint_s > fixed.checkpoint_s > 0
    assert young.tokens > fixed.tokens


def test_checkpoint_grows_with_the_optimizer_state(problem, replanner):
    cand = replanner.plan(pool()).ranked[0]
    adam = running(problem, cand)
    sgd_job = problem.job.model_copy(update={"optimizer": "sgd"})
    sgd = running(replace(problem, job=sgd_job), cand)
    assert sgd.save_s == pytest.approx(adam.save_s * 8 / 12)


# ------------------------------------------------------------------------------ re-planning


def test_replanner_matches_cold_search_on_every_pool(problem):
    rp = Replanner(problem)
    seq = [pool(), pool(4, 0, 4, 4), pool(0, 0, 4, 4), pool(4, 4, 4, 0), pool(4, 0, 0, 4),
           pool(4, 0, 0, 0), pool(), pool(4, 0, 4, 4)]
    for avail in seq:
        warm = rp.plan(avail).ranked[0]
        cold = search(replace(problem, avail=avail)).ranked[0]
        assert warm.iteration_time_s <= cold.iteration_time_s * (1 + 1e-9)
    assert rp.calls[-1].remembered and not rp.calls[1].remembered
    assert any(c.from_larger for c in rp.calls)  # the bounded check search ran, and held


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(walk=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 2, 4, 6, 8])),
                     min_size=4, max_size=8),
       objective=st.sampled_from(["max-throughput", "min-cost"]))
def test_shared_reuse_gives_the_cold_search_result(problem, walk, objective):
    """What one search leaves for the next (estimates, allocations and placements remembered
    on larger pools) changes no result: along a walk of pools, a search sharing ``Reuse``
    returns the cold search's best plan."""
    pb = replace(problem, avail={k: 8 for k in KEYS})
    reuse = Reuse()
    cur = dict(pb.avail)
    for i, n in walk:
        cur = {**cur, KEYS[i]: n}
        p = replace(pb, avail=dict(cur))
        try:
            cold = search(p, objective=objective).ranked[0]
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                search(p, objective=objective, reuse=reuse)
            continue
        warm = search(p, objective=objective, reuse=reuse).ranked[0]
        assert warm.spec == cold.spec
        assert warm.iteration_time_s == cold.iteration_time_s


def test_seeds_spare_the_search_nothing(problem):
    """Plans given as seeds (a re-plan's plans of earlier pools) are costed with the search's,
    not as its incumbent: the search builds and tunes every plan it builds without them (as
    an incumbent they would spare it plans whose tuned boundaries beat them), so it returns
    nothing worse than either."""
    pools = (pool(), pool(4, 4, 4, 0), pool(4, 0, 4, 4), pool(0, 4, 4, 4))
    ranked = [c.spec for a in pools for c in search(replace(problem, avail=a)).ranked]
    for small in pools[1:]:
        p = replace(problem, avail=small)
        seeds = tuple(sp for sp in ranked if fits(usage(sp), small))  # its own best among them
        cold = search(p)
        seeded = search(p, seeds=seeds)
        assert seeded.stats.candidates_costed >= cold.stats.candidates_costed
        assert seeded.ranked[0].iteration_time_s <= cold.ranked[0].iteration_time_s * (1 + 1e-12)
        got = {c.spec for c in seeded.ranked}
        assert all(c.spec in got or c.iteration_time_s >= seeded.ranked[-1].iteration_time_s
                   for c in cold.ranked)


def test_a_search_the_budget_cuts_is_marked(problem):
    """A state whose search the time budget ends early says so (``ReplanCall.timed_out``, the
    replay's ``search_timed_out``); asked again, it is answered from memory and still says so."""
    full = Replanner(problem).plan(pool())
    assert not full.stats.timed_out
    rp = Replanner(problem, budget_s=1e-9)
    with pytest.raises(InfeasibleError) as err:  # cut before any plan
        rp.plan(pool())
    assert err.value.binding == "time budget" and rp.calls[-1].timed_out
    # given a plan (a hint, costed after the cut search), the cut search returns it
    rp = Replanner(problem, budget_s=1e-9)
    res = rp.plan(pool(), hints=[full.ranked[0].spec])
    assert res.ranked[0].spec == full.ranked[0].spec
    assert res.stats.timed_out and res.stats.truncated
    assert rp.calls[-1].timed_out and not rp.calls[-1].remembered
    rp.plan(pool())
    assert rp.calls[-1].remembered and rp.calls[-1].timed_out


def test_replanner_costs_the_hints_that_fit(problem):
    """A hint that fits the pool is a seed of the search (its plan or a better one comes
    back); one that needs GPUs the pool lacks is left out."""
    small = pool(4, 0, 4, 4)
    cold = search(replace(problem, avail=small)).ranked[0]
    big = search(replace(problem, avail=pool())).ranked[0]
    assert usage(big.spec).get((V100, A), 0) > 0  # does not fit ``small``
    rp = Replanner(problem)
    got = rp.plan(small, hints=(big.spec, cold.spec)).ranked[0]
    assert rp.calls[-1].seeds == 1
    assert got.iteration_time_s <= cold.iteration_time_s * (1 + 1e-9)


def test_replanner_raises_when_nothing_fits(problem):
    rp = Replanner(problem)
    with pytest.raises(InfeasibleError, match="no GPUs"):
        rp.plan(pool(0, 0, 0, 0))


# ------------------------------------------------------------------------------ policies


def test_expected_gap_learns_from_the_trace():
    assert expected_gap_s([0.0], 3600.0) == 3600.0
    assert expected_gap_s([0.0, 600.0, 1200.0], 3600.0) == pytest.approx((3600 + 1200) / 3)


def test_futures_replay_the_changes_seen():
    """The sampled continuations only take gaps and count changes the trace has shown (the
    prior gap as one more gap), each change clipped to between 0 and the most seen, and are the
    same each time for the same states."""
    seen = [State(0.0, pool()), State(500.0, pool(0, 4, 4, 4)), State(1200.0, pool(0, 4, 4, 0)),
            State(1400.0, pool(4, 4, 4, 0))]
    f = Futures(seen, 3600.0)
    gaps = {3600.0, 500.0, 700.0, 200.0}
    deltas = {(-4, 0, 0, 0), (0, 0, 0, -4), (4, 0, 0, 0)}
    assert f.horizon_s == pytest.approx(HORIZON_GAPS * (3600 + 1400) / 4)
    steps = 0
    for path in f.paths:
        t, a = 0.0, np.array([4, 4, 4, 0], dtype=float)
        for when, b in path:
            assert round(when - t, 6) in gaps and when < f.horizon_s
            assert any(np.array_equal(b, np.clip(a + np.array(dd), 0, 4)) for dd in deltas)
            assert ((b >= 0) & (b <= 4)).all()
            t, a = when, b
            steps += 1
    assert steps > 0
    assert [[(w, list(b)) for w, b in p] for p in Futures(seen, 3600.0).paths] == \
        [[(w, list(b)) for w, b in p] for p in f.paths]
    assert all(p == [] for p in Futures(seen[:1], 3600.0).paths)  # no change seen: none comes


def test_rollout_pays_each_cut_as_a_forced_move(problem, replanner):
    """A plan's worth over the futures: with no change to come, its speed over the horizon less
    its switch, its checkpoints' stalls left out; when a change takes its GPUs, the forced move
    to a known plan that fits is paid (redoing half its checkpoint interval) and that plan
    trains on."""
    big = plan_trace(problem, trace([(0.0, pool())], 1.0), replanner)[0][0]
    small = plan_trace(problem, trace([(0.0, pool(4, 4, 0, 0))], 1.0), replanner)[0][0]
    assert not big.fits(pool(4, 4, 0, 0))
    gap = 5000.0  # the mean time between GPU losses seen

    def share(run):
        return training_share(run, checkpoint_every_s(problem, run, gap))

    assert 0.0 < share(big) < 1.0 and 0.0 < share(small) < 1.0
    calm = Futures([State(0.0, pool())], 3600.0)
    r = Rollout(problem, "max-throughput", calm, [big, small], 0.0, gap)
    assert r.value(big, 100.0)[0] == pytest.approx(
        big.tokens_per_s * share(big) * (calm.horizon_s - 100.0))
    one = Futures.__new__(Futures)  # one future: at 900 s zone b's GPUs go, for good
    one.keys, one.gap_s, one.horizon_s = calm.keys, 900.0, 8 * 900.0
    one.paths = [[(900.0, np.array([4.0, 4.0, 0.0, 0.0]))]]
    move = switch_cost(problem, big, small, forced=True, notice_s=0.0,
                       since_checkpoint_s=checkpoint_every_s(problem, big, gap) / 2).total_s
    want = (big.tokens_per_s * share(big) * 900.0
            + small.tokens_per_s * share(small) * (one.horizon_s - 900.0 - move))
    assert Rollout(problem, "max-throughput", one, [big, small], 0.0, gap).value(big, 0.0)[0] \
        == pytest.approx(want)


def test_a_move_by_choice_needs_a_gain_beyond_the_futures_noise(problem, replanner):
    """Moving to the big pool's plan wins by much in the futures where zone b stays and loses
    by almost as much where it goes at once: the mean ranks the move first, but the gain is
    within three standard errors of the difference over the futures, so ``shoal`` stays; with
    zone b staying in every future the same move is clearly better. (Checkpoints every 10
    minutes: the forced move back redoes five of them.)"""
    problem = every_10min(problem)
    big = plan_trace(problem, trace([(0.0, pool())], 1.0), replanner)[0][0]
    small = plan_trace(problem, trace([(0.0, pool(4, 4, 0, 0))], 1.0), replanner)[0][0]
    calm = Futures([State(0.0, pool())], 3600.0)

    def futures(paths):
        f = Futures.__new__(Futures)
        f.keys, f.gap_s, f.horizon_s, f.paths = calm.keys, 900.0, 8 * 900.0, paths
        return f

    gone = [(1.0, np.array([4.0, 4.0, 0.0, 0.0]))]  # zone b's GPUs go a second in
    move = switch_cost(problem, small, big, forced=False, notice_s=0.0,
                       since_checkpoint_s=0.0).total_s
    mixed = Rollout(problem, "max-throughput", futures([gone, []] * 3), [big, small], 0.0)
    assert mixed.value(big, move)[0] > mixed.value(small, 0.0)[0]
    assert not mixed.clearly_better((big, move), (small, 0.0))
    stays = Rollout(problem, "max-throughput", futures([[]] * 6), [big, small], 0.0)
    assert stays.clearly_better((big, move), (small, 0.0))


@pytest.mark.parametrize(("every", "learnt"), [("auto", 5), (600.0, 3)])
def test_flickering_gpus_are_not_chased(problem, replanner, every, learnt):
    """Extra GPUs that come for five minutes and go again, over and over: ``always`` moves
    every time, ``shoal`` learns that they do not stay and keeps its plan. It learns sooner
    when a forced move back costs more: with checkpoints every 10 minutes it redoes 2.5 of
    them on average, at Young's interval (``auto``, here about 20 s) little."""
    problem = replace(problem, switching=problem.switching.model_copy(
        update={"checkpoint_interval": every}))
    small, big = pool(0, 4, 4, 0), pool()
    states = [(0.0, small)]
    for i in range(1, 13):
        states.append((300.0 * i, big if i % 2 else small))
    tr = trace(states, 4 * 3600.0)
    opts = plan_trace(problem, tr, replanner)
    assert opts[1][0].tokens_per_s > opts[0][0].tokens_per_s
    runs = {p: simulate(problem, tr, opts, p) for p in POLICIES}
    assert runs["always"].switches == 13
    assert runs["shoal"].tokens > runs["always"].tokens
    # once it has seen the extra GPUs go (learnt - 1) / 2 times, it stays put
    assert runs["shoal"].steps[learnt - 1].decision == "forced"
    assert {s.decision for s in runs["shoal"].steps[learnt:]} == {"keep"}
    assert runs["oracle"].tokens >= runs["shoal"].tokens


def test_lasting_improvement_is_taken(problem, replanner):
    """More GPUs for the rest of a long trace: ``shoal`` moves, ``never`` does not."""
    tr = trace([(0.0, pool(0, 4, 4, 0)), (600.0, pool())], 8 * 3600.0)
    opts = plan_trace(problem, tr, replanner)
    shoal = simulate(problem, tr, opts, "shoal")
    never = simulate(problem, tr, opts, "never")
    oracle = simulate(problem, tr, opts, "oracle")
    assert [s.decision for s in shoal.steps] == ["start", "switch"]
    assert shoal.tokens > never.tokens
    assert oracle.tokens >= shoal.tokens * (1 - 1e-12)


def test_forced_move_may_take_a_plan_ranked_earlier(problem, replanner):
    """When its plan's GPUs go, ``shoal`` chooses among the new state's ranking and every plan
    ranked before that fits: here the earlier state ranked a faster plan for the GPUs left than
    the new state's (shortened) ranking offers."""
    half = pool(4, 4, 0, 0)
    tr = trace([(0.0, pool()), (600.0, half)], 8 * 3600.0)
    full_best = plan_trace(problem, trace([(0.0, pool())], 1.0), replanner)[0][0]
    half_ranked = plan_trace(problem, trace([(0.0, half)], 1.0), replanner)[0]
    best, worst = half_ranked[0], half_ranked[-1]
    assert not full_best.fits(half) and best.tokens_per_s > worst.tokens_per_s
    opts = [[full_best, best], [worst]]
    shoal = simulate(problem, tr, opts, "shoal")
    always = simulate(problem, tr, opts, "always")
    assert [s.decision for s in shoal.steps] == ["start", "forced"]
    assert shoal.steps[1].plan is best and always.steps[1].plan is worst
    assert shoal.tokens > always.tokens


def test_oracle_program_only_uses_plans_that_fit(problem, replanner):
    tr = trace([(0.0, pool()), (100.0, pool(0, 0, 4, 4)), (200.0, pool(0, 0, 0, 0)),
                (300.0, pool(4, 4, 0, 0))], 400.0)
    opts = plan_trace(problem, tr, replanner)
    assert opts[2] == []
    picks = oracle_choices(problem, tr, opts)
    assert picks[2] is None
    for state, p in zip(tr.states, picks, strict=True):
        assert p is None or p.fits(state.avail)


def test_work_lost_when_everything_goes_is_redone(problem, replanner):
    """All GPUs gone without notice: the work since the last checkpoint is redone at restart,
    and costs no less than losing only some of them."""
    all_gone = trace([(0.0, pool()), (500.0, pool(0, 0, 0, 0)), (600.0, pool())], 4000.0)
    rep = simulate(problem, all_gone, plan_trace(problem, all_gone, replanner), "never")
    assert [s.decision for s in rep.steps] == ["start", "stop", "start"]
    restart = rep.steps[2].switch
    assert restart.redo_s > 0
    first = rep.steps[0]  # its training since its last checkpoint is lost
    lost_iters = first.train_s % first.checkpoint_every_s / first.plan.iteration_time_s
    assert restart.redo_s == pytest.approx(lost_iters * rep.steps[2].plan.iteration_time_s)


def test_partial_pool_means_none_of_the_rest(problem):
    rp = Replanner(problem)
    full = rp.plan(pool())
    only = rp.plan({(A100, A): 4})
    assert not rp.calls[-1].remembered and only.ranked[0].num_gpus <= 4
    assert full.ranked[0].num_gpus > 4


def test_unknown_policy(problem, replanner):
    tr = trace([(0.0, pool())], 100.0)
    with pytest.raises(SpecError, match="unknown policy"):
        simulate(problem, tr, plan_trace(problem, tr, replanner), "sometimes")


# ------------------------------------------------------------------------------ properties

COUNTS = st.sampled_from([0, 4])


def stepped(pools: list[tuple], gaps: list[float], notices: list[float]) -> Trace:
    """A trace of ``pools`` (counts per KEYS), each lasting its gap, with its notice."""
    times = [0.0]
    for g in gaps[:len(pools) - 1]:
        times.append(times[-1] + g)
    return trace([(t, pool(*q)) for t, q in zip(times, pools, strict=True)],
                 times[-1] + gaps[-1], notice=dict(enumerate(notices)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(pools=st.lists(st.tuples(COUNTS, COUNTS, COUNTS, COUNTS), min_size=1, max_size=6),
       gaps=st.lists(st.floats(1.0, 5000.0), min_size=6, max_size=6),
       notices=st.lists(st.sampled_from([0.0, 30.0, 600.0]), min_size=6, max_size=6),
       policy=st.sampled_from(POLICIES))
def test_replay_accounting(problem, replanner, pools, gaps, notices, policy):
    tr = stepped(pools, gaps, notices)
    if not any(sum(p) for p in pools):
        # nothing fits at any moment: the reason, not idle; no GPUs at all: the trace's fault
        with pytest.raises(InfeasibleError, match="has no GPUs at any moment"):
            plan_trace(problem, tr, replanner)
        return
    rep = simulate(problem, tr, plan_trace(problem, tr, replanner), policy)
    tokens = 0.0
    for s in rep.steps:
        if s.plan is None:
            assert s.tokens == 0.0 and s.usd == 0.0
            continue
        # the plan in use never needs more GPUs of a type in a zone than the trace offers
        for key, n in s.plan.usage.items():
            assert n <= s.avail.get(key, 0)
        assert s.train_s + s.switch_s + s.checkpoint_s == pytest.approx(s.duration_s)
        assert s.train_s >= 0 and s.switch_s >= 0 and s.checkpoint_s >= 0
        # each checkpoint stalls training for the plan's save, one per interval of training
        assert s.checkpoint_s == pytest.approx(s.train_s * s.plan.save_s / s.checkpoint_every_s)
        tokens += s.plan.tokens_per_s * s.train_s
    # the token count is the integral of throughput over the time not spent switching or
    # writing checkpoints, less the work lost and not redone by the end
    assert 0.0 <= rep.lost_tokens <= tokens * (1 + 1e-12)
    assert rep.tokens == pytest.approx(tokens - rep.lost_tokens, rel=1e-12, abs=1e-3)
    assert sum(s.duration_s for s in rep.steps) == pytest.approx(tr.end_s)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(pools=st.lists(st.tuples(COUNTS, COUNTS, COUNTS, COUNTS), min_size=2, max_size=7),
       gaps=st.lists(st.sampled_from([1.0, 5.0, 20.0, 60.0, 170.0, 200.0, 900.0]), min_size=7,
                     max_size=7),
       notices=st.lists(st.sampled_from([0.0, 1.0, 30.0, 120.0]), min_size=7, max_size=7),
       every=st.sampled_from(["auto", 60.0, 600.0, 1800.0]),
       storage=st.sampled_from([None, "2MB/s"]))  # saves of 0.1-0.2 s, or of 45-180 s
def test_the_oracles_program_counts_its_plans_as_the_replay_does(problem, replanner, pools, gaps,
                                                                 notices, every, storage):
    """The oracle's dynamic program keeps its own accounts (switching carried over, waits for
    a checkpoint being written and VMs starting, redo owed, checkpoints, lost work at the end):
    for the plans it chooses, and for plans chosen at random (stays, moves, stops, many during
    a switch), its tokens are the replay's, on traces of changes 1 s to 15 min apart."""
    sw = {"checkpoint_interval": every}
    if storage is not None:
        sw["storage_bandwidth"] = parse_bandwidth(storage)
    pb = replace(problem, switching=problem.switching.model_copy(update=sw))
    rp = Replanner(pb, reuse=replanner.reuse)  # the same tables: the problem differs only there
    tr = stepped(pools, gaps, notices)
    if not any(sum(q) for q in pools):
        return
    opts = plan_trace(pb, tr, rp)
    totals: list[float] = []
    oracle_choices(pb, tr, opts, totals)
    rep = simulate(pb, tr, opts, "oracle")
    assert rep.tokens == pytest.approx(totals[0], rel=1e-9, abs=1e-3)
    plans = list({r.cand.spec: r for o in opts for r in o}.values())
    rng = np.random.default_rng(len(pools) + int(sum(gaps)))
    for _ in range(4):
        picks: list = []

        def pick(policy, problem, objective, cur, options, change, picks=picks):
            fit = [r for r in plans if r.fits(tr.states[len(picks)].avail)]
            choices = [*fit, None] + ([cur] * 3 if cur is not None and not change.forced else [])
            picks.append(choices[int(rng.integers(len(choices)))])
            return picks[-1]

        rep = simulate(pb, tr, opts, "always", chooser=pick)
        totals = []
        oracle_choices(pb, tr, opts, totals,
                       follow=[None if q is None else q.cand.spec for q in picks])
        assert rep.tokens == pytest.approx(totals[0], rel=1e-9, abs=1e-3)


# ------------------------------------------------------------------------------ command line

runner = CliRunner()


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_cli_replay_json_and_figure(scenario_file, tmp_path):
    events = tmp_path / "events.csv"
    events.write_text(f"time_s,gpu,zone,count,notice_s\n1800,{A100},{A},0,30\n3600,{A100},{A},4,0\n")
    fig, out = tmp_path / "replay.png", tmp_path / "replay.json"
    r = runner.invoke(app, ["replay", str(scenario_file), "--trace", str(events), "--json",
                            "--figure", str(fig), "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc == json.loads(out.read_text())
    assert doc["policy"] == "shoal" and len(doc["steps"]) == 3
    assert doc["steps"][1]["available"][f"{A100}@{A}"] == 0
    assert doc["steps"][1]["decision"] == "forced"
    t = doc["totals"]
    assert t["tokens"] == pytest.approx(sum(s["tokens"] for s in doc["steps"]))
    assert t["duration_s"] == pytest.approx(5400.0)
    assert fig.stat().st_size > 10_000
    assert all(0 <= s["plan"] < len(doc["plans"]) for s in doc["steps"])
    # the default budget cuts none of these small searches, and each state says so
    assert [s["search_timed_out"] for s in doc["steps"]] == [False] * 3
    assert doc["replan"]["timed_out"] == 0


def test_cli_replay_warns_of_a_trace_larger_than_the_pool(scenario_file, tmp_path):
    """A trace that gives more GPUs of a (type, zone) than the pool has is planned with the
    trace's count, and the replay says so on stderr and in --json's warnings."""
    events = tmp_path / "big.csv"
    events.write_text(f"time_s,gpu,zone,count\n600,{A100},{A},40\n1200,{A100},{A},4\n")
    r = runner.invoke(app, ["replay", str(scenario_file), "--trace", str(events), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["warnings"]) == 1
    w = doc["warnings"][0]
    for part in (f"gives 40 {A100} in {A}", "(first at 600 s)", "pool has 4",
                 "with the trace's 40"):
        assert part in w, w
    assert "warning: " in r.stderr and f"gives 40 {A100}" in r.stderr
    # what shoal does with it, as the warning says: the state's plan may use all 40
    big = doc["steps"][1]
    assert big["available"][f"{A100}@{A}"] == 40
    assert doc["plans"][big["plan"]]["gpus"] > sum(SCENARIO["pool"]["regions"]["us-central1"][
        "zones"][A]["gpus"].values()) + 8
    # a trace within the pool warns of nothing
    events.write_text(f"time_s,gpu,zone,count\n600,{A100},{A},2\n")
    r = runner.invoke(app, ["replay", str(scenario_file), "--trace", str(events), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["warnings"] == [] and "warning" not in r.stderr


def test_cli_replay_compares_policies(scenario_file):
    r = runner.invoke(app, ["replay", str(scenario_file), "--synthetic", "outage", "--seed", "3",
                            "--hours", "6", "--policy", "all"])
    assert r.exit_code == 0, r.output
    for name in POLICIES:
        assert name in r.output
    assert "availability states" in r.output


def test_cli_replay_bad_inputs(scenario_file, tmp_path):
    r = runner.invoke(app, ["replay", str(scenario_file)])
    assert r.exit_code == 2 and "exactly one of --trace" in r.output
    bad = tmp_path / "bad.csv"
    bad.write_text(f"time_s,gpu,zone,count\n0,{A100},{A},4\n10,{A100},{A},-1\n")
    r = runner.invoke(app, ["replay", str(scenario_file), "--trace", str(bad)])
    assert r.exit_code == 2 and "line 3" in r.output
    r = runner.invoke(app, ["replay", str(scenario_file), "--synthetic", "meteor"])
    assert r.exit_code == 2 and "spot" in r.output
    (tmp_path / "afile").write_text("")  # a file where the output's folder would be made
    r = runner.invoke(app, ["replay", str(scenario_file), "--synthetic", "spot",
                            "-o", str(tmp_path / "afile" / "x.json")])
    assert r.exit_code == 2 and "no folder can be made" in r.output
    r = runner.invoke(app, ["replay", str(scenario_file), "--synthetic", "spot", "--hours", "inf"])
    assert r.exit_code == 2 and "--hours" in r.output and "finite" in r.output
    # an option of the other kind of trace is refused, not ignored
    good = tmp_path / "good.csv"
    good.write_text(f"time_s,gpu,zone,count\n10,{A100},{A},4\n")
    for args, option in ((["--trace", str(good), "--seed", "3"], "--seed"),
                         (["--trace", str(good), "--hours", "2"], "--hours"),
                         (["--synthetic", "spot", "--trace-zone", A], "--trace-zone"),
                         (["--synthetic", "spot", "--trace-gpu", A100], "--trace-gpu")):
        r = runner.invoke(app, ["replay", str(scenario_file), *args, "--json"])
        assert r.exit_code == 2, r.output
        err = json.loads(r.stdout)["error"]
        assert err["field"] == option and "applies only with" in err["message"]


def test_free_gpus_have_no_tokens_per_usd():
    from shoal.elastic.replay import Replay

    assert Replay(policy="never", objective="max-throughput", steps=[]).totals()[
        "tokens_per_usd"] is None


def test_a_move_during_a_switch_still_owes_its_redo(problem, replanner):
    """A forced move without notice redoes the work since the last checkpoint at its end;
    GPUs back 60 s later, before that move has reached its redo: the next move owes that
    redo too (on its own plan), so moving twice never wipes lost work; the oracle is not
    behind any policy here."""
    tr = trace([(0.0, pool()), (900.0, pool(4, 4, 0, 0)), (960.0, pool())], 4 * 3600.0)
    opts = plan_trace(problem, tr, replanner)
    runs = {p: simulate(problem, tr, opts, p) for p in POLICIES}
    rep = runs["always"]
    assert [s.decision for s in rep.steps] == ["start", "forced", "switch"]
    first, second = rep.steps[1].switch, rep.steps[2].switch
    assert first.redo_s > 0 and first.total_s - first.redo_s > 60.0
    owed = first.redo_s / rep.steps[1].plan.iteration_time_s
    assert second.redo_s == pytest.approx(owed * rep.steps[2].plan.iteration_time_s)
    assert second.save_s == 0.0  # nothing new to save: the second plan never trained
    for p in ("shoal", "always", "never"):
        assert runs["oracle"].tokens >= runs[p].tokens * (1 - 1e-12)


def test_a_chooser_decides_instead_of_the_policy(problem, replanner):
    """``simulate(..., chooser=f)``: ``f`` makes every decision (benchmarks study policies of
    their own this way); one that keeps its plan until forced replays as ``never`` does."""
    tr = trace([(0.0, pool(0, 4, 4, 0)), (600.0, pool()), (1200.0, pool(4, 4, 0, 0))], 8 * 3600.0)
    opts = plan_trace(problem, tr, replanner)
    calls = []

    def keep(policy, problem, objective, cur, options, change):
        calls.append(change.forced)
        return cur if cur is not None and not change.forced else (options[0] if options else None)

    mine = simulate(problem, tr, opts, "always", chooser=keep)
    never, always = (simulate(problem, tr, opts, p) for p in ("never", "always"))
    assert calls == [False, False, True]
    assert [s.decision for s in mine.steps] == [s.decision for s in never.steps]
    assert mine.tokens == pytest.approx(never.tokens)
    assert [s.decision for s in always.steps] != [s.decision for s in never.steps]


def test_free_gpus_under_a_cost_objective_still_take_more_tokens():
    """With GPUs and egress free, tokens per dollar tie (nothing is paid): ``shoal`` then goes by
    tokens and takes a lasting improvement, as under max-throughput (before, it never moved)."""
    data = copy.deepcopy(SCENARIO)
    data["prices"] = {"gpu_usd_per_h": {A100: 0.0, V100: 0.0}}
    data["network"]["egress_usd_per_gb"] = {"same_region": 0.0}
    free = build_problem(parse_scenario(data))
    tr = trace([(0.0, pool(0, 4, 4, 0)), (600.0, pool())], 8 * 3600.0)
    opts = plan_trace(free, tr, Replanner(free))
    shoal = simulate(free, tr, opts, "shoal", "min-cost")
    never = simulate(free, tr, opts, "never", "min-cost")
    assert shoal.usd == 0.0
    assert [s.decision for s in shoal.steps] == ["start", "switch"]
    assert shoal.tokens > never.tokens


def test_when_nothing_fits_at_any_moment_the_error_names_the_trace_and_keeps_the_reason(
        problem):
    """GPUs at every moment but no plan within the cost cap: the planner's binding constraint
    and relaxation come through (the --json error carries them), and the message names the
    trace."""
    capped = replace(problem, constraints=problem.constraints.model_copy(
        update={"max_cost_per_iteration_usd": 1e-9}))
    tr = trace([(0.0, pool()), (600.0, pool(4, 4, 0, 0))], 1200.0)
    with pytest.raises(InfeasibleError) as ei:
        plan_trace(capped, tr, Replanner(capped))
    e = ei.value
    assert "no plan fits at any moment of the trace" in str(e) and tr.source in str(e)
    assert e.binding and e.relaxation and str(e).count("binding constraint") == 1


def test_a_move_during_a_switch_waits_only_for_the_vms_it_takes(problem, replanner):
    """GPUs back at 900 s: ``always`` moves to a plan that needs new VMs (3 minutes to start).
    60 s later those GPUs go again, without notice: the move back to a plan on VMs already up
    waits for nothing. And a move that takes VMs still starting waits for them, and then
    redoes the work the move it interrupts still owed."""
    sw = problem.switching
    tr = trace([(0.0, pool(0, 0, 4, 4)), (900.0, pool()), (960.0, pool(0, 0, 4, 4))],
               2 * 3600.0)
    rep = simulate(problem, tr, plan_trace(problem, tr, replanner), "always")
    assert [s.decision for s in rep.steps] == ["start", "switch", "forced"]
    assert rep.steps[1].switch.startup_s == sw.node_startup
    back = rep.steps[2].switch
    assert back.wait_s == 0.0 and back.startup_s == 0.0 and back.save_s == 0.0
    assert back.total_s == pytest.approx(back.restart_s + back.load_s + back.warmup_s
                                         + back.redo_s)
    # zone A's A100s go without notice as zone B comes: the forced move starts B's VMs and
    # redoes its lost work last; 20 s later only B's A100s are left: the next move takes VMs
    # still starting, waits until they are up, then redoes what the first one still owed
    tr = trace([(0.0, pool(4, 4, 0, 0)), (900.0, pool(0, 4, 4, 4)), (920.0, pool(0, 0, 4, 0))],
               2 * 3600.0)
    rep = simulate(problem, tr, plan_trace(problem, tr, replanner), "never")
    assert [s.decision for s in rep.steps] == ["start", "forced", "forced"]
    first, second = rep.steps[1].switch, rep.steps[2].switch
    assert first.startup_s == sw.node_startup and first.redo_s > 0
    assert first.up_s == pytest.approx(sw.node_startup)
    assert second.startup_s == 0.0
    assert second.wait_s == pytest.approx(first.up_s - 20.0)
    owed = first.redo_s / rep.steps[1].plan.iteration_time_s
    assert second.redo_s == pytest.approx(owed * rep.steps[2].plan.iteration_time_s)
    assert second.total_s == pytest.approx(second.wait_s + second.restart_s + second.load_s
                                           + second.warmup_s + second.redo_s)


def test_work_lost_by_the_end_of_the_trace_is_not_counted(problem, replanner):
    """Every GPU goes without notice and the trace ends before any comes back: the work
    trained since the last checkpoint is lost, so not counted in the tokens (it would be
    redone, as a move's redo, had the GPUs come back)."""
    slow = replace(problem, switching=problem.switching.model_copy(
        update={"checkpoint_interval": 1800.0}))
    rp = Replanner(slow, reuse=replanner.reuse)  # the same tables: the problem differs only there
    gone = trace([(0.0, pool()), (3000.0, pool(0, 0, 0, 0))], 3600.0)
    back = trace([(0.0, pool()), (3000.0, pool(0, 0, 0, 0)), (3500.0, pool())], 7200.0)
    short = trace([(0.0, pool()), (3000.0, pool(0, 0, 0, 0)), (3500.0, pool())], 3600.0)
    a = simulate(slow, gone, plan_trace(slow, gone, rp), "never")
    b = simulate(slow, back, plan_trace(slow, back, rp), "never")
    assert [s.decision for s in a.steps] == ["start", "stop"]
    run = a.steps[0]
    since = run.train_s % 1800.0  # trained since the last checkpoint, lost
    assert a.lost_tokens == pytest.approx(since / run.plan.iteration_time_s
                                          * run.plan.tokens_per_iter)
    assert a.tokens == pytest.approx(run.tokens - a.lost_tokens)
    assert a.totals()["lost_tokens"] == a.lost_tokens
    # with the GPUs back, the same work is redone as part of the restart
    assert b.steps[2].switch.redo_s == pytest.approx(
        since / run.plan.iteration_time_s * b.steps[2].plan.iteration_time_s)
    assert b.lost_tokens == 0.0
    # ... unless the trace ends before the redo is done: then it is still lost
    c = simulate(slow, short, plan_trace(slow, short, rp), "never")
    assert c.steps[2].switch.total_s > 100.0
    assert c.lost_tokens == pytest.approx(a.lost_tokens)


def test_a_move_during_a_save_waits_for_the_checkpoint(problem, replanner):
    """Two moves 2 s apart by choice, the first saving for longer than that: the second loads
    the checkpoint the first is writing, so it waits for the rest of that save; together
    they take no less switching than the one move straight to the last plan, and the oracle's
    program, made to follow the same plans, counts the same tokens."""
    pb = replace(problem, switching=problem.switching.model_copy(
        update={"storage_bandwidth": parse_bandwidth("2MB/s")}))
    rp = Replanner(pb, reuse=replanner.reuse)
    tr = trace([(0.0, pool()), (1000.0, pool(4, 4, 4, 3)), (1002.0, pool(4, 4, 4, 2))],
               2 * 3600.0)
    opts = plan_trace(pb, tr, rp)
    # three plans that fit every state and need no VM the first does not rent
    first = opts[2][0]
    ok = [r for r in {r.cand.spec: r for o in opts for r in o}.values()
          if r.fits(tr.states[2].avail) and all(n <= first.nodes.get(k, 0)
                                                  for k, n in r.nodes.items())]
    assert len(ok) >= 3
    a, b, c = ok[:3]

    def run(seq):
        picked = []

        def pick(policy, problem, objective, cur, options, change):
            picked.append(seq[len(picked)])
            return picked[-1]

        return simulate(pb, tr, opts, "always", chooser=pick)

    two = run([a, b, c])
    one = run([a, a, c])
    assert a.save_s > 2.0
    assert two.steps[2].switch.wait_s == pytest.approx(a.save_s - 2.0)
    assert two.switch_s >= one.switch_s - 1e-9
    totals: list[float] = []
    oracle_choices(pb, tr, opts, totals, follow=[a.cand.spec, b.cand.spec, c.cand.spec])
    assert two.tokens == pytest.approx(totals[0], rel=1e-9, abs=1e-3)
