"""Software stacks (job.stack), measured runs and ``shoal calibrate``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from shoal.catalog.stacks import DEFAULT_STACK, resolve_stack, stacks
from shoal.cli import app
from shoal.errors import SpecError
from shoal.estimate import calibrate as cal
from shoal.estimate import estimate
from shoal.problem import build_problem
from shoal.specs.measurements import MeasuredRun, read_runs
from shoal.specs.scenario import parse_scenario
from shoal.specs.stack import KernelEfficiency

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

runner = CliRunner()


def test_every_built_in_stack_is_complete_and_says_where_its_numbers_come_from():
    got = stacks()
    assert {"megatron", "fsdp", "deepspeed", "hf-eager", "shoal", "sailor-testbed"} <= set(got)
    assert DEFAULT_STACK in got
    for name, st in got.items():
        d = st.kernel_efficiency("A100-40GB", "Ampere")
        assert all(0 < d[k] <= 1 for k in ("gemm", "attention_fwd", "attention_bwd", "memory"))
        assert "kernels" in st.sources, name  # every kernel number is sourced
        sections = {k.split(".")[0] for k in st.sources}
        assert {"timing", "memory"} & sections, name


def test_a_stack_takes_another_stacks_kernels_under_its_own():
    fsdp, mega = stacks()["fsdp"], stacks()["megatron"]
    assert mega.kernels["Hopper"] == fsdp.kernels["Hopper"]
    own = mega.model_copy(update={"kernels": {"Hopper": KernelEfficiency(gemm=0.5)},
                                  "kernels_from": "fsdp"}).with_kernels_of(fsdp)
    assert own.kernel_efficiency("H100-80GB", "Hopper")["gemm"] == 0.5
    assert own.kernel_efficiency("H100-80GB", "Hopper")["memory"] == fsdp.kernels["Hopper"].memory


def test_an_unknown_stack_is_bad_input_with_a_close_name(tmp_path, scenario_dict):
    scenario_dict["job"]["stack"] = "megatorn"
    with pytest.raises(SpecError) as e:
        build_problem(parse_scenario(scenario_dict), file=str(tmp_path / "s.yaml"))
    assert e.value.field == "job.stack" and e.value.suggestion == "megatron"
    with pytest.raises(SpecError) as e:
        resolve_stack("missing.yaml", base=tmp_path)
    assert "missing.yaml" in str(e.value)


def test_the_stack_changes_the_estimate(scenario_dict):
    from shoal.specs.plan import TrainingPlan

    plan = TrainingPlan.model_validate({"microbatch_size": 1, "stages": [{"layers": [0, 26],
                                        "replicas": [{"gpu": "A100-40GB", "tp": 1,
                                                      "zone": "us-central1-a",
                                                      "microbatches": 16}]}]})
    times = {}
    for name in ("megatron", "hf-eager", "sailor-testbed"):
        scenario_dict["job"]["stack"] = name
        times[name] = estimate(build_problem(parse_scenario(scenario_dict)), plan).iteration_time_s
    assert times["megatron"] < times["hf-eager"] < times["sailor-testbed"]


# ---- measured runs and calibration --------------------------------------------------------

RUN = {"num_layers": 8, "hidden_size": 1024, "num_heads": 8, "vocab_size": 32000,
       "gpu": "A100-80GB", "gpus": 8, "global_batch": 32, "microbatch": 4, "seq_len": 2048,
       "zero_stage": 3}


def test_measured_runs_read_from_csv_and_json_and_name_a_bad_row(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("name,num_layers,hidden_size,num_heads,vocab_size,gpu,gpus,global_batch,"
                   "microbatch,seq_len,zero_stage,recompute,tokens_per_s_per_gpu\n"
                   "a,8,1024,8,32000,A100-80GB,8,32,4,2048,3,false,50000\n")
    (run,) = read_runs(csv)
    assert run.measured_step_s() == pytest.approx(32 * 2048 / (50000 * 8))
    js = tmp_path / "runs.json"
    js.write_text(json.dumps({"runs": [RUN | {"step_time_s": 1.5}, RUN | {"gpus": 6, "tp": 4,
                                                                          "step_time_s": 1.0}]}))
    with pytest.raises(SpecError) as e:
        read_runs(js)
    assert e.value.field.startswith("runs.1") and "multiple of tp x pp" in str(e.value)


def _synthetic(true_stack) -> list[MeasuredRun]:
    """Runs measured on a stack we know: the estimator's own predictions under it."""
    out = []
    for i, (layers, hidden, seq, mbs, gpus) in enumerate([
            (8, 1024, 2048, 4, 8), (12, 2048, 2048, 2, 8), (8, 1024, 8192, 1, 8),
            (16, 2560, 4096, 2, 16), (6, 768, 1024, 16, 8), (24, 2048, 2048, 4, 8)]):
        run = MeasuredRun.model_validate(RUN | {
            "name": f"r{i}", "group": f"g{i % 3}", "num_layers": layers, "hidden_size": hidden,
            "num_heads": hidden // 128, "seq_len": seq, "max_seq_len": seq, "microbatch": mbs,
            "gpus": gpus, "global_batch": mbs * gpus * 2, "step_time_s": 1.0})
        row = cal.rows_for([run], true_stack)[0]
        t = estimate(row.problem, row.plan).iteration_time_s
        out.append(run.model_copy(update={"step_time_s": t}))
    return out


