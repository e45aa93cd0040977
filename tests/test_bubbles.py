"""BubbleTea: prefill requests placed in the bubbles of a training pipeline across datacenters;
the Atlas strategy and `shoal bubbles`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.errors import SpecError
from shoal.problem import load_problem
from shoal.specs.model import ModelSpec
from shoal.specs.network import WanSpec
from shoal.training import bubbles
from shoal.training.geo import GeoJob, JobShape, job_from_profile, simulate
from shoal.training.planners import search

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "atlas-gpt-3dc.yaml"
EXAMPLE_PLAN = ROOT / "examples" / "atlas-gpt-3dc.plan.json"


@settings(max_examples=60, deadline=None)
@given(busy=st.lists(st.tuples(st.floats(0, 9.5), st.floats(0.01, 2.0)), max_size=6),
       guard=st.floats(0, 0.2), t=st.floats(0, 40), dur=st.floats(0.001, 3.0))
def test_bubble_fit_is_the_earliest_free_window(busy, guard, t, dur):
    T = 10.0
    iv = [(a, min(a + w, T)) for a, w in busy]
    b = bubbles.Bubbles(iv, T, guard)
    got = b.fit(t, dur)
    # brute force over a fine grid of candidate starts: the window must avoid training (periodic)
    # and the guard before the next training interval
    def free(x):
        for k in range(int(x // T) - 1, int((x + dur) // T) + 2):
            for a, e in iv:
                if max(x, a + k * T - guard) < min(x + dur, e + k * T) - 1e-9 and e > a:
                    return False
        return True

    if got == math.inf:
        assert not any(free(t + i * 0.01) for i in range(int(2 * T / 0.01)))
        return
    assert got >= t - 1e-12 and free(got)
    step = 0.01
    x = t
    while x < got - step:
        assert not free(x) or got - x < 2 * step, (x, got)
        x += step


def _testbed(M=4, pipelines=3):
    model = ModelSpec(name="GPT-A", num_layers=24, hidden_size=4096, num_heads=32,
                      vocab_size=50257, max_seq_len=4096)
    from shoal import catalog
    from shoal.profiles.analytic import AnalyticProfile

    prof = AnalyticProfile(model, 4096, {"A100-80GB": catalog.gpus().get("A100-80GB")})
    w = WanSpec(latency="40ms")
    stages = [(1 + 6 * i, 7 + 6 * i) for i in range(4)]
    return job_from_profile(prof, "A100-80GB", stages, ["dc1", "dc2", "dc3", "dc3"],
                            lambda a, b: (w.bandwidth(), w.latency),
                            JobShape(mbs=1, microbatches=M, pipelines=pipelines))


@pytest.fixture(scope="module")
def testbed_run():
    tl = simulate(_testbed(), "atlas", cell=3)
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    reqs = bubbles.synthetic_requests(100, 60.0, seed=1)
    return tl, bubbles.place(tl, reqs, model, depth=8, guard_s=0.005, max_wait_s=0.05)


def test_bubbletea_fills_the_12_gpu_testbed_without_slowing_training(testbed_run):
    """Atlas §6.5: utilisation from ~45% to ~94% with no effect on training. Here (GPT-A, 4
    microbatches, 40 ms, prompts like the Azure trace at 100 requests/s) the prefills fill a
    good part of the bubbles (how much depends on how long each prefill takes on the GPU)."""
    tl, res = testbed_run
    s = res.summary()
    assert s["utilization_after"] >= s["utilization_before"] + 0.25
    assert s["utilization_before"] < 0.7
    assert abs(s["iteration_time_after_s"] / s["iteration_time_before_s"] - 1) < 0.01
    assert 0 < s["rejected_fraction"] < 1 and s["ttft_s"]["p50"] > 0


def test_no_prefill_overlaps_training(testbed_run):
    tl, res = testbed_run
    T = tl.iteration_s
    busy = bubbles.training_busy(tl)
    for g, iv in res.reserved.items():
        for a, b in iv:
            for k in range(int(a // T) - 1, int(b // T) + 2):
                for x, y in busy[g]:
                    assert not (max(a, x + k * T) < min(b, y + k * T) - 1e-9), (g, a, b)
        for (_, b), (c, _) in zip(iv, iv[1:]):
            assert c >= b - 1e-12  # one prefill at a time on a GPU


def test_a_prefill_on_training_time_delays_the_iteration(testbed_run):
    tl, _ = testbed_run
    f0 = tl.busy[(0, 1)][0]  # a training forward: block half of it
    bad = {g: [] for g in bubbles.training_busy(tl)}
    bad[(0, 0, 1)] = [(f0.start, f0.start + 0.5 * (f0.end - f0.start))]
    again = bubbles._iteration_with_prefill(tl, bad, 1, 8)
    assert again > tl.iteration_s * 1.01


def test_rejects_at_once_when_there_are_no_bubbles():
    job = GeoJob(stage_dc=("a",), fwd_s=(1.0,), bwd_s=(2.0,), recompute_s=(0.0,), act_bytes=0.0,
                 grad_bytes=(0.0,), hop_bw=(), hop_latency_s=(), pipelines=1, microbatches=3)
    tl = simulate(job, "1f1b")
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    res = bubbles.place(tl, [(0.5, 512), (4.0, 512)], model)
    assert res.summary()["rejected_fraction"] == 1.0
    assert res.summary()["utilization_after"] == pytest.approx(res.summary()["utilization_before"])
    with pytest.raises(ValueError, match="sorted"):
        bubbles.place(tl, [(1.0, 5), (0.5, 5)], model)


def test_prefill_model_anchor_and_shape():
    from shoal import catalog

    # calibrated on Atlas §6.6 (a DGX A100: stages hand off over NVLink): 8 stages add 16 ms
    nvlink = catalog.gpus().get("A100-80GB").intra_node_bw_Bps
    dgx = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB", link_bw=nvlink)
    assert dgx.latency(512, 8) - dgx.latency(512, 1) == pytest.approx(0.016, abs=0.0005)
    m = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")  # between nodes: slower hand-offs
    assert m.latency(512, 8) - m.latency(512, 1) > 0.016
    assert m.latency(128, 1) < m.latency(512, 1) < m.latency(2048, 1) < m.latency(8192, 1)
    stages, hop = m.stage_times(1000, 4)
    assert len(stages) == 4 and sum(stages) == pytest.approx(m.latency(1000, 1))


def test_inference_pipelines_are_same_rank_across_cells_in_one_datacenter():
    tl = simulate(_testbed(pipelines=2), "atlas", cell=2)
    busy = bubbles.training_busy(tl, cells=10)
    pipes = bubbles.inference_pipelines(list(busy), lambda g: tl.job.stage_dc[g[2]], 4)
    assert len(pipes) == 8 * 3  # 8 ranks (2 pipelines x 4 stages), 10 cells in groups of 4
    for pipe in pipes:
        assert len({(p, s) for _, p, s in pipe}) == 1 and len(pipe) <= 4


def test_load_requests_errors(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("arrival_s,prompt_tokens\n0.1,100\n0.05,20\n")
    with pytest.raises(SpecError, match="line 3: arrivals must be sorted"):
        bubbles.load_requests(f)
    f.write_text("time,tokens\n0,1\n")
    with pytest.raises(SpecError, match="header arrival_s,prompt_tokens"):
        bubbles.load_requests(f)
    f.write_text("arrival_s,prompt_tokens\n0.1,0\n")
    with pytest.raises(SpecError, match="line 2"):
        bubbles.load_requests(f)
    f.write_text("arrival_s,prompt_tokens\n0.1,12\n0.2,30\n")
    assert bubbles.load_requests(f) == [(0.1, 12), (0.2, 30)]


def test_atlas_strategy_keeps_each_stage_in_one_datacenter():
    problem = load_problem(EXAMPLE)
    res = search(problem, strategy="atlas", objective="max-throughput")
    assert res.ranked
    for c in res.ranked + res.pareto:
        plan = c.plan
        for st_ in plan.stages:
            assert len({problem.zone_region[r.zone] for r in st_.replicas}) == 1
        assert sum(r.microbatches for r in plan.stages[0].replicas) == problem.job.global_batch
    # auto considers the same layouts on a pool that spans regions
    auto = search(problem, objective="max-throughput")
    assert auto.ranked[0].iteration_time_s <= res.ranked[0].iteration_time_s * (1 + 1e-9)


def test_plan_with_a_stage_across_regions_is_refused():
    from shoal.specs.plan import TrainingPlan
    from shoal.training.geo import job_from_plan

    problem = load_problem(EXAMPLE)
    plan = TrainingPlan.model_validate({"microbatch_size": 1, "recompute": True, "stages": [
        {"layers": [0, 26], "replicas": [{"gpu": "A100-80GB", "tp": 2, "zone": "dc1-a",
                                          "microbatches": 6},
                                         {"gpu": "A100-80GB", "tp": 2, "zone": "dc2-a",
                                          "microbatches": 6}]}]})
    with pytest.raises(SpecError, match="span regions"):
        job_from_plan(problem, plan)


def test_cli_bubbles_json_contract(tmp_path, capsys):
    from typer.testing import CliRunner

    from shoal.cli import app

    reqs = tmp_path / "req.csv"
    reqs.write_text("arrival_s,prompt_tokens\n" + "".join(
        f"{0.05 * i:.2f},{200 + 37 * i % 900}\n" for i in range(200)))
    fig = tmp_path / "fill.png"
    r = CliRunner().invoke(app, ["bubbles", str(EXAMPLE), "--plan", str(EXAMPLE_PLAN),
                                 "--requests", str(reqs), "--figure", str(fig), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for k in ("utilization_before", "utilization_after", "iteration_time_before_s",
              "iteration_time_after_s", "rejected_fraction"):
        assert isinstance(doc[k], float)
    assert set(doc["ttft_s"]) >= {"p50", "p95"}
    assert doc["utilization_after"] > doc["utilization_before"]
    assert doc["iteration_time_after_s"] == pytest.approx(doc["iteration_time_before_s"])
    assert fig.stat().st_size > 10_000


@pytest.mark.parametrize("args,msg", [
    (["--rate", "0"], "--rate"),
    (["--rate", "nan"], "--rate"),
    (["--rate", "inf"], "--rate"),
    ([], "no requests"),
    (["--rate", "5", "--guard", "5 parsecs"], "--guard"),
    (["--rate", "5", "--inference-model", "GPT-17"], "GPT-17"),
    (["--rate", "5", "--depth", "0"], "--depth"),
    (["--rate", "1e9", "--duration", "1s"], "up to 200,000 requests"),
    (["--rate", "5", "--cell", "3"], "the plan has 2 pipelines"),
    # options of another way of running are refused, not ignored
    (["--requests", str(EXAMPLE), "--duration", "10s"], "--duration: applies only with --rate"),
    (["--requests", str(EXAMPLE), "--seed", "4"], "--seed: applies only with --rate"),
    (["--rate", "5", "--schedule", "varuna", "--cell", "2"], "applies only with --schedule atlas"),
])
def test_cli_bubbles_bad_input(args, msg):
    from typer.testing import CliRunner

    from shoal.cli import app

    r = CliRunner().invoke(app, ["bubbles", str(EXAMPLE), "--plan", str(EXAMPLE_PLAN), *args])
    assert r.exit_code == 2, r.output
    assert msg in r.output


def test_a_rate_that_brings_no_request_is_refused():
    """No arrival within the duration: an error naming --rate, not a request made up past the
    end of the window."""
    with pytest.raises(SpecError, match="no request arrives"):
        bubbles.synthetic_requests(0.001, 10.0, seed=0)
    assert all(a <= 60.0 for a, _ in bubbles.synthetic_requests(0.1, 60.0, seed=0))


def test_uneven_shares_are_refused_with_the_even_share_allowed(tmp_path):
    from typer.testing import CliRunner

    from shoal.cli import app

    doc = json.loads(EXAMPLE_PLAN.read_text())
    doc["stages"][0]["replicas"][0]["microbatches"] = 8
    doc["stages"][0]["replicas"][1]["microbatches"] = 4
    plan = tmp_path / "uneven.json"
    plan.write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["bubbles", str(EXAMPLE), "--plan", str(plan), "--rate", "5"])
    assert r.exit_code == 2, r.output
    assert "2 replicas of 6 microbatches" in r.output and "[8, 4]" in r.output


def test_the_sustainable_rate_keeps_rejections_under_one_percent(testbed_run):
    """The rate found rejects at most 1% of its requests, a rate a few percent higher was tried
    and rejected more (the search brackets it), and at that rate the bubbles are used and the
    iteration is unchanged."""
    tl, _ = testbed_run
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    s = bubbles.sustainable(tl, model, max_wait_s=1.0, probe=bubbles.Probe(tolerance=0.05))
    assert s.rate_per_s is not None and s.result["rejected_fraction"] <= 0.01
    assert any(s.rate_per_s < r <= 1.06 * s.rate_per_s and f > 0.01 for r, f in s.trials)
    assert s.result["utilization_after"] > s.result["utilization_before"]
    assert s.result["iteration_time_after_s"] == pytest.approx(tl.iteration_s)
    assert s.to_json()["rate_per_s"] == s.rate_per_s


def test_no_sustainable_rate_when_prefills_find_no_bubble_in_time(testbed_run):
    """With a wait too short for the bubbles, some prefills are rejected however few arrive:
    no rate is sustainable, the share rejected at the lowest rate is given, and so is the rate
    each longer wait sustains (here the longest ones some)."""
    tl, _ = testbed_run
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    s = bubbles.sustainable(tl, model, max_wait_s=0.05)
    assert s.rate_per_s is None and s.result is None and s.floor > 0.01
    assert [r["max_wait_s"] for r in s.relaxed] == pytest.approx(
        [k * 0.05 for k in bubbles.WAIT_STEPS])
    longest = s.relaxed[-1]
    assert longest["rate_per_s"] is not None
    again = bubbles.sustainable(tl, model, max_wait_s=longest["max_wait_s"])
    assert again.rate_per_s == pytest.approx(longest["rate_per_s"])
    assert s.relaxed[0]["rate_per_s"] is None and s.relaxed[0]["rejected_at_lowest_rate"] > 0.01


def test_cli_bubbles_says_when_utilisation_comes_from_rejections():
    """At 100 requests/s most prefills of the bundled example are turned away: the output says
    so next to the utilisation, and gives the load served with at most 1% rejected."""
    from typer.testing import CliRunner

    from shoal.cli import app

    args = ["bubbles", str(EXAMPLE), "--plan", str(EXAMPLE_PLAN), "--rate", "100",
            "--duration", "20s", "--max-wait", "500ms"]
    r = CliRunner().invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    sus = doc["sustainable"]
    assert doc["rejected_fraction"] > 0.01
    assert 0 < sus["rate_per_s"] < 100 and sus["at_rate"]["rejected_fraction"] <= 0.01
    text = CliRunner().invoke(app, args).output
    assert "were turned away" in text and "sustainable load" in text
