"""The command line: exit codes, the --json contract (DESIGN §6) and readable errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from tests._inputs import sailor_config_and_plan
from typer.testing import CliRunner

from shoal.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "het-a100-v100.yaml"
PLAN = ROOT / "examples" / "het-a100-v100.plan.json"

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_estimate_prints_tables():
    res = run("estimate", SCENARIO, "--plan", PLAN)
    assert res.exit_code == 0, res.output
    for word in ("Stages", "Workers", "iteration time", "tokens/s", "V100-16GB", "A100-40GB"):
        assert word in res.stdout


def test_estimate_json_contract():
    res = run("estimate", SCENARIO, "--plan", PLAN, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)  # nothing but the JSON object on stdout
    for key in ("iteration_time_s", "throughput_iters_per_s", "tokens_per_s", "oom", "workers",
                "stages"):
        assert key in data
    assert set(data["cost_per_iteration_usd"]) >= {"compute", "egress", "total"}
    cost = data["cost_per_iteration_usd"]
    assert cost["total"] == pytest.approx(cost["compute"] + cost["egress"])
    assert isinstance(data["oom"], bool)
    assert data["iteration_time_s"] > 0
    assert data["throughput_iters_per_s"] == pytest.approx(1 / data["iteration_time_s"])
    assert len(data["workers"]) == 24
    for w in data["workers"]:
        assert set(w) >= {"stage", "replica", "gpu", "zone", "peak_memory_bytes", "capacity_bytes"}
    assert [s["layers"] for s in data["stages"]] == [[0, 12], [12, 23], [23, 34]]


def test_plan_may_be_yaml(tmp_path):
    import yaml

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(json.loads(PLAN.read_text())))
    res = run("estimate", SCENARIO, "--plan", plan, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["iteration_time_s"] > 0


def test_misspelt_gpu_names_file_field_and_close_match(tmp_path):
    bad = tmp_path / "scenario.yaml"
    bad.write_text(SCENARIO.read_text().replace("A100-40GB: 32", "A100-40BG: 32"))
    res = run("estimate", bad, "--plan", PLAN)
    assert res.exit_code == 2
    msg = res.stderr
    assert str(bad) in msg
    assert "pool.regions.us-central1.zones.us-central1-a.gpus.A100-40BG" in msg
    assert "did you mean 'A100-40GB'" in msg
    assert "Traceback" not in res.output


def test_misspelt_gpu_in_plan_names_plan_file(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(PLAN.read_text().replace("V100-16GB", "V100-61GB", 1))
    res = run("estimate", SCENARIO, "--plan", bad)
    assert res.exit_code == 2
    assert str(bad) in res.stderr and "stages.0.replicas.0.gpu" in res.stderr
    assert "V100-16GB" in res.stderr
    assert "Traceback" not in res.output


def test_malformed_yaml_exits_2(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("model: [GPT-Neo-2.7B\njob: {global_batch: 8\n")
    res = run("estimate", bad, "--plan", PLAN)
    assert res.exit_code == 2
    assert "malformed YAML" in res.stderr and str(bad) in res.stderr
    assert "Traceback" not in res.output


def test_a_key_given_twice_in_yaml_exits_2_naming_both_lines(tmp_path):
    text = (ROOT / "examples" / "opt350m-two-zones.yaml").read_text()
    zone = "us-central1-a:"
    assert text.count(zone) == 1
    twice = tmp_path / "twice.yaml"
    twice.write_text(text.replace("us-central1-b:", zone))  # two zones of one name
    res = run("plan", twice, "--budget", "5")
    assert res.exit_code == 2, res.output
    first = text[:text.index(zone)].count("\n") + 1
    assert "'us-central1-a' given twice" in res.stderr and f"first at line {first}" in res.stderr


def test_a_key_given_twice_in_json_exits_2(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(PLAN.read_text().replace('{', '{"name": "x", "name": "y", ', 1))
    res = run("estimate", SCENARIO, "--plan", plan)
    assert res.exit_code == 2, res.output
    assert "'name' given twice" in res.stderr and str(plan) in res.stderr


def test_invalid_plan_field_exits_2(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"microbatch_size": 0, "stages": []}))
    res = run("estimate", SCENARIO, "--plan", bad)
    assert res.exit_code == 2
    assert str(bad) in res.stderr and "microbatch_size" in res.stderr


def test_missing_file_exits_2(tmp_path):
    res = run("estimate", tmp_path / "nope.yaml", "--plan", PLAN)
    assert res.exit_code == 2
    assert "file not found" in res.stderr
    res = run("estimate", tmp_path, "--plan", PLAN)  # a folder
    assert res.exit_code == 2
    assert "a folder, not a file" in res.stderr


@pytest.mark.parametrize("kind", ["scenario", "plan"])
def test_schema_is_json(kind):
    res = run("schema", kind)
    assert res.exit_code == 0, res.output
    assert "properties" in json.loads(res.stdout)


@pytest.mark.parametrize(("kind", "pattern"), [("scenario", "*.yaml"), ("plan", "*.plan.json"),
                                             ("serving", "*.serving.yaml")])
def test_schema_accepts_the_examples_and_what_the_loader_takes(kind, pattern):
    """Every bundled file validates against its `shoal schema`; so do the shorthands the
    loaders take (an objective's name, one value for a list of choices), and values outside
    their choices do not."""
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    res = run("schema", kind)
    check = jsonschema.Draft202012Validator(json.loads(res.stdout))
    files = [f for f in sorted((ROOT / "examples").glob(pattern))
             if kind == "serving" or ".serving." not in f.name]
    assert files
    for f in files:
        errors = [e.message for e in check.iter_errors(yaml.safe_load(f.read_text()))]
        assert not errors, (f.name, errors)
    if kind == "scenario":
        doc = yaml.safe_load(SCENARIO.read_text())
        doc["objective"] = {"goal": "min-cost"}
        doc["job"].update(recompute=True, zero_stage=2, schedule="gpipe")
        assert not list(check.iter_errors(doc))
        for field, bad in (("objective", "fastest"), ("zero_stage", 5), ("schedule", ["zb"])):
            wrong = copy.deepcopy(doc)
            (wrong if field == "objective" else wrong["job"])[field] = bad
            assert list(check.iter_errors(wrong)), field


def test_schema_defaults_to_scenario():
    res = run("schema")
    assert res.exit_code == 0
    assert "pool" in json.loads(res.stdout)["properties"]


def test_catalog_gpus_json():
    res = run("catalog", "gpus", "--json")
    assert res.exit_code == 0, res.output
    gpus = json.loads(res.stdout)["gpus"]
    assert len(gpus) >= 18
    assert {"A100-40GB", "V100-16GB", "H100-80GB"} <= {g["name"] for g in gpus}
    for g in gpus:  # every catalog number comes with its source (the CPU test entry has none)
        if g["name"] != "cpu":
            assert {"flops", "memory", "mem_bandwidth"} <= set(g["source"]), g["name"]
            assert g["price_usd_per_h"] is None or "price" in g["source"], g["name"]


def test_catalog_models():
    res = run("catalog", "models", "--json")
    assert res.exit_code == 0, res.output
    models = {m["name"]: m for m in json.loads(res.stdout)["models"]}
    assert models["GPT-Neo-2.7B"]["params_billions"] == pytest.approx(2.7, rel=0.05)
    assert run("catalog", "models").exit_code == 0
    assert run("catalog", "gpus").exit_code == 0


def test_import_sailor_needs_a_pool(tmp_path):
    cfg = tmp_path / "training_config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_layers": 2, "heads": 4, "vocab_size": 256,
                               "global_batch_size": 8}))
    res = run("import", "sailor", "--training-config", cfg, "-o", tmp_path / "out")
    assert res.exit_code == 2
    assert "pool" in res.stderr
    assert not (tmp_path / "out").exists()


def test_import_sailor_plan_json(tmp_path):
    cfg, plan = sailor_config_and_plan(tmp_path)
    out = tmp_path / "out"
    res = run("import", "sailor", "--training-config", cfg, "--plan", plan, "-o", out, "--json")
    assert res.exit_code == 0, res.output
    written = json.loads(res.stdout)["written"]
    assert set(written) == {"scenario.yaml", "plan.json"}
    assert all(Path(p).is_file() for p in written.values())


def test_error_kinds_map_to_exit_codes():
    import typer
    from pydantic import BaseModel

    from shoal.cli.common import handles_errors
    from shoal.errors import InfeasibleError, ShoalError, SpecError

    class M(BaseModel):
        x: int

    errors = {
        "infeasible": (InfeasibleError("nothing fits", binding="memory"), 3),
        "spec": (SpecError("bad", file="f.yaml", field="a.b"), 2),
        "other": (ShoalError("odd input"), 2),
        "pydantic": (None, 2),
    }
    mini = typer.Typer()

    @mini.command()
    @handles_errors
    def fail(kind: str) -> None:
        if kind == "pydantic":
            M.model_validate({"x": "not a number"})
        raise errors[kind][0]

    for kind, (_, code) in errors.items():
        res = runner.invoke(mini, [kind])
        assert res.exit_code == code, (kind, res.output)
        assert res.stderr.startswith("error: ") and "Traceback" not in res.output


def test_module_entry_point_exit_code(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "broken.yaml"
    bad.write_text("pool: [\n")
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "estimate", str(bad), "--plan", str(PLAN)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "malformed YAML" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_profiles_training_config_needs_profiles(tmp_path):
    cfg = tmp_path / "training_config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_layers": 2, "heads": 4, "vocab_size": 256}))
    res = run("import", "sailor", "--training-config", cfg, "--profiles-training-config", cfg,
              "-o", tmp_path / "out")
    assert res.exit_code == 2
    assert "--profiles-training-config" in res.stderr and "Traceback" not in res.output


# ---- shoal plan -------------------------------------------------------------------------------

SMALL_PLAN_SCENARIO = """
model: {name: small, num_layers: 4, hidden_size: 1024, num_heads: 16, vocab_size: 32000}
job: {global_batch: 32, seq_len: 2048}
pool:
  regions:
    us-central1:
      zones:
        us-central1-a: {gpus: {A100-40GB: 4, V100-16GB: 4}}
network:
  defaults:
    same_zone: {bandwidth: 100Gbps, latency: 20us}
"""


def test_plan_json_and_outputs(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text(SMALL_PLAN_SCENARIO)
    best = tmp_path / "best.json"
    fig = tmp_path / "front.png"
    r = runner.invoke(app, ["plan", str(scn), "--json", "-o", str(best), "--figure", str(fig),
                            "--top", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for key in ("search_time_s", "plans", "pareto", "stats"):
        assert key in d
    assert 1 <= len(d["plans"]) <= 3
    first = d["plans"][0]
    assert first["plan"]["schema"] == "shoal/training-plan@1"
    assert first["estimate"]["oom"] is False
    assert json.loads(best.read_text()) == first["plan"]
    assert fig.stat().st_size > 5000
    # the written plan estimates unchanged
    r = runner.invoke(app, ["estimate", str(scn), "--plan", str(best), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration_time_s"] == pytest.approx(
        first["estimate"]["iteration_time_s"])


def test_what_to_rent_covers_the_gpus_used_with_no_gpu_idle(tmp_path):
    """VMs hold the plan's TP groups exactly: whole nodes, then powers of two (one GPU used of
    an 8-GPU type rents a 1-GPU VM, not a node of 8)."""
    from shoal.training.rent import vm_shapes

    assert vm_shapes([1], 8) == {1: 1}
    assert vm_shapes([4, 4, 4], 8) == {8: 1, 4: 1}
    assert vm_shapes([1] * 15, 8) == {8: 1, 4: 1, 2: 1, 1: 1}
    assert vm_shapes([4, 4], 6) == {4: 2}  # a TP-4 group never shares a 6-GPU node
    scn = tmp_path / "s.yaml"
    scn.write_text(SMALL_PLAN_SCENARIO)
    r = runner.invoke(app, ["plan", str(scn), "--json", "--top", "1"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)["plans"][0]
    for row in plan["rent"]:
        tps = [rep["tp"] for st in plan["plan"]["stages"] for rep in st["replicas"]
               if (rep["gpu"], rep["zone"]) == (row["gpu"], row["zone"])]
        assert sum(v["gpus_per_vm"] * v["count"] for v in row["vms"]) == row["gpus"] == sum(tps)
        assert row["nodes"] == sum(v["count"] for v in row["vms"])


def test_plan_infeasible_exits_3(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text(SMALL_PLAN_SCENARIO)
    r = runner.invoke(app, ["plan", str(scn), "--max-cost-per-iter", "1e-12"])
    assert r.exit_code == 3
    assert "max $/iteration" in r.output and "Traceback" not in r.output
    # with --json, the error is also the one JSON object on stdout
    r = runner.invoke(app, ["plan", str(scn), "--max-cost-per-iter", "1e-12", "--json"])
    assert r.exit_code == 3
    err = json.loads(r.stdout)["error"]
    assert err["exit_code"] == 3 and err["binding"] == "max $/iteration"
    assert err["relaxation"].startswith("max_cost_per_iteration_usd >=")
    r = runner.invoke(app, ["estimate", str(tmp_path / "missing.yaml"), "--plan", str(PLAN),
                            "--json"])
    assert r.exit_code == 2
    assert json.loads(r.stdout)["error"]["file"].endswith("missing.yaml")


def test_usage_errors_exit_2_and_under_json_print_the_error_object(monkeypatch, capsys):
    from shoal.cli import main

    for args, option in ((["plan", "s.yaml", "--top", "0", "--json"], "--top"),
                         (["plan", "s.yaml", "--objective", "cheapest", "--json"], "--objective"),
                         (["replay", "s.yaml", "--synthetic", "spot", "--seed", "-1", "--json"],
                          "--seed")):
        monkeypatch.setattr("sys.argv", ["shoal", *args])
        with pytest.raises(SystemExit) as ei:
            main()
        assert ei.value.code == 2
        err = json.loads(capsys.readouterr().out)["error"]
        assert err["exit_code"] == 2 and option in err["message"]
    monkeypatch.setattr("sys.argv", ["shoal", "plan", "s.yaml", "--top", "0"])
    with pytest.raises(SystemExit) as ei:
        main()
    assert ei.value.code == 2 and capsys.readouterr().out == ""  # no --json: stderr only
    monkeypatch.setattr("sys.argv", ["shoal", "catalog", "models", "--json"])
    with pytest.raises(SystemExit) as ei:
        main()
    assert ei.value.code == 0 and json.loads(capsys.readouterr().out)


def test_command_listings_break_lines_only_where_the_terminal_does():
    """The command lists keep no line break of the docstrings' source: a summary wraps at the
    terminal's width, not in mid-sentence."""
    for args, line in ((["--help"], "training-plan or serving format."),
                       (["serve", "--help"], "node holding its layers, the coordinator")):
        res = runner.invoke(app, args, terminal_width=80)
        assert res.exit_code == 0, res.output
        assert line in res.output