def test_calibration_recovers_the_constants_of_runs_it_was_given():
    """Runs timed under known Ampere efficiencies: a fit started from other values finds
    them again (so the errors it reports are the model's, not the fitter's)."""
    fsdp = stacks()["fsdp"]
    truth = {"gemm": 0.6, "attention_fwd": 0.5, "attention_bwd": 0.3, "memory": 0.5}
    true_stack = fsdp.model_copy(update={"kernels": dict(fsdp.kernels) | {
        "Ampere": KernelEfficiency(**truth)}})
    runs = _synthetic(true_stack)
    start = fsdp.model_copy(update={"kernels": dict(fsdp.kernels) | {
        "Ampere": KernelEfficiency(gemm=0.8, attention_fwd=0.7, attention_bwd=0.2, memory=0.3)}})
    rows = cal.rows_for(runs, start)
    assert cal.summary(cal.errors(rows, start))["time_mape_pct"] > 5  # the start is off
    fitted = cal.fit(rows, start)
    assert cal.summary(cal.errors(rows, fitted))["time_mape_pct"] < 0.5
    got = fitted.kernel_efficiency("A100-80GB", "Ampere")
    assert got["gemm"] == pytest.approx(truth["gemm"], rel=0.05)


def test_shoal_calibrate_writes_a_stack_a_scenario_names(tmp_path, scenario_dict):
    fsdp = stacks()["fsdp"]
    true_stack = fsdp.model_copy(update={"kernels": dict(fsdp.kernels) | {
        "Ampere": KernelEfficiency(gemm=0.6, attention_fwd=0.5, attention_bwd=0.3, memory=0.5)}})
    runs = tmp_path / "mine.json"
    runs.write_text(json.dumps([r.model_dump(exclude_none=True) for r in _synthetic(true_stack)]))
    out = tmp_path / "mine.yaml"
    res = runner.invoke(app, ["calibrate", str(runs), "--stack", "fsdp", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["stack"] == "mine" and len(doc["runs"]) == 6
    assert doc["leave_group_out"]["time_mape_pct"] is not None
    assert all(r["held_out_error_pct"] is not None for r in doc["runs"])
    written = yaml.safe_load(out.read_text())
    assert written["name"] == "mine" and "kernels.Ampere" in written["sources"]
    scenario_dict["job"]["stack"] = str(out)
    pb = build_problem(parse_scenario(scenario_dict))
    assert pb.stack.name == "mine"
    # the table form prints both errors per run
    res = runner.invoke(app, ["calibrate", str(runs), "--stack", "fsdp", "-o", str(out)])
    assert res.exit_code == 0 and "left out" in res.output


@pytest.mark.reference
def test_the_shipped_fsdp_stack_on_llm_foundrys_runs(reference_dir):
    """llm-foundry's 209 BF16 runs under the shipped fsdp stack: tokens/s per GPU within 10%
    (mean) on each GPU type, and no run that ran predicted out of memory
    (``benchmarks/fidelity.py`` also leaves each model size out)."""
    from _foundry import runs as foundry_runs

    runs = [MeasuredRun.model_validate(r) for r in foundry_runs(reference_dir / "llm-foundry")]
    assert len(runs) == 209
    errs = cal.errors(cal.rows_for(runs, stacks()["fsdp"]), stacks()["fsdp"])
    for gpu in ("A100-40GB", "A100-80GB", "H100-80GB"):
        mine = [e for e in errs if e["gpu"] == gpu]
        assert sum(abs(e["time_error_pct"]) for e in mine) / len(mine) < 10, gpu
    assert not any(e["predicted_oom"] for e in errs)
