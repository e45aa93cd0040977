"""The bundled examples load, and the example plan estimates without running out of memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.estimate import estimate
from shoal.problem import load_problem
from shoal.specs.plan import TrainingPlan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("path", sorted(p for p in EXAMPLES.glob("*.yaml")
                                         if not p.name.endswith(".serving.yaml")),
                         ids=lambda p: p.name)
def test_example_scenario_loads(path):
    pb = load_problem(path)
    assert pb.avail and pb.n_layers > 2


def test_example_plan_estimates():
    pb = load_problem(EXAMPLES / "het-a100-v100.yaml")
    plan = TrainingPlan.model_validate_json((EXAMPLES / "het-a100-v100.plan.json").read_text())
    e = estimate(pb, plan)
    assert not e.oom and e.iteration_time_s > 0


def test_example_cpu_plan_covers_the_tiny_model():
    """``shoal train examples/tiny-cpu.plan.json --model tiny``: its stages tile the tiny
    model's layers (embedding, blocks, head) on CPU processes."""
    from shoal.catalog import TINY

    plan = TrainingPlan.model_validate_json((EXAMPLES / "tiny-cpu.plan.json").read_text())
    ends = [s.layers for s in plan.stages]
    assert ends[0][0] == 0 and ends[-1][1] == TINY.num_layers + 2
    assert all(a[1] == b[0] for a, b in zip(ends, ends[1:], strict=False))
    assert {r.gpu for s in plan.stages for r in s.replicas} == {"cpu"}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.serving.yaml")), ids=lambda p: p.name)
def test_example_serving_places(path):
    from shoal.serving.cluster import build_cluster
    from shoal.serving.placers import place
    from shoal.specs.serving import load_serving

    c = build_cluster(load_serving(path), file=str(path))
    r = place(c, "auto", time_limit_s=5)
    assert 0 < r.flow.value <= r.upper_bound
