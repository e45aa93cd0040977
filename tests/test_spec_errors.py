"""Every bad input is a SpecError that names the file, the field path, the bad value and what is
allowed (or a close match), so a person can act on it without a traceback (DESIGN §4)."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from shoal import catalog
from shoal.errors import ShoalError, SpecError
from shoal.estimate import estimate
from shoal.estimate.validate import validate_plan
from shoal.problem import build_problem, load_problem
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario, spec_error_from_validation

F = "x.yaml"
ZONE_A = "us-central1-a"
ZONE_B = "us-central1-b"
N_LAYERS = 26  # OPT-350M: embedding + 24 blocks + head


def build(data: dict):
    return build_problem(parse_scenario(data, file=F), file=F)


def zone_gpus(data: dict, zone: str = ZONE_A) -> dict:
    return data["pool"]["regions"]["us-central1"]["zones"][zone]["gpus"]


def rep(gpu="A100-40GB", tp=1, zone=ZONE_A, m=16) -> dict:
    return {"gpu": gpu, "tp": tp, "zone": zone, "microbatches": m}


def plan(stages, mbs=1, **kw) -> TrainingPlan:
    return TrainingPlan.model_validate({"microbatch_size": mbs, "stages": stages, **kw})


def one_stage(*replicas, mbs=1) -> TrainingPlan:
    return plan([{"layers": [0, N_LAYERS], "replicas": list(replicas or [rep()])}], mbs=mbs)


@pytest.fixture
def problem(scenario_dict):
    return build(scenario_dict)


def test_valid_base_scenario_builds(problem):
    """The starting point of every test below is itself valid."""
    assert problem.n_layers == N_LAYERS
    validate_plan(problem, one_stage(), "plan.json")


def test_spec_error_is_a_shoal_error():
    assert issubclass(SpecError, ShoalError)


# ---- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "meant"), [("H10O-80GB", "H100-80GB"), ("A100-40GBB", "A100-40GB")])
def test_unknown_gpu_in_pool_suggests_close_match(scenario_dict, bad, meant):
    zone_gpus(scenario_dict)[bad] = 2
    with pytest.raises(SpecError) as ei:
        build(scenario_dict)
    e = ei.value
    assert e.file == F
    assert e.field == f"pool.regions.us-central1.zones.{ZONE_A}.gpus.{bad}"
    assert e.value == bad
    assert e.allowed
    assert e.suggestion is not None
    assert catalog.gpus().canonical(e.suggestion) == meant
    assert repr(e.suggestion) in str(e)


def test_unknown_model_suggests_close_match(scenario_dict):
    scenario_dict["model"] = "OPT-350N"
    with pytest.raises(SpecError) as ei:
        build(scenario_dict)
    e = ei.value
    assert (e.file, e.field, e.value) == (F, "model", "OPT-350N")
    assert e.suggestion is not None
    assert catalog.models().canonical(e.suggestion) == "OPT-350M"
    assert "did you mean" in str(e)


def test_unknown_gpu_in_plan(problem):
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, one_stage(rep(gpu="V100-61GB")), "plan.json")
    e = ei.value
    assert (e.file, e.field, e.value) == ("plan.json", "stages.0.replicas.0.gpu", "V100-61GB")
    assert catalog.gpus().canonical(e.suggestion) in ("V100-16GB", "V100-32GB")


def test_zone_not_in_pool_in_plan(problem):
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, one_stage(rep(zone="us-east1-b")), "plan.json")
    e = ei.value
    assert (e.field, e.value) == ("stages.0.replicas.0.zone", "us-east1-b")
    assert ZONE_A in e.allowed and ZONE_B in e.allowed


# ---- counts -------------------------------------------------------------------------------------


def test_zero_global_batch(scenario_dict):
    scenario_dict["job"]["global_batch"] = 0
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    e = ei.value
    assert (e.file, e.field, e.value) == (F, "job.global_batch", 0)
    assert "greater than 0" in str(e)


def test_microbatch_sizes_none_of_which_divides_the_batch(scenario_dict):
    scenario_dict["job"]["microbatch_sizes"] = [3, 5]
    scenario_dict["job"]["global_batch"] = 32
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert "none of [3, 5] divides the global batch 32" in str(ei.value)
    scenario_dict["job"]["microbatch_sizes"] = [3, 4]  # one that does is enough
    parse_scenario(scenario_dict, file=F)


@pytest.mark.parametrize("within", [0, "0s", "1e400h", float("nan")])
def test_deadline_within_a_positive_finite_time(scenario_dict, within):
    scenario_dict["constraints"] = {"deadline": {"iterations": 10, "within": within}}
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert ei.value.field == "constraints.deadline.within"


@pytest.mark.parametrize(("every", "words"), [("often", "cannot read 'often' as a time"),
                                              (0, "greater than 0"), ("-5s", "greater than")])
def test_checkpoint_interval_is_auto_or_a_positive_time(scenario_dict, every, words):
    """``switching.checkpoint_interval`` is ``auto`` or a time: a bad value is named as a bad
    time, and the keyword it may be instead follows."""
    scenario_dict["switching"] = {"checkpoint_interval": every}
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert ei.value.field == "switching.checkpoint_interval" and words in str(ei.value)
    assert ", or 'auto'" in str(ei.value) and "more problem" not in str(ei.value)
    for good, want in (("auto", "auto"), ("90s", 90.0), (30, 30.0)):
        scenario_dict["switching"] = {"checkpoint_interval": good}
        assert parse_scenario(scenario_dict, file=F).switching.checkpoint_interval == want


def test_negative_gpu_count_in_pool(scenario_dict):
    zone_gpus(scenario_dict)["A100-40GB"] = -4
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    e = ei.value
    assert e.file == F
    # the GPU name is part of the path (it starts with a capital letter, like a pydantic type name)
    assert e.field == f"pool.regions.us-central1.zones.{ZONE_A}.gpus.A100-40GB"
    assert e.value == -4
    assert "greater than or equal to 0" in str(e)


def test_zero_tp_in_plan():
    data = {"microbatch_size": 1, "stages": [{"layers": [0, N_LAYERS], "replicas": [rep(tp=0)]}]}
    with pytest.raises(ValidationError) as ei:
        TrainingPlan.model_validate(data)
    e = spec_error_from_validation(ei.value, "plan.json")
    assert (e.file, e.field, e.value) == ("plan.json", "stages.0.replicas.0.tp", 0)


def test_zero_microbatch_size_in_plan():
    data = {"microbatch_size": 0, "stages": [{"layers": [0, N_LAYERS], "replicas": [rep()]}]}
    with pytest.raises(ValidationError) as ei:
        TrainingPlan.model_validate(data)
    e = spec_error_from_validation(ei.value, "plan.json")
    assert (e.field, e.value) == ("microbatch_size", 0)


def test_bad_unit_in_network(scenario_dict):
    scenario_dict["network"]["defaults"]["same_zone"]["bandwidth"] = "100Gb"
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    e = ei.value
    assert e.field == "network.defaults.same_zone.bandwidth"
    assert e.value == "100Gb"
    assert "10Gbps" in str(e)  # the example of what to write


# ---- layer ranges -------------------------------------------------------------------------------


@pytest.mark.parametrize(("ranges", "field", "value"), [
    ([(0, 10), (11, 26)], "stages.1.layers", [11, 26]),  # gap
    ([(0, 10), (9, 26)], "stages.1.layers", [9, 26]),  # overlap
    ([(1, 26)], "stages.0.layers", [1, 26]),  # does not start at the embedding
    ([(0, 10), (10, 10), (10, 26)], "stages.1.layers", [10, 10]),  # empty stage
])
def test_layer_ranges_must_tile(problem, ranges, field, value):
    p = plan([{"layers": list(r), "replicas": [rep()]} for r in ranges])
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, p, "plan.json")
    e = ei.value
    assert (e.file, e.field, e.value) == ("plan.json", field, value)
    assert "tile" in e.reason
    assert e.allowed


@pytest.mark.parametrize("end", [25, 27])
def test_layer_ranges_must_cover_the_end(problem, end):
    p = plan([{"layers": [0, 10], "replicas": [rep()]}, {"layers": [10, end], "replicas": [rep()]}])
    with pytest.raises(SpecError) as ei:
        estimate(problem, p, file="plan.json")
    e = ei.value
    assert (e.file, e.field, e.value) == ("plan.json", "stages.1.layers", [10, end])
    assert str(N_LAYERS) in e.allowed


# ---- tensor parallelism -------------------------------------------------------------------------


def test_tp_must_divide_heads(problem):
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, one_stage(rep(tp=3)), "plan.json")
    e = ei.value
    assert (e.file, e.field, e.value) == ("plan.json", "stages.0.replicas.0.tp", 3)
    assert "16" in e.allowed  # OPT-350M has 16 heads


def test_tp_must_fit_in_a_node(scenario_dict):
    scenario_dict["pool"]["gpus_per_node"] = {"A100-40GB": 4}
    problem = build(scenario_dict)
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, one_stage(rep(tp=8)), "plan.json")
    e = ei.value
    assert (e.field, e.value) == ("stages.0.replicas.0.tp", 8)
    assert "4" in e.allowed and "node" in e.reason


# ---- network ------------------------------------------------------------------------------------


def test_zone_pair_missing_from_network(scenario_dict):
    # a datacenter of no cloud the catalog knows: no catalog link stands in for the missing one
    scenario_dict["pool"]["regions"]["onprem"] = {
        "zones": {"onprem-a": {"gpus": {"A100-40GB": 4}}}}
    scenario_dict["pool"]["regions"]["us-central1"]["zones"].pop(ZONE_B)
    scenario_dict["network"] = {"links": [
        {"zones": [ZONE_A, ZONE_A], "bandwidth": "100Gbps"},
        {"zones": ["onprem-a", "onprem-a"], "bandwidth": "100Gbps"},
    ]}
    with pytest.raises(SpecError) as ei:
        build(scenario_dict)
    e = ei.value
    assert e.file == F
    assert e.field.startswith("network")
    assert ZONE_A in str(e) and "onprem-a" in str(e)
    assert "in no cloud of the catalog" in str(e) and "network.cloud" in str(e)
    assert "network.defaults.cross_region" in e.allowed


def test_network_link_naming_unknown_zone(scenario_dict):
    scenario_dict["network"]["links"] = [{"zones": [ZONE_A, "us-central1-z"], "bandwidth": "1GB/s"}]
    with pytest.raises(SpecError) as ei:
        build(scenario_dict)
    e = ei.value
    assert (e.field, e.value) == ("network.links.0.zones", "us-central1-z")
    assert ZONE_A in e.allowed


# ---- files --------------------------------------------------------------------------------------


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text("model: OPT-350M\njob:\n  global_batch: 16\n  seq_len: [2048\npool: {}\n")
    with pytest.raises(SpecError) as ei:
        load_problem(path)
    e = ei.value
    assert e.file == str(path)
    assert "malformed YAML" in e.reason
    assert "line 5" in e.reason  # the unclosed '[' is noticed at the next key


def test_yaml_mistake_on_first_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: [\n")
    with pytest.raises(SpecError, match=r"line \d+") as ei:
        load_problem(path)
    assert ei.value.file == str(path)


def test_missing_scenario_file(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_problem(tmp_path / "nope.yaml")
    assert ei.value.file == str(tmp_path / "nope.yaml")


def test_scenario_not_a_mapping(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(SpecError) as ei:
        load_problem(path)
    assert ei.value.file == str(path) and ei.value.value == "a list"


def test_field_error_from_file_names_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: OPT-350M\njob: {global_batch: -2}\n"
                    "pool: {regions: {r: {zones: {z: {gpus: {A100-40GB: 1}}}}}}\n")
    with pytest.raises(SpecError) as ei:
        load_problem(path)
    e = ei.value
    assert (e.file, e.field, e.value) == (str(path), "job.global_batch", -2)


# ---- plan against pool and job ------------------------------------------------------------------


def test_plan_uses_more_gpus_than_pool(problem):
    p = one_stage(rep(tp=8, m=8), rep(tp=8, m=8))  # 16 A100 in zone a, pool has 8
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, p, "plan.json")
    e = ei.value
    assert e.file == "plan.json"
    assert e.field == "stages"
    assert e.value == 16
    assert e.allowed == "<= 8"
    assert "A100-40GB" in e.reason and ZONE_A in e.reason


def test_plan_uses_gpu_type_absent_from_zone(problem):
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, one_stage(rep(gpu="V100-16GB", zone=ZONE_B)), "plan.json")
    e = ei.value
    assert (e.field, e.value) == ("stages.0.replicas.0.gpu", "V100-16GB")
    assert e.allowed == "A100-40GB"


def test_plan_exceeds_quota(scenario_dict):
    scenario_dict["pool"]["quotas"] = {"A100-40GB": 6}
    problem = build(scenario_dict)
    p = one_stage(rep(tp=4, m=8), rep(tp=4, zone=ZONE_B, m=8))  # 8 A100 in all, quota 6
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, p, "plan.json")
    assert (ei.value.field, ei.value.value, ei.value.allowed) == ("stages", 8, "<= 6")


def test_microbatches_must_sum_to_batch_over_mbs(problem):
    p = one_stage(rep(m=6), rep(zone=ZONE_B, m=6), mbs=2)  # 12 != 16 / 2
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, p, "plan.json")
    e = ei.value
    assert (e.field, e.value, e.allowed) == ("stages.0.replicas", 12, "8")


def test_microbatch_size_must_divide_global_batch(problem):
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, one_stage(rep(m=5), mbs=3), "plan.json")
    e = ei.value
    assert (e.file, e.field, e.value) == ("plan.json", "microbatch_size", 3)
    assert "16" in e.allowed


def test_stages_may_differ_in_replica_count(problem):
    """Asymmetric stages are plans too (the estimator simulates them); what must match is the
    microbatches every stage processes."""
    p = plan([{"layers": [0, 13], "replicas": [rep(m=8), rep(m=8)]},
              {"layers": [13, N_LAYERS], "replicas": [rep(m=16)]}])
    validate_plan(problem, p, "plan.json")
    short = plan([{"layers": [0, 13], "replicas": [rep(m=8), rep(m=8)]},
                  {"layers": [13, N_LAYERS], "replicas": [rep(m=12)]}])
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, short, "plan.json")
    assert (ei.value.field, ei.value.value, ei.value.allowed) == ("stages.1.replicas", 12, "16")


def test_recompute_not_allowed_by_job(problem):
    p = plan([{"layers": [0, N_LAYERS], "replicas": [rep()]}], recompute=True)
    with pytest.raises(SpecError) as ei:
        validate_plan(problem, p, "plan.json")
    assert (ei.value.field, ei.value.value) == ("recompute", True)


@pytest.mark.parametrize(("where", "key"), [
    ((), "modle"),
    (("job",), "globl_batch"),
    (("pool", "regions", "us-central1"), "zone"),
    (("network", "defaults", "same_zone"), "bandwith"),
])
def test_unknown_field_rejected(scenario_dict, where, key):
    node = scenario_dict
    for k in where:
        node = node[k]
    node[key] = 1
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    e = ei.value
    assert e.file == F
    assert e.field == ".".join([*where, key])
    assert "Extra inputs are not permitted" in e.reason


def test_unknown_field_in_plan():
    data = {"microbatch_size": 1, "stages": [{"layers": [0, N_LAYERS], "replicas": [rep()]}],
            "pipeline_parallel": 2}
    with pytest.raises(ValidationError) as ei:
        TrainingPlan.model_validate(data)
    assert spec_error_from_validation(ei.value, "p.json").field == "pipeline_parallel"


def test_a_misspelt_key_is_named_with_the_name_it_stands_for(scenario_dict):
    """`globl_batch` leaves job.global_batch missing too: the error names the key that is
    there, with a close match, not the one that is missing; likewise at the top level."""
    scenario_dict["job"]["globl_batch"] = scenario_dict["job"].pop("global_batch")
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert ei.value.field == "job.globl_batch" and "did you mean 'global_batch'" in str(ei.value)
    scenario_dict["job"]["global_batch"] = scenario_dict["job"].pop("globl_batch")
    scenario_dict["netwrok"] = scenario_dict.pop("network", {})
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert ei.value.field == "netwrok" and "did you mean 'network'" in str(ei.value)


@pytest.mark.parametrize("table, key, meant", [
    (("job",), "optimiser", "optimizer"),  # no field missing: matched against the table's own
    (("job",), "seq_length", "seq_len"),
    (("network",), "egress_usd_per_gib", "egress_usd_per_gb"),
    (("pool", "regions", "us-central1", "zones", ZONE_A), "gpu", "gpus"),  # through mappings
])
def test_a_misspelt_optional_key_deep_in_the_file_gets_its_close_match(scenario_dict, table, key,
                                                                       meant):
    node = scenario_dict
    for k in table:
        node = node.setdefault(k, {})
    node[key] = node.pop(meant, 1)
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert ei.value.field == ".".join((*table, key))
    assert ei.value.suggestion == meant


@pytest.mark.parametrize("schema, words", [
    ("shoal/scenario@2", "a shoal/scenario@2 document, where a 'shoal/scenario@1' one goes"),
    ("shoal/training-plan@1", "a shoal/training-plan@1 document"),
])
def test_a_document_of_another_kind_or_version_is_named(scenario_dict, schema, words):
    scenario_dict["schema"] = schema
    with pytest.raises(SpecError) as ei:
        parse_scenario(scenario_dict, file=F)
    assert ei.value.field == "schema" and words in str(ei.value)


def _csv_readers():
    from conftest import BASE_SCENARIO
    from shoal.io.helix import _ini
    from shoal.io.sailor import read_trace_row
    from shoal.io.traces import load_trace as availability
    from shoal.serving.capacity import read_profile
    from shoal.serving.workload import load_arrivals, load_lengths, load_trace
    from shoal.training.bubbles import load_requests

    problem = build(copy.deepcopy(BASE_SCENARIO))
    return {"bubbles --requests": load_requests, "serve --lengths": load_lengths,
            "serve --arrivals": load_arrivals, "serve --trace": load_trace,
            "serve profile": read_profile, "helix INI": _ini,
            "import sailor --trace": lambda p: read_trace_row(p, 0),
            "replay --trace": lambda p: availability(p, problem)}


@pytest.mark.parametrize("reader", list(_csv_readers()))
def test_every_text_input_refuses_a_folder_and_bytes_not_utf8_by_name(tmp_path, reader):
    """A CSV or INI input that is a folder, or not UTF-8 (a UTF-16 export from a spreadsheet,
    say), is a SpecError naming the file, as the scenario reader gives: no traceback."""
    read = _csv_readers()[reader]
    wide = tmp_path / "wide.csv"
    wide.write_text("arrival_s,prompt_tokens\n0.1,512\n", encoding="utf-16")
    with pytest.raises(SpecError, match="not a text file") as e:
        read(wide)
    assert e.value.file == str(wide)
    with pytest.raises(SpecError, match="a folder, not a") as e:
        read(tmp_path)
    assert e.value.file == str(tmp_path)
    with pytest.raises(SpecError, match="not found"):  # a file on the way to it
        read(wide / "x.csv")


@pytest.mark.parametrize("name, text, words", [
    ("s.yaml", "", "empty file"), ("s.yaml", "# only a comment\n", "empty file"),
    ("s.json", "  \n", "empty file"), ("s.yaml", "null\n", "(got 'null')"),
    ("s.yaml", "- a\n- b\n", "(got 'a list')"), ("s.yaml", "just words\n", "(got 'a string')")])
def test_a_scenario_that_is_no_mapping_says_what_it_is(tmp_path, name, text, words):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_problem(f)
    assert words in str(e.value) and "NoneType" not in str(e.value)


def test_settings_the_job_rules_out_are_spelt_as_in_the_files(scenario_dict):
    """A plan's recompute against a job that allows only recompute: true and false as YAML
    and JSON spell them, not Python's True and [True]."""
    scenario_dict["job"]["recompute"] = [True]
    pb = build(scenario_dict)
    plan = TrainingPlan.model_validate({"microbatch_size": 1, "recompute": False, "stages": [
        {"layers": [0, N_LAYERS], "replicas": [rep()]}]})
    with pytest.raises(SpecError) as e:
        validate_plan(pb, plan)
    assert "(got false); allowed: true" in str(e.value)


