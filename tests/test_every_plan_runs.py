"""Every plan a planner emits, the runtime runs (issue 66): random small problems, the best plan
of every strategy, two steps in float64 on CPU processes, equal to one process on the same
batches (losses and every parameter, 1e-9).

The planners see a model big enough for the pool's GPUs to matter (pipelines, TP, ZeRO-3, the
zorse schedule's ministages, mixed GPU types with uneven shares); the runtime runs that model's
shape narrowed to CPU size: the same blocks, heads, KV heads and architecture, so the plan's
stages, TP degrees and schedule run as planned."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from shoal.errors import InfeasibleError  # noqa: E402
from shoal.problem import build_problem  # noqa: E402
from shoal.runtime.model import unshard  # noqa: E402
from shoal.runtime.train import reference, spawn  # noqa: E402
from shoal.specs.model import ModelSpec  # noqa: E402
from shoal.specs.scenario import parse_scenario  # noqa: E402
from shoal.training.planners import STRATEGIES, Limits, search  # noqa: E402

TYPES = ("A100-40GB", "V100-16GB", "T4")
SEQ, STEPS, TOL = 8, 2, 1e-9
# among their plans: TP, pipelines, mixed GPU types and TP degrees in a stage with uneven
# shares, the zorse schedule with ministages
FAST_SEEDS = (0, 17, 21)


def draw(seed: int) -> dict:
    """A random scenario: a model of 2-6 blocks (GPT- or Llama-style), one or two GPU types in
    one or two regions, 2-5 GPUs, a global batch of 2-8; the job allows every setting."""
    rnd = random.Random(seed)
    hidden = rnd.choice([2048, 4096, 6144])
    spec = {"name": f"random-{seed}", "num_layers": rnd.randint(2, 6), "hidden_size": hidden,
            "num_heads": 16, "vocab_size": 32000, "max_seq_len": 2048,
            "ffn_hidden_size": 4 * hidden}
    if rnd.random() < 0.5:
        spec.update(mlp="swiglu", norm="rmsnorm", position="rotary",
                    num_kv_heads=rnd.choice([4, 16]))
    types = rnd.sample(TYPES, rnd.randint(1, 2))
    left, regions = rnd.randint(2, 5), {}
    for i in range(rnd.choice([1, 1, 2])):
        gpus = {}
        for t in types:
            n = min(rnd.randint(1, 4), left)
            left -= n
            if n:
                gpus[t] = n
        if gpus:
            regions[f"r{i}"] = {"zones": {f"z{i}": {"gpus": gpus}}}
    return {"model": spec,
            "job": {"global_batch": rnd.choice([2, 4, 6, 8]), "seq_len": 2048,
                    "optimizer": "adamw", "precision": "fp32", "microbatch_sizes": [1, 2],
                    "recompute": [False, True], "zero_stage": [0, 1, 2, 3],
                    "schedule": ["1f1b", "gpipe", "zorse"], "stack": "shoal"},
            "pool": {"regions": regions,
                     "gpus_per_node": {t: rnd.choice([1, 2, 4]) for t in types}},
            "network": {"defaults": {
                "same_zone": {"bandwidth": "100Gbps", "latency": "10us"},
                "same_region": {"bandwidth": "10Gbps", "latency": "100us"},
                "cross_region": {"bandwidth": "1Gbps", "latency": "10ms"}}},
            "prices": {"gpu_usd_per_h": dict.fromkeys(types, 1.0)}}


def narrowed(spec: ModelSpec) -> ModelSpec:
    """The model's shape at CPU size: blocks, heads, KV heads and architecture kept."""
    return spec.model_copy(update={"hidden_size": 4 * spec.num_heads, "ffn_hidden_size": 64,
                                   "vocab_size": 64, "max_seq_len": 16, "head_dim": None})


def plans_of(seed: int) -> tuple[ModelSpec, dict]:
    """The problem's model and each strategy's best plan (strategies with none left out)."""
    problem = build_problem(parse_scenario(draw(seed)))
    out = {}
    for strategy in STRATEGIES:
        try:
            out[strategy] = search(problem, strategy=strategy, limits=Limits(budget_s=10)).ranked[0].plan
        except InfeasibleError:
            continue
    return problem.model, out


def full(plan, res) -> dict:
    out = {}
    for s in range(len(plan.stages)):
        ranks = sorted((r for r in res if r["role"][0] == s and r["role"][1] == 0),
                       key=lambda r: r["role"][2])
        for key in ranks[0]["state"]:
            out[key] = unshard(key[1], [r["state"][key] for r in ranks])
    return out


def check_seed(seed: int, tmp_path) -> list[str]:
    """Run every strategy's best plan of problem ``seed``; the strategies that had one."""
    model, plans = plans_of(seed)
    spec = narrowed(model)
    done: dict[str, bool] = {}
    for strategy, plan in plans.items():
        key = plan.model_dump_json()
        if key not in done:  # strategies often agree: each plan runs once
            out = tmp_path / f"{seed}-{strategy}"
            out.mkdir()
            res = spawn(plan, spec, STEPS, SEQ, out_dir=str(out))
            ref_losses, ref = reference(spec, plan, STEPS, SEQ)
            got = full(plan, res)
            assert got.keys() == ref.keys()
            for k in ref:
                err = float((got[k] - ref[k]).norm()) / max(float(ref[k].norm()), 1e-3)
                assert err <= TOL, (seed, strategy, plan.summary(), k, err)
            for r in res:
                assert r["losses"] == pytest.approx(ref_losses, rel=TOL), (seed, strategy)
            done[key] = True
    return list(plans)


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_every_strategys_plan_trains_as_one_process(seed, tmp_path):
    ran = check_seed(seed, tmp_path)
    assert len(ran) >= 5, ran


def test_the_fast_problems_cover_the_plan_kinds():
    """The fast seeds' plans hold TP, several stages, mixed GPU types and TP degrees in a
    stage with uneven shares, and the zorse schedule (so the fast suite runs each kind)."""
    plans = [p for seed in FAST_SEEDS for p in plans_of(seed)[1].values()]
    assert any(r.tp > 1 for p in plans for st in p.stages for r in st.replicas)
    assert any(len(p.stages) > 1 for p in plans)
    assert any(p.schedule == "zorse" and p.ministages > 1 for p in plans)
    assert any(len({r.gpu for r in st.replicas}) > 1 for p in plans for st in p.stages)
    assert any(len({r.tp for r in st.replicas}) > 1 for p in plans for st in p.stages)
    assert any(len({r.microbatches for r in st.replicas}) > 1 for p in plans for st in p.stages)


@pytest.mark.slow
def test_every_strategy_on_twenty_random_problems(tmp_path):
    counts = dict.fromkeys(STRATEGIES, 0)
    seed = 100
    while min(counts.values()) < 20:
        assert seed < 200, counts  # a strategy that finds no plan for most problems
        for s in check_seed(seed, tmp_path):
            counts[s] += 1
        seed += 1