def test_the_choices_of_options_are_the_registries_names():
    """The command line offers the strategies, objectives, policies, WAN schedules and file
    formats the layers below know, from the plain name lists it reads without loading them."""
    from shoal.cli import choices
    from shoal.elastic.policy import POLICIES
    from shoal.specs.reference import TITLES, roots
    from shoal.training.geo import SCHEDULES
    from shoal.training.planners import OBJECTIVES, STRATEGIES

    assert [s.value for s in choices.Strategy] == list(STRATEGIES)
    assert [g.value for g in choices.Goal] == list(OBJECTIVES)
    assert [p.value for p in choices.Policy] == [*POLICIES, "all"]
    assert [s.value for s in choices.GeoSchedule] == list(SCHEDULES)
    assert [k.value for k in choices.SchemaKind] == list(roots()) == list(TITLES)


def test_the_serving_choices_are_the_placers_and_routers_names():
    """serve plan's placers and objectives and serve simulate's routers are the ones the placers
    and the simulator check names against, in the order the help has always shown them."""
    from shoal.cli import choices
    from shoal.serving.placers import OBJECTIVES, PLACERS
    from shoal.serving.simulator.simulation import ROUTERS

    assert [p.value for p in choices.Placer] == list(PLACERS) == [
        "auto", "milp", "swarm", "petals", "separate"]
    assert [o.value for o in choices.Objective] == list(OBJECTIVES) == ["max-flow", "decode"]
    assert [r.value for r in choices.RouterName] == list(ROUTERS) == [
        "iwrr", "helix-iwrr", "swarm", "random", "shortest-queue"]
    assert [m.value for m in choices.Mode] == ["offline", "online"]


