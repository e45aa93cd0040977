"""The fast pipeline formula against the event simulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.estimate import estimate
from shoal.estimate.kernel import pipeline_makespan
from shoal.estimate.pipeline import stage_order
from shoal.estimate.timeline import simulate, simulate_pipeline
from shoal.problem import load_problem
from shoal.report.figures import draw_timeline
from shoal.specs.plan import TrainingPlan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "het-a100-v100.yaml"
PLAN = ROOT / "examples" / "het-a100-v100.plan.json"


def formula(f, b, m, schedule="1f1b"):
    return float(pipeline_makespan(f[None, :, None], b[None, :, None], np.array([[float(m)]]),
                                   schedule == "gpipe")[0, 0])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("P,m", [(1, 1), (1, 7), (2, 1), (4, 3), (4, 16), (8, 64), (5, 2)])
def test_identical_stages_match_within_1pct(P, m, schedule):
    f = np.full(P, 0.013)
    b = np.full(P, 0.029)
    ops, ends = simulate_pipeline(f, b, m, schedule)
    assert len(ops) == 2 * P * m
    assert formula(f, b, m, schedule) == pytest.approx(ends.max(), rel=0.01)


def test_textbook_1f1b_formula():
    # (m + P - 1) (f + b) for identical stages (Narayanan et al. 2021)
    ops, ends = simulate_pipeline(np.full(4, 1.0), np.full(4, 2.0), 10)
    assert ends.max() == pytest.approx((10 + 4 - 1) * 3.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("independent", [False, True])
def test_heterogeneous_within_5pct_never_optimistic(schedule, independent):
    rng = np.random.default_rng(7)
    errs = []
    for _ in range(300):
        P, m = int(rng.integers(1, 9)), int(rng.integers(1, 97))
        f = rng.uniform(0.05, 3.0, P)
        # backward either proportional to forward, or drawn on its own (unequal ratios per stage)
        b = rng.uniform(0.05, 6.0, P) if independent else f * rng.uniform(1.0, 4.0, P)
        _, ends = simulate_pipeline(f, b, m, schedule)
        errs.append(formula(f, b, m, schedule) / ends.max() - 1)
    assert min(errs) > -0.001
    assert max(errs) < 0.01


def test_batched_lanes_agree_with_single():
    rng = np.random.default_rng(3)
    f = rng.uniform(0.1, 1.0, (5, 6, 4))
    b = 2 * f
    m = rng.integers(1, 40, (5, 4)).astype(float)
    both = pipeline_makespan(f, b, m)
    for i in range(5):
        for r in range(4):
            assert both[i, r] == pytest.approx(formula(f[i, :, r], b[i, :, r], int(m[i, r])))


def test_1f1b_order_holds_p_minus_s_in_flight():
    for P, m in [(4, 8), (3, 2)]:
        for s in range(P):
            order = stage_order("1f1b", P, s, m)
            in_flight = peak = 0
            for kind, _ in order:
                in_flight += 1 if kind == "F" else -1
                peak = max(peak, in_flight)
            assert peak == min(P - s, m)


def test_estimate_matches_simulation_on_example(tmp_path):
    pb = load_problem(EXAMPLE)
    plan = TrainingPlan.model_validate_json(PLAN.read_text())
    est = estimate(pb, plan).iteration_time_s
    sim = simulate(pb, plan).iteration_time_s
    assert est >= sim * 0.99
    assert est == pytest.approx(sim, rel=0.05)
    out = draw_timeline(pb, plan, tmp_path / "t.png")
    assert out.exists() and out.stat().st_size > 5000


def test_a_stages_bubble_is_the_idle_time_of_its_busiest_worker_on_the_timeline():
    """The estimate's bubble per stage is what its busiest replica's timeline row leaves
    white: the iteration less its compute, sends, gradient sync and update."""
    problem = load_problem(EXAMPLE)
    plan = TrainingPlan.model_validate_json(PLAN.read_text())
    est, tl = estimate(problem, plan), simulate(problem, plan)
    for s in est.stages:
        busy: dict[int, float] = {}
        for op in tl.ops:
            if op.stage == s.stage:
                busy[op.replica] = busy.get(op.replica, 0.0) + op.end_s - op.start_s
        assert s.bubble_s == pytest.approx(tl.iteration_time_s - max(busy.values()), rel=1e-9)
        assert s.bubble_s < est.iteration_time_s - s.busy_s