# ---- documents a reader must not be made to blow up on (issue 61) --------------------------------


def test_reading_bounds_nesting_and_alias_expansion_but_not_ordinary_documents(tmp_path):
    """A few anchors and aliases and nesting up to the limit read as before; past the limit,
    a value that expands beyond MAX_ALIAS_NODES, an alias inside its own anchor, and a JSON
    number past the largest float are SpecErrors naming the file."""
    from shoal.files import MAX_ALIAS_NODES, MAX_DEPTH, read_document

    ok = tmp_path / "ok.yaml"
    ok.write_text("link: &l {bandwidth: 10Gbps}\na: *l\nb: *l\n"
                  f"deep: {'[' * (MAX_DEPTH - 1)}{']' * (MAX_DEPTH - 1)}\n")
    doc = read_document(ok)
    assert doc["a"] == doc["b"] == {"bandwidth": "10Gbps"}
    wide = tmp_path / "wide.yaml"  # one alias of a list of 1,000 values, used 200 times
    wide.write_text("a: &a [" + ", ".join(["1"] * 1000) + "]\nb: [" + ", ".join(["*a"] * 200)
                    + "]\n")
    cases = {
        "deep.yaml": (f"a: {'[' * (MAX_DEPTH + 1)}{']' * (MAX_DEPTH + 1)}\n", "nested more than"),
        "deep.json": ('{"a": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}",
                      "nested more than"),
        "self.yaml": ("a: &a [1, *a]\n", "its own anchor"),
        "big.json": ('{"a": 1e400}', "1e400 is not a JSON number"),
        "wide.yaml": (wide.read_text(), f"at most {MAX_ALIAS_NODES:,}"),
    }
    for name, (text, words) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SpecError, match=words) as ei:
            read_document(tmp_path / name)
        assert ei.value.file == str(tmp_path / name)


def test_a_string_deep_in_brackets_is_not_nesting():
    from shoal.files import json_depth

    assert json_depth('{"a": "[[[[[[[[", "b": [1, {"c": "]]]\\"[["}]}', 10) == 3
    assert json_depth("[" * 500, 10) == 11  # counted only to the limit and one past it