def test_the_command_line_loads_no_planner_to_start():
    """``shoal --help`` stays quick: importing the command line loads neither the planners nor
    numpy (their imports wait inside the commands)."""
    import subprocess
    import sys

    code = ("import sys, shoal.cli; print(sorted(m for m in sys.modules if m == 'numpy' or "
            "m.startswith(('shoal.training.planners', 'shoal.estimate', 'shoal.runtime', "
            "'shoal.serving.placers', 'shoal.serving.routing', 'shoal.serving.simulator'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_an_output_that_is_a_folder_is_bad_input_and_nothing_is_left(tmp_path):
    """An existing folder given where a file goes (or a file where a folder goes) exits 2
    naming the option; no temporary file is left next to it."""
    folder = tmp_path / "adir"
    folder.mkdir()
    for args, option in ((["estimate", SCENARIO, "--plan", PLAN, "--timeline", folder], "--timeline"),
                         (["plan", SCENARIO, "--budget", "5", "-o", folder], "--output"),
                         (["plan", SCENARIO, "--budget", "5", "--figure", folder], "--figure")):
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert option in res.stderr and "folder" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]
    assert not any(folder.iterdir())
    # a folder that does not exist yet, given as one (a trailing separator): no file named
    # like it is written
    for args, option in ((["plan", SCENARIO, "--budget", "5", "-o", f"{tmp_path}/new/"],
                          "--output"),
                         (["replay", SCENARIO, "--synthetic", "spot", "-o", f"{tmp_path}/new/"],
                          "--output")):
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert option in res.stderr and "a folder, not a file" in res.stderr, res.stderr
        assert "new/" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]
    cfg = tmp_path / "training_config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_layers": 2, "heads": 4, "vocab_size": 256,
                               "global_batch_size": 8}))
    taken = tmp_path / "best.json"
    taken.write_text("{}")
    res = run("import", "sailor", "--training-config", cfg, "-o", taken)
    assert res.exit_code == 2, res.output
    assert "--out" in res.stderr and "not a folder" in res.stderr


