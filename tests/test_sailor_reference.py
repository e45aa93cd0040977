"""Golden test: shoal's estimator against the runs Sailor measured on GH200 (OPT-350M).

Each validation plan is imported with ``shoal.io.sailor.import_sailor`` (scenario, measured
profile, network curves, plan) and estimated with the shipped default constants; the measured
``max_mem`` (peak bytes per GPU) and ``real`` (iteration seconds) are the truth. Sailor's own
simulator reaches 5.9 % (memory) and 8.9 % (time) mean absolute error on these runs
(``reference/sailor/sailor_runs.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shoal import catalog
from shoal.estimate import estimate
from shoal.estimate.validate import validate_plan
from shoal.io.sailor import SailorFiles, import_sailor
from shoal.problem import load_problem
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import load_scenario

pytestmark = pytest.mark.reference

# Shipped constants on the runs they were fitted on (BENCHMARKS.md: 1.0% / 4.7%); the bars sit
# below Sailor's own simulator (5.9% memory, 8.9% time) so a regression shows.
MEM_MAPE = 0.02
MEM_MAX = 0.05
TIME_MAPE = 0.06
TIME_MAX = 0.12
# GPT-Neo-2.7B, predicted from the OPT-350M GH200 profile (no GPT-Neo run fitted): BENCHMARKS.md
# reports 13.1% time and 5.3% memory.
NEO_TIME_MAPE = 0.15
NEO_MEM_MAPE = 0.074


def _plans(ref: Path) -> list[Path]:
    return sorted((ref / "sailor" / "validation" / "gh200" / "OPT-350").glob("*/plan_config_*.json"))


def _import(ref: Path, plan_file: Path, out: Path) -> dict[str, Path]:
    s = ref / "sailor"
    return import_sailor(SailorFiles(
        training_config=s / "configs" / "training_config_opt_350.json",
        cluster_config=s / "configs" / "basic_cluster_config.json",
        profiles=s / "profiles" / "OPT-350",
        network=s / "network",
        plan=plan_file,
    ), out)


@pytest.fixture(scope="module")
def results(reference_dir, tmp_path_factory) -> list[dict]:
    plans = _plans(reference_dir)
    if not plans:
        pytest.skip(f"no OPT-350 validation plans under {reference_dir}")
    out = []
    for f in plans:
        written = _import(reference_dir, f, tmp_path_factory.mktemp(f.stem))
        problem = load_problem(written["scenario.yaml"])
        plan = TrainingPlan.model_validate(json.loads(written["plan.json"].read_text()))
        est = estimate(problem, plan, file=str(written["plan.json"]))
        measured = json.loads(f.read_text())
        out.append({
            "name": f.stem,
            "mem_err": est.peak_memory_bytes / measured["max_mem"] - 1.0,
            "time_err": est.iteration_time_s / measured["real"] - 1.0,
        })
    return out


def _table(results: list[dict]) -> str:
    return "\n".join(f"{r['name']:32s} mem {r['mem_err']:+.1%}  time {r['time_err']:+.1%}" for r in results)


def test_all_validation_plans_imported(results):
    assert len(results) >= 10


def test_peak_memory_error(results):
    errs = np.abs([r["mem_err"] for r in results])
    assert errs.mean() < MEM_MAPE, f"memory MAPE {errs.mean():.1%}\n{_table(results)}"
    assert errs.max() < MEM_MAX, f"worst memory error {errs.max():.1%}\n{_table(results)}"


def test_iteration_time_error(results):
    errs = np.abs([r["time_err"] for r in results])
    assert errs.mean() < TIME_MAPE, f"time MAPE {errs.mean():.1%}\n{_table(results)}"
    assert errs.max() < TIME_MAX, f"worst time error {errs.max():.1%}\n{_table(results)}"


def test_gpt_neo_predicted_from_opt_profile(reference_dir, tmp_path):
    s = reference_dir / "sailor"
    plans = sorted((s / "validation" / "gh200" / "GPT-NEO").glob("*/plan_config_*.json"))
    if not plans:
        pytest.skip("no GPT-Neo validation plans")
    t_err, m_err = [], []
    for f in plans:
        written = import_sailor(SailorFiles(
            training_config=s / "configs" / "training_config_gpt_neo27.json",
            cluster_config=s / "configs" / "basic_cluster_config.json",
            profiles=s / "profiles" / "GPT-Neo-2.7",
            transfer_profiles=s / "profiles" / "OPT-350",
            transfer_training_config=s / "configs" / "training_config_opt_350.json",
            network=s / "network", plan=f), tmp_path / f.stem)
        problem = load_problem(written["scenario.yaml"])
        plan = TrainingPlan.model_validate(json.loads(written["plan.json"].read_text()))
        assert problem.profile.source("GH200-96GB", 4).startswith("scaled from OPT-350")
        est = estimate(problem, plan)
        measured = json.loads(f.read_text())
        t_err.append(abs(est.iteration_time_s / measured["real"] - 1))
        m_err.append(abs(est.peak_memory_bytes / measured["max_mem"] - 1))
    assert np.mean(t_err) < NEO_TIME_MAPE
    assert np.mean(m_err) < NEO_MEM_MAPE


def test_import_round_trip(reference_dir, tmp_path):
    f = next(p for p in _plans(reference_dir) if p.name == "plan_config_N4_D2.json")
    written = _import(reference_dir, f, tmp_path / "out")
    assert set(written) == {"scenario.yaml", "profile.json", "plan.json"}
    assert all(p.parent == tmp_path / "out" and p.is_file() for p in written.values())
    assert not list((tmp_path / "out").glob("*.tmp"))

    scn = load_scenario(written["scenario.yaml"])
    problem = load_problem(written["scenario.yaml"])
    plan = TrainingPlan.model_validate(json.loads(written["plan.json"].read_text()))
    validate_plan(problem, plan, str(written["plan.json"]))

    sailor = json.loads(f.read_text())
    pl = sailor["pipeline_list"][0]
    # the model comes from the training config, the batch from the plan file
    assert problem.model.num_layers == 24 and problem.model.hidden_size == 1024
    assert problem.job.global_batch == sailor["gbs"]
    assert plan.microbatch_size == sailor["mbs"]
    assert scn.profiles.compute == "profile.json"
    assert problem.profile.source("GH200-96GB", 4).startswith("measured")
    # stages and replicas as in the Sailor plan
    assert [s.layers[1] - s.layers[0] for s in plan.stages] == [len(x) for x in pl["layers_per_stage"]]
    assert [len(s.replicas) for s in plan.stages] == pl["dp"]
    # the pool is exactly the GPUs the plan uses
    assert problem.avail == plan.gpu_counts()
    assert sum(problem.avail.values()) == plan.num_gpus == sum(tp for st in pl["tmp_per_stage"]
                                                               for (_, tp) in st)
    assert problem.gpus["GH200-96GB"].gpus_per_node == 4
    # re-estimating the written files gives a finite, memory-feasible estimate
    est = estimate(problem, plan)
    assert not est.oom and est.iteration_time_s > 0


def test_importer_names_every_sailor_gpu(reference_dir):
    """Sailor's short GPU names (directory names of its profiles) are catalog aliases."""
    for d in sorted((reference_dir / "sailor" / "profiles" / "OPT-350").iterdir()):
        if d.is_dir():
            catalog.gpus().canonical(d.name)
