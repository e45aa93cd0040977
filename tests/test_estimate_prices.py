"""A price is needed only where a cost is: ``shoal estimate`` gives time and memory for a plan on
GPUs without a price (the cost marked unknown, with the reason), a price missing for a GPU the
plan does not use changes nothing, and ``shoal plan`` asks for the prices of the GPUs it can use,
naming the GPU and the scenario field."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from shoal.cli import app

runner = CliRunner()

# RTX-3090: a consumer card with no public on-demand price in the catalog
SCENARIO = {
    "model": {"name": "small", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
              "vocab_size": 32000},
    "job": {"global_batch": 8, "seq_len": 1024},
    "pool": {"regions": {"us-central1": {"zones": {
        "us-central1-a": {"gpus": {"RTX-3090": 4, "A100-40GB": 4}}}}}},
    "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "20us"}},
                "egress_usd_per_gb": {"same_zone": 0.0}},
}


def _plan(gpu: str) -> dict:
    return {"schema": "shoal/training-plan@1", "microbatch_size": 1,
            "stages": [{"layers": [0, 3], "replicas": [
                           {"gpu": gpu, "tp": 1, "zone": "us-central1-a", "microbatches": 8}]},
                       {"layers": [3, 6], "replicas": [
                           {"gpu": gpu, "tp": 1, "zone": "us-central1-a", "microbatches": 8}]}]}


def _write(tmp_path, scenario: dict, gpu: str = "RTX-3090"):
    scn, plan = tmp_path / "scenario.yaml", tmp_path / "plan.json"
    scn.write_text(yaml.safe_dump(scenario))
    plan.write_text(json.dumps(_plan(gpu)))
    return scn, plan


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_a_plan_on_an_unpriced_gpu_estimates_time_and_memory(tmp_path):
    scn, plan = _write(tmp_path, SCENARIO)
    res = _run("estimate", scn, "--plan", plan, "--json")
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)
    assert est["iteration_time_s"] > 0 and est["tokens_per_s"] > 0
    assert all(w["peak_memory_bytes"] > 0 and w["gpu"] == "RTX-3090" for w in est["workers"])
    cost = est["cost_per_iteration_usd"]
    assert cost["compute"] is None and cost["total"] is None
    assert cost["egress"] == 0.0  # the network's price is known
    assert "no price for RTX-3090" in cost["reason"]
    res = _run("estimate", scn, "--plan", plan)
    assert res.exit_code == 0, res.output
    assert "n/a (no price for RTX-3090)" in res.stdout
    assert "iteration time" in res.stdout and "peak memory" in res.stdout


def test_a_gpu_the_plan_does_not_use_needs_no_price(tmp_path):
    scn, plan = _write(tmp_path, SCENARIO, gpu="A100-40GB")
    res = _run("estimate", scn, "--plan", plan, "--json")
    assert res.exit_code == 0, res.output
    cost = json.loads(res.stdout)["cost_per_iteration_usd"]
    assert cost["compute"] > 0 and cost["total"] == pytest.approx(cost["compute"] + cost["egress"])
    assert cost["reason"] is None


def test_a_price_from_the_scenario_gives_the_cost(tmp_path):
    priced = SCENARIO | {"prices": {"gpu_usd_per_h": {"RTX-3090": 0.5}}}
    scn, plan = _write(tmp_path, priced)
    est = json.loads(_run("estimate", scn, "--plan", plan, "--json").stdout)
    # two RTX-3090 for the whole iteration at 0.5 USD per GPU-hour
    want = 2 * 0.5 / 3600 * est["iteration_time_s"]
    assert est["cost_per_iteration_usd"]["compute"] == pytest.approx(want, rel=1e-9)
    assert est["cost_per_iteration_usd"]["reason"] is None


@pytest.mark.parametrize("args, why", [
    ([], "planning needs a price"),
    (["--objective", "min-cost"], "the objective min-cost"),
    (["--max-cost-per-iter", "1"], "the constraint max_cost_per_iteration_usd"),
])
def test_plan_asks_for_the_price_of_a_gpu_it_can_use(tmp_path, args, why):
    scn, _ = _write(tmp_path, SCENARIO)
    res = _run("plan", scn, "--budget", "5", *args)
    assert res.exit_code == 2, res.output
    assert "prices.gpu_usd_per_h.RTX-3090" in res.stderr and why in res.stderr
    assert "no price for RTX-3090" in res.stderr and "Traceback" not in res.output


def test_plan_needs_no_price_for_a_gpu_it_cannot_use(tmp_path):
    """A quota of 0 keeps the RTX-3090s out of every plan: their price is not asked for."""
    scn, _ = _write(tmp_path, SCENARIO | {"pool": SCENARIO["pool"] | {"quotas": {"RTX-3090": 0}}})
    res = _run("plan", scn, "--budget", "5", "--objective", "min-cost", "--json")
    assert res.exit_code == 0, res.output
    best = json.loads(res.stdout)["plans"][0]
    assert {r["gpu"] for s in best["plan"]["stages"] for r in s["replicas"]} == {"A100-40GB"}
    assert best["estimate"]["cost_per_iteration_usd"]["total"] > 0


@pytest.mark.reference
def test_a_sailor_scenario_of_rtx_cards_estimates_without_prices(reference_dir, tmp_path):
    """Sailor's consumer-GPU cluster (RTX-3090, Titan-RTX, RTX-2080 in us-central1-a; none has a
    public price) imported with ``shoal import sailor`` with its measured OPT-350M profiles and
    network curves, and a plan on the RTX-3090s, estimates at once."""
    s = reference_dir / "sailor"
    trace = tmp_path / "trace.csv"
    trace.write_text(",Timestamp,RTX-3090_us-central1-a,Titan-RTX_us-central1-a,"
                     "RTX-2080_us-central1-a\n0,1,16,16,24\n")
    replica = [[["RTX-3090", 2, "us-central1-a"]], 2]
    plan = tmp_path / "plan_config.json"
    plan.write_text(json.dumps({"mbs": 1, "gbs": 32, "pipeline_list": [{
        "layers_per_stage": [list(range(0, 13)), list(range(13, 26))], "dp": [2, 2],
        "tmp_per_stage": [[replica, replica], [replica, replica]]}]}))
    out = tmp_path / "out"
    res = _run("import", "sailor",
               "--training-config", s / "configs" / "training_config_opt_350.json",
               "--cluster-config", s / "configs" / "basic_cluster_config.json",
               "--profiles", s / "profiles" / "OPT-350", "--network", s / "network",
               "--trace", trace, "--plan", plan, "-o", out)
    assert res.exit_code == 0, res.output
    pool = yaml.safe_load((out / "scenario.yaml").read_text())["pool"]["regions"]["us-central1"]
    assert set(pool["zones"]["us-central1-a"]["gpus"]) == {"RTX-3090", "Titan-RTX", "RTX-2080"}
    res = _run("estimate", out / "scenario.yaml", "--plan", out / "plan.json", "--json")
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)
    assert est["iteration_time_s"] > 0 and not est["oom"]
    assert {w["gpu"] for w in est["workers"]} == {"RTX-3090"} and len(est["workers"]) == 4
    assert all(w["peak_memory_bytes"] > 1e9 for w in est["workers"])
    assert {s["profile_source"] for s in est["stages"]} == {"measured (profile.json)"}
    cost = est["cost_per_iteration_usd"]
    assert cost["total"] is None and "no price for RTX-3090" in cost["reason"]
    assert "RTX-2080" not in cost["reason"]  # in the pool, not in the plan
    res = _run("plan", out / "scenario.yaml", "--budget", "5")
    assert res.exit_code == 2 and "prices.gpu_usd_per_h.RTX-2080" in res.stderr