def test_writes_leave_no_temporary_file_when_they_fail(tmp_path):
    from shoal.errors import SpecError
    from shoal.files import write_json, write_text

    folder = tmp_path / "adir"
    folder.mkdir()
    with pytest.raises(SpecError, match="folder"):
        write_json(folder, {"a": 1})
    with pytest.raises(UnicodeEncodeError):  # fails after the temporary file is opened
        write_text(tmp_path / "x.txt", "ok \ud800")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


@pytest.mark.parametrize("args, option", [(["--max-cost-per-iter", "nan"], "--max-cost-per-iter"),
                                          (["--max-cost-per-iter", "-1"], "--max-cost-per-iter"),
                                          (["--min-throughput", "0"], "--min-throughput"),
                                          (["--max-gpus", "-3"], "--max-gpus")])
def test_plan_constraints_from_the_command_line_are_checked(args, option):
    res = run("plan", SCENARIO, *args)
    assert res.exit_code == 2, res.output
    assert option in res.output


def test_bad_names_and_files_name_the_option_or_field(tmp_path):
    ex = ROOT / "examples"
    res = run("bubbles", ex / "atlas-gpt-3dc.yaml", "--plan", ex / "atlas-gpt-3dc.plan.json",
              "--rate", "10", "--inference-model", "foo")
    assert res.exit_code == 2 and "--inference-model: unknown model" in res.stderr
    res = run("bubbles", ex / "atlas-gpt-3dc.yaml", "--plan", ex / "atlas-gpt-3dc.plan.json",
              "--rate", "10", "--duration", "0s")
    assert res.exit_code == 2 and "--duration: must be > 0" in res.stderr
    serving = tmp_path / "s.yaml"
    serving.write_text("model: {name: LLaMA-2-70C}\nmachines: {A: {gpu: A100-40GB}}\n"
                       "nodes: [{machine: A, count: 2}]\nlinks: {within: {bandwidth: 10Gbps}}\n")
    res = run("serve", "plan", serving)
    assert res.exit_code == 2 and "model.name: unknown model" in res.stderr
    assert "LLaMA-2-70B" in res.stderr  # the suggestion
    cfg = tmp_path / "training_config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_layers": 2, "heads": 4, "vocab_size": 256,
                               "global_batch_size": 8}))
    res = run("import", "sailor", "--training-config", cfg,
              "--trace", ex / "opt350m-two-zones.events.csv", "-o", tmp_path / "out")
    assert res.exit_code == 2 and "not a CSV availability trace" in res.stderr
    assert "Timestamp" in res.stderr


