"""The batched kernel: bucketing by width changes nothing; batch equals one-by-one estimates."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.estimate import estimate
from shoal.estimate.api import _state_bytes, run_kernel, tables_for
from shoal.estimate.encode import encode
from shoal.estimate.kernel import Batch, _run
from shoal.problem import build_problem
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

GPUS = ["A100-40GB", "V100-16GB"]
ZONES = ["us-central1-a", "us-central1-b"]


@pytest.fixture(scope="module")
def problem():
    return build_problem(parse_scenario({
        "model": "OPT-350M",
        "job": {"global_batch": 256, "seq_len": 1024, "recompute": [False, True]},
        "pool": {"regions": {"us-central1": {"zones": {z: {"gpus": {g: 256 for g in GPUS}}
                                                        for z in ZONES}}}},
        "network": {"defaults": {"same_zone": {"bandwidth": "50Gbps"},
                                 "same_region": {"bandwidth": "10Gbps", "latency": "1ms"}}},
    }))


def random_plans(pb, n, seed=0):
    rng = np.random.default_rng(seed)
    L = pb.n_layers
    plans = []
    for _ in range(n):
        S = int(rng.integers(1, 5))
        cuts = sorted(rng.choice(np.arange(1, L), S - 1, replace=False).tolist())
        edges = [0, *cuts, L]
        d = int(rng.choice([1, 2, 4, 8, 16, 32]))
        mbs = 2
        per = 256 // mbs // d
        stages = [{"layers": [edges[i], edges[i + 1]],
                   "replicas": [{"gpu": GPUS[int(rng.integers(2))], "tp": int(rng.choice([1, 2, 4])),
                                 "zone": ZONES[int(rng.integers(2))], "microbatches": per}
                                for _ in range(d)]} for i in range(S)]
        plans.append(TrainingPlan.model_validate({"microbatch_size": mbs, "stages": stages,
                                                  "recompute": bool(rng.integers(2))}))
    return plans


def test_bucketed_equals_unbucketed(problem):
    plans = random_plans(problem, 300)
    tb = tables_for(problem, [2])
    bt = encode(tb, plans)
    assert isinstance(bt, Batch) and bt.size >= 256
    whole = run_kernel(problem, tb, bt)
    grad_b, states = _state_bytes(problem)
    direct = _run(tb, bt, problem.memory, problem.timing, grad_b, states, False)
    for k in ("iteration_time_s", "cost_compute_usd", "cost_egress_usd", "oom", "peak_bytes"):
        np.testing.assert_allclose(whole[k], direct[k], rtol=1e-12)


def test_batch_equals_single_estimates(problem):
    plans = random_plans(problem, 20, seed=1)
    tb = tables_for(problem, [2])
    out = run_kernel(problem, tb, encode(tb, plans))
    for i, p in enumerate(plans):
        e = estimate(problem, p)
        assert out["iteration_time_s"][i] == pytest.approx(e.iteration_time_s, rel=1e-12)
        assert out["cost_compute_usd"][i] + out["cost_egress_usd"][i] == pytest.approx(
            e.cost_per_iteration_usd, rel=1e-12)
        assert bool(out["oom"][i]) == e.oom


def test_encoding_puts_each_replica_in_its_slot(problem):
    """``encode`` (each distinct replica looked up once): every replica's GPU, TP, zone and
    microbatches sit at its (plan, stage, replica) slot, the padding stays empty."""
    plans = random_plans(problem, 40, seed=2)
    tb = tables_for(problem, [2])
    bt = encode(tb, plans)
    filled = 0
    for b, p in enumerate(plans):
        for s, st in enumerate(p.stages):
            assert (bt.ls[b, s], bt.le[b, s]) == tuple(st.layers) and bt.smask[b, s]
            for r, rep in enumerate(st.replicas):
                assert (tb.gpus[bt.g[b, s, r]], tb.tps[bt.t[b, s, r]], tb.zones[bt.z[b, s, r]],
                        bt.m[b, s, r]) == (rep.gpu, rep.tp, rep.zone, rep.microbatches)
                assert bt.rmask[b, s, r]
                filled += 1
    assert bt.rmask.sum() == filled and not bt.smask[~bt.rmask.any(axis=2)].any()