def test_writes_go_through_symbolic_links_and_unwritable_paths_are_bad_input(tmp_path):
    from shoal.errors import SpecError
    from shoal.files import write_json

    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_json(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}
    if Path("/proc").is_dir():  # a file system that takes no new files
        with pytest.raises(SpecError, match="cannot write"):
            write_json("/proc/shoal-test.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


def test_a_plan_result_given_as_a_plan_says_how_to_get_the_plan(tmp_path):
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"plans": [], "pareto": [], "stats": {}}))
    res = run("estimate", SCENARIO, "--plan", result)
    assert res.exit_code == 2 and "shoal plan ... -o plan.json" in res.stderr


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_in_a_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    """--figure in a folder no file can be made in: refused up front, naming the option, and
    the plan file is not written either."""
    from shoal.errors import SpecError
    from shoal.files import check_output

    with pytest.raises(SpecError) as ei:
        check_output("/proc/front.png", "--figure")
    assert ei.value.field == "--figure"
    scn = tmp_path / "s.yaml"
    scn.write_text(SMALL_PLAN_SCENARIO)
    r = run("plan", scn, "-o", tmp_path / "p.json", "--figure", "/proc/front.png")
    assert r.exit_code == 2 and "--figure" in r.output
    assert not (tmp_path / "p.json").exists() and [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_an_output_that_is_an_input_or_another_output_is_refused(tmp_path):
    """`plan -o` on its own scenario, `estimate --timeline` on its plan, `report -o` on one of
    its inputs (also through a symbolic link), and two outputs on one path: each refused up
    front, naming the option, with every input as it was."""
    scn = tmp_path / "s.yaml"
    scn.write_text(SMALL_PLAN_SCENARIO)
    plan = tmp_path / "p.json"
    plan.write_text(PLAN.read_text())
    link = tmp_path / "link.yaml"
    link.symlink_to(scn)
    before = {p: p.read_bytes() for p in (scn, plan)}
    cases = [
        (("plan", scn, "-o", scn), "--output", "input"),
        (("plan", scn, "-o", link), "--output", "input"),
        (("estimate", SCENARIO, "--plan", plan, "--timeline", plan), "--timeline", "input"),
        (("report", plan, "-o", plan), "--output", "input"),
        (("plan", scn, "-o", tmp_path / "x.json", "--figure", tmp_path / "x.json"), "--figure",
         "same file as --output"),
    ]
    for args, option, words in cases:
        r = run(*args)
        assert r.exit_code == 2 and option in r.output and words in r.output, (args, r.output)
    assert {p: p.read_bytes() for p in (scn, plan)} == before
    assert not (tmp_path / "x.json").exists()


def test_a_figure_is_written_in_the_format_its_suffix_names(tmp_path):
    """--timeline t.svg writes SVG and t.pdf PDF; a suffix that names no figure format is
    refused before any work."""
    for name, head in (("t.svg", b"<?xml"), ("t.pdf", b"%PDF"), ("t.png", b"\x89PNG")):
        r = run("estimate", SCENARIO, "--plan", PLAN, "--timeline", tmp_path / name)
        assert r.exit_code == 0, r.output
        assert (tmp_path / name).read_bytes().startswith(head)
    r = run("estimate", SCENARIO, "--plan", PLAN, "--timeline", tmp_path / "t.txt")
    assert r.exit_code == 2 and "--timeline" in r.output and ".svg" in r.output
    assert not (tmp_path / "t.txt").exists()


def test_a_plan_saved_with_a_byte_order_mark_is_read(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_bytes(b"\xef\xbb\xbf" + PLAN.read_bytes())
    r = run("estimate", SCENARIO, "--plan", plan, "--json")
    assert r.exit_code == 0, r.output


# ---- hostile numbers and documents (issue 61, defect 7) ------------------------------------------


@pytest.mark.parametrize("old, new, field", [
    ("same_zone: 0,", "same_zone: .inf,", "network.egress_usd_per_gb.same_zone"),
    ("A100-40GB: 3.673385", "A100-40GB: .inf", "prices.gpu_usd_per_h.A100-40GB"),
    ("V100-16GB: 2.859998", "V100-16GB: .nan", "prices.gpu_usd_per_h.V100-16GB"),
    ("same_zone: {bandwidth: 32Gbps", "same_zone: {bandwidth: 1e308TB/s",
     "network.defaults.same_zone.bandwidth"),
])
def test_an_infinite_or_nan_number_in_a_scenario_is_bad_input_naming_the_field(tmp_path, old, new,
                                                                               field):
    """An infinite egress price used to be accepted (exit 0, bare Infinity in --json, the cost
    cap ignored), an infinite GPU price silently dropped those GPUs, a bandwidth scaled past the
    largest float became infinity: each is refused, naming the field."""
    text = SCENARIO.read_text()
    assert old in text
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace(old, new))
    res = run("estimate", bad, "--plan", PLAN, "--json")
    assert res.exit_code == 2, res.output
    err = json.loads(res.stdout, parse_constant=pytest.fail)["error"]  # no bare Infinity/NaN
    assert err["field"] == field
    assert "finite" in err["message"] or "too large" in err["message"]


@pytest.mark.parametrize("args, option", [
    (["serve", "plan", "SERVING", "--time-limit", "inf"], "--time-limit"),
    (["serve", "simulate", "SERVING", "--mode", "online", "--warmup", "inf", "--requests", "5"],
     "--warmup"),
])
def test_an_infinite_or_nan_command_line_number_is_bad_input_naming_the_option(tmp_path, args,
                                                                               option):
    """click reads 'inf' and 'nan' as floats and a NaN passes every min= bound: every command
    refuses them, naming the option."""
    serving = ROOT / "examples" / "llama2-70b-mixed.serving.yaml"
    res = run(*[str(serving) if a == "SERVING" else a for a in args], "--json")
    assert res.exit_code == 2, res.output
    assert json.loads(res.stdout)["error"]["field"] == option


def _deep(kind: str, levels: int) -> str:
    """A scenario whose model is a list nested ``levels`` deep."""
    inner = "[" * levels + "]" * levels
    return ('{"model": ' + inner + "}") if kind == "json" else f"model: {inner}\n"


@pytest.mark.parametrize("kind", ["yaml", "json"])
def test_a_deeply_nested_document_exits_2_with_one_line_and_the_json_error(tmp_path, kind):
    """A scenario nested 5,000 levels deep used to exit 1 with a 3,000-line traceback and no
    JSON under --json: the reader stops at its depth limit."""
    import subprocess
    import sys

    deep = tmp_path / f"deep.{kind}"
    deep.write_text(_deep(kind, 5000))
    proc = subprocess.run([sys.executable, "-m", "shoal", "plan", str(deep), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["exit_code"] == 2 and "nested more than 64 levels" in err["message"]
    assert err["file"] == str(deep)


def test_recursion_anywhere_under_a_command_is_bad_input_in_one_line(tmp_path):
    """Python's recursion limit reached by any reader (here a Sailor controller trace, a JSON
    list nested 100,000 deep) is exit 2 with one line, and under --json the error object."""
    trace = tmp_path / "trace.json"
    trace.write_text("[" * 100_000 + "]" * 100_000)
    scenario = ROOT / "examples" / "opt350m-two-zones.yaml"
    res = run("replay", scenario, "--trace", trace, "--json")
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1
    assert "nested too deeply" in json.loads(res.stdout)["error"]["message"]


BOMB = "".join(f"  - &{a} [" + ", ".join([f"*{p}"] * 9 if p else ['"lol"'] * 9) + "]\n"
               for p, a in zip(["", *"abcdefgh"], "abcdefghi", strict=True))


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """Nine aliases of nine aliases ... in a field that is not a string: a few hundred bytes
    that expand to 9^9 values. It used to hang and grow to gigabytes; it is refused when read.
    Run in a process with a memory limit, so that a regression fails rather than swaps."""
    import resource
    import subprocess
    import sys

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("schema: shoal/scenario@1\nname:\n" + BOMB + "model: OPT-350M\n"
                    "job: {global_batch: 16}\n"
                    "pool: {regions: {r: {zones: {z: {gpus: {A100-40GB: 8}}}}}}\n")
    assert len(bomb.read_bytes()) < 1000

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    try:
        proc = subprocess.run([sys.executable, "-m", "shoal", "plan", str(bomb), "--json"],
                              capture_output=True, text=True, timeout=240, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb was not refused within 240 s")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "aliases expand to" in json.loads(proc.stdout)["error"]["message"]


def test_an_error_caps_the_value_it_repeats(tmp_path):
    """A bad value is repeated in the message at most ~200 characters, with an ellipsis; it
    used to be echoed whole (here a model name of 100,000 characters, and a bandwidth)."""
    text = SCENARIO.read_text()
    for old, new in (("model: GPT-Neo-2.7B", "model: " + "A" * 100_000),
                     ("bandwidth: 32Gbps", "bandwidth: " + "9" * 100_000 + "x")):
        bad = tmp_path / "s.yaml"
        bad.write_text(text.replace(old, new))
        res = run("estimate", bad, "--plan", PLAN, "--json")
        assert res.exit_code == 2, res.output[:2000]
        err = json.loads(res.stdout)["error"]
        assert len(err["message"]) < 1500 and "\u2026" in err["message"], err["message"][:3000]
        assert len(res.stderr) < 2000
        assert len(json.dumps(err.get("value", ""))) < 400


def test_outputs_make_their_missing_folders(tmp_path):
    """Every option that writes a file (or a folder) makes the folders on the way to it; a
    file in the way is bad input, and a command that fails writes nothing."""
    ex = ROOT / "examples"
    cases = [
        (["estimate", SCENARIO, "--plan", PLAN, "--timeline", "{d}/t.png"], ["t.png"]),
        (["plan", ex / "opt350m-two-zones.yaml", "--budget", "5", "-o", "{d}/out.json",
          "--figure", "{d}/front.svg"], ["front.svg", "out.json"]),
        (["replay", ex / "opt350m-two-zones.yaml", "--synthetic", "spot", "--hours", "1",
          "--budget", "5", "-o", "{d}/r.json"], ["r.json"]),
        (["serve", "plan", ex / "llama2-70b-mixed.serving.yaml", "--time-limit", "5",
          "-o", "{d}/p.json"], ["p.json"]),
    ]
    for i, (args, names) in enumerate(cases):
        d = tmp_path / f"c{i}" / "a" / "b"
        res = run(*[str(a).format(d=d) for a in args], "--quiet")
        assert res.exit_code == 0, res.output
        assert sorted(p.name for p in d.iterdir()) == names, args
    est = tmp_path / "c0" / "e.json"
    res = run("estimate", SCENARIO, "--plan", PLAN, "--json")
    est.write_text(res.stdout)
    res = run("report", est, "-o", tmp_path / "rep" / "x" / "r.html")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "x" / "r.html").read_text().startswith("<!DOCTYPE html>")
    # an import's output folder, nested
    cfg, plan = sailor_config_and_plan(tmp_path)
    out = tmp_path / "imp" / "x" / "y"
    res = run("import", "sailor", "--training-config", cfg, "--plan", plan, "-o", out)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "scenario.yaml"]
    # and the scenario it writes (no network given) estimates on the catalog's links
    res = run("estimate", out / "scenario.yaml", "--plan", out / "plan.json")
    assert res.exit_code == 0, res.output
    # a file on the way: exit 2, nothing made
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = run("plan", ex / "opt350m-two-zones.yaml", "--budget", "5", "-o", blocker / "a" / "o.json")
    assert res.exit_code == 2 and "no folder can be made" in res.stderr, res.output
    # bad input found after the outputs are checked: no folder is made for them
    res = run("estimate", SCENARIO, "--plan", tmp_path / "missing.json", "--timeline",
              tmp_path / "never" / "t.png")
    assert res.exit_code == 2 and not (tmp_path / "never").exists()


def test_import_helix_makes_its_folder(reference_dir, tmp_path):
    h = reference_dir / "helix"
    out = tmp_path / "a" / "b"
    res = run("import", "helix", "--cluster", h / "clusters" / "cluster10.ini", "--machines",
              h / "clusters" / "machine_profiles.ini", "--capacity", h / "node_capacity.json",
              "-o", out)
    assert res.exit_code == 0, res.output
    assert (out / "serving.yaml").is_file()
