"""The training runtime on torch.distributed (gloo, CPU, float64): every plan shape trains exactly
as one process on the same data, and checkpoints move between plans."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shoal.catalog import TINY  # noqa: E402
from shoal.errors import SpecError  # noqa: E402
from shoal.runtime.model import Stage, shard, unshard  # noqa: E402
from shoal.runtime.pipeline import layout  # noqa: E402
from shoal.runtime.train import reference, spawn  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402

SEQ, STEPS, TOL = 16, 4, 1e-9


def plan(stages, mbs=1, schedule="1f1b", zero=0, recompute=False):
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "schedule": schedule, "zero_stage": zero, "recompute": recompute,
        "stages": [{"layers": list(lay), "replicas": [
            {"gpu": "cpu", "tp": tp, "zone": "local", "microbatches": m} for tp, m in reps]}
            for lay, reps in stages]})


PLANS = {
    "dp2": plan([((0, 6), [(1, 2), (1, 2)])]),
    "pp2-1f1b": plan([((0, 3), [(1, 4)]), ((3, 6), [(1, 4)])]),
    "asymmetric-3-1": plan([((0, 3), [(1, 4)]), ((3, 6), [(1, 3), (1, 1)])]),
    "tp2-then-tp1": plan([((0, 3), [(2, 4)]), ((3, 6), [(1, 4)])]),
    "zero2": plan([((0, 6), [(1, 2), (1, 2)])], zero=2),
    "gpipe-recompute": plan([((0, 2), [(1, 4)]), ((2, 6), [(1, 4)])], schedule="gpipe",
                            recompute=True),
}


def full_params(p: TrainingPlan, res: list[dict], replica: int = 0) -> dict:
    """Every parameter of the model, reassembled from the TP shards of one replica per stage."""
    out = {}
    for st_i in range(len(p.stages)):
        ranks = sorted((r for r in res if r["role"][0] == st_i and r["role"][1] == replica),
                       key=lambda r: r["role"][2])
        for key in ranks[0]["state"]:
            out[key] = unshard(key[1], [r["state"][key] for r in ranks])
    return out


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", list(PLANS))
def test_plan_trains_exactly_as_one_process(name, tmp_path):
    p = PLANS[name]
    res = spawn(p, TINY, STEPS, SEQ, out_dir=str(tmp_path))
    ref_losses, ref = reference(TINY, p, STEPS, SEQ)
    init = {(i, n): q.detach() for i in range(6)
            for n, q in Stage(TINY, i, i + 1).layers[0].named_parameters()}
    got = full_params(p, res)
    assert got.keys() == ref.keys()
    moved = max(rel(ref[k], init[k]) for k in ref)
    assert moved > 1e-3  # training changed the weights, far beyond the tolerance
    for k in ref:
        assert rel(got[k], ref[k]) <= TOL, k
    for r in res:  # every rank reports the iteration's loss
        for a, b in zip(r["losses"], ref_losses, strict=True):
            assert abs(a - b) <= TOL * abs(b)
    # every replica of a stage holds the same weights as its first replica
    first = {(r["role"][0], r["role"][2]): r["state"] for r in res if r["role"][1] == 0}
    for r in res:
        mine = first[(r["role"][0], r["role"][2])]
        for k, v in r["state"].items():
            assert rel(v, mine[k]) <= TOL


@pytest.mark.parametrize("before,after", [("tp2-then-tp1", "asymmetric-3-1"),
                                          ("zero2", "pp2-1f1b")])
def test_checkpoint_continues_exactly_under_another_plan(before, after, tmp_path):
    ck = tmp_path / "ck"
    spawn(PLANS[before], TINY, 2, SEQ, checkpoint_dir=str(ck))
    assert (ck / "step-2" / "meta.json").is_file() and not list(ck.glob("*.tmp"))
    res = spawn(PLANS[after], TINY, 2, SEQ, checkpoint_dir=str(ck), resume=True,
                out_dir=str(tmp_path))
    ref_losses, ref = reference(TINY, PLANS[after], 4, SEQ)
    assert res[0]["first_step"] == 2
    got = full_params(PLANS[after], res)
    assert max(rel(got[k], ref[k]) for k in ref) <= TOL
    assert res[0]["losses"] == pytest.approx(ref_losses[2:], rel=TOL)
    assert (ck / "step-4").is_dir()


def test_shards_round_trip():
    st = Stage(TINY, 1, 2)
    for name, p in st.named_parameters():
        parts = [shard(name, p.detach(), 2, r) for r in range(2)]
        assert torch.equal(unshard(name, parts), p.detach())


def test_schedules_cover_each_microbatch_once():
    from shoal.specs.plan import orders

    for kind in ("1f1b", "gpipe"):
        for shares in ([[5], [5], [5]], [[2, 3], [5], [1, 1, 3]]):
            for s, stage in enumerate(orders(kind, shares)):
                ops = [op for rep in stage for op in rep]
                assert sorted(m for k, m in ops if k == 0) == [0, 1, 2, 3, 4]
                assert sorted(m for k, m in ops if k == 1) == [0, 1, 2, 3, 4]
                for j, rep in enumerate(stage):  # each replica runs what it owns
                    assert len(rep) == 2 * shares[s][j]
                    # a microbatch's backward comes after its forward
                    assert all(rep.index((0, m)) < rep.index((1, m)) for _, m in rep)


def test_plans_the_runtime_cannot_run_say_why():
    bad_tp = plan([((0, 6), [(1, 2), (2, 2)])])
    with pytest.raises(SpecError, match="different TP degrees"):
        layout(bad_tp, TINY)
    gap = plan([((0, 3), [(1, 2)]), ((4, 6), [(1, 2)])])
    with pytest.raises(SpecError, match="tile the model"):
        layout(gap, TINY)
    uneven = plan([((0, 3), [(1, 2)]), ((3, 6), [(1, 3)])])
    with pytest.raises(SpecError, match="same number of microbatches"):
        layout(uneven, TINY)
    with pytest.raises(SpecError, match="does not divide"):
        layout(plan([((0, 6), [(3, 2)])]), TINY)
    with pytest.raises(SpecError, match="at least one layer") as e:
        layout(plan([((0, 3), [(1, 2)]), ((3, 3), [(1, 2)]), ((3, 6), [(1, 2)])]), TINY)
    assert e.value.field == "stages.1.layers"
    with pytest.raises(SpecError, match="no microbatch"):
        layout(plan([((0, 6), [(1, 0)])]), TINY)


def test_a_checkpoint_resumes_in_another_dtype_exactly(tmp_path):
    """Parameters and Adam's moments are cast to the run's dtype: float64 to float32 and back
    gives the float64 run's losses to float32 precision."""
    ck = tmp_path / "ck"
    spawn(PLANS["zero2"], TINY, 2, SEQ, checkpoint_dir=str(ck))  # float64
    res = spawn(PLANS["dp2"], TINY, 2, SEQ, checkpoint_dir=str(ck), resume=True,
                dtype=torch.float32)
    ref_losses, _ = reference(TINY, PLANS["dp2"], 4, SEQ)
    assert res[0]["losses"] == pytest.approx(ref_losses[2:], rel=1e-5)
    meta = __import__("json").loads((ck / "step-4" / "meta.json").read_text())
    assert meta["dtype"] == "float32" and meta["model"] == TINY.name


def test_checkpoint_folders_of_other_names_are_left_out(tmp_path):
    from shoal.runtime.train import checkpoint_dirs, latest_checkpoint

    for name in ("step-2", "step-10", "step-10.bak", "step-3.tmp", "step-x"):
        (tmp_path / name).mkdir()
    for name in ("step-2", "step-10.bak"):
        (tmp_path / name / "meta.json").write_text("{}")
    assert [n for n, _ in checkpoint_dirs(tmp_path)] == [2, 10]
    assert latest_checkpoint(tmp_path)[0] == 2  # step-10 has no meta.json: not complete


def test_cli_train_refuses_what_would_fail_later(tmp_path):
    """Refused before any worker starts: a folder with another run's checkpoint (the save at
    the end would fail), a checkpoint of another model, several machines with no rendezvous,
    elastic-only options without --elastic, a folder under a file."""
    import json

    from typer.testing import CliRunner

    from shoal.cli import _check_resumable, app

    f = tmp_path / "plan.json"
    f.write_text(PLANS["dp2"].model_dump_json(by_alias=True))
    ck = tmp_path / "ck"
    (ck / "step-3").mkdir(parents=True)
    (ck / "step-3" / "meta.json").write_text(json.dumps(
        {"step": 3, "model": "other", "model_spec": {"name": "other"}}))

    def run(*args):
        return CliRunner().invoke(app, ["train", str(f), "--model", "tiny", "--steps", "1",
                                        *map(str, args)])

    for args, words in (((("--checkpoint-dir", ck)), "holds a checkpoint of an earlier run"),
                        (("--checkpoint-dir", ck, "--resume"), "checkpoint is of model 'other'"),
                        (("--nnodes", 2), "rendezvous"),
                        (("--nnodes", 2, "--node-rank", 2, "--rdzv-endpoint", "h:1"), "below"),
                        (("--keep", 3), "goes with --elastic"),
                        (("--profile", tmp_path / "p.json"), "goes with --elastic"),
                        (("--checkpoint-dir", f / "sub"), "is a file"),
                        (("--seq", 64), "longer than the model's 32 positions")):
        r = run(*args)
        assert r.exit_code == 2 and words in r.output, (args, r.output)
    with pytest.raises(SpecError):
        _check_resumable(ck / "step-3", TINY)
    r = CliRunner().invoke(app, ["profile", "--model", "tiny", "--seq", "64", "-o",
                                 str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "longer than the model's 32 positions" in r.output


def test_worker_errors_are_each_ranks_last_exception():
    from shoal.cli import worker_errors

    log = ["[rank1]: Traceback (most recent call last):\n", "[rank1]:   File \"x\", line 1\n",
           "[rank1]: ValueError: layers outside the model\n", "E1126 ChildFailedError:\n",
           "[rank0]: torch.distributed.DistBackendError: connection closed\n"]
    assert worker_errors(log) == ("rank0: torch.distributed.DistBackendError: connection closed; "
                                  "rank1: ValueError: layers outside the model")
    assert "no rank line" in worker_errors(["no rank line\n"])


def test_cli_train_through_torchrun_and_resume(tmp_path):
    import json

    from typer.testing import CliRunner

    from shoal.cli import app

    f = tmp_path / "plan.json"
    f.write_text(PLANS["asymmetric-3-1"].model_dump_json(by_alias=True))
    ck = tmp_path / "ck"
    r = CliRunner().invoke(app, ["train", str(f), "--model", "tiny", "--steps", "2", "--dtype",
                                 "float64", "--seq", "16", "--checkpoint-dir", str(ck), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["steps"] == 2 and doc["world_size"] == 3 and doc["reconfigurations"] == []
    assert doc["step_time_s"] > 0 and len(doc["losses"]) == 2
    r = CliRunner().invoke(app, ["train", str(f), "--model", "tiny", "--steps", "1", "--dtype",
                                 "float64", "--seq", "16", "--checkpoint-dir", str(ck), "--resume",
                                 "--json"])
    assert r.exit_code == 0, r.output
    doc2 = json.loads(r.output)
    ref_losses, _ = reference(TINY, PLANS["asymmetric-3-1"], 3, 16)
    assert doc["losses"] + doc2["losses"] == pytest.approx(ref_losses, rel=TOL)
    bad = tmp_path / "bad.json"
    bad.write_text(plan([((0, 6), [(1, 2), (2, 2)])]).model_dump_json(by_alias=True))
    r = CliRunner().invoke(app, ["train", str(bad), "--model", "tiny", "--steps", "1"])
    assert r.exit_code == 2 and "different TP degrees" in r.output


def test_profile_command_writes_a_profile_the_estimator_reads(tmp_path):
    import json

    from typer.testing import CliRunner

    from shoal.cli import app
    from shoal.profiles.compute import load_profile

    out = tmp_path / "tiny.json"
    r = CliRunner().invoke(app, ["profile", "--model", "tiny", "-o", str(out), "--tp", "1,2",
                                 "--mbs", "1,2", "--seq", "8", "--procs", "2", "--reps", "2",
                                 "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["layers"] == 6 and doc["link"]["bandwidth_Bps"] > 0
    prof = load_profile(out, 6)
    for tp in (1, 2):
        t = prof.layer_times("cpu", tp, 2)
        assert t.shape == (6, 3) and (t[:, 0] > 0).all() and (t[:, 1] > 0).all()
    r = CliRunner().invoke(app, ["profile", "--model", "tiny", "-o", str(out), "--tp", "3"])
    assert r.exit_code == 2 and "TP 3" in r.output


def test_profiler_means_count_the_rare_long_waits_of_shared_cores():
    """Processes sharing cores wait in whole time slices: most calls run uninterrupted and a
    few wait long. The profiler's mean counts the waits (a median would report 1 ms here),
    over calls enough to fill its window."""
    from shoal.runtime import profiler

    calls = []

    def timed():
        calls.append(None)
        return 0.011 if len(calls) % 10 == 0 else 0.001  # a 10 ms wait every tenth call

    mean = profiler._mean_time(timed, reps=3)
    n = len(calls) - 1  # after the warm-up
    assert n * 0.001 >= profiler.WINDOW_S * 0.8
    assert mean == pytest.approx((n + 10 * (len(calls) // 10)) * 0.001 / n)
    assert mean > 0.0015


def test_link_fit_is_not_thrown_by_a_slow_small_message():
    """A 1 KB ping that waited for a core took longer than the 16 KB one: the fit lowers it to
    the larger message's time instead of taking it as every transfer's latency."""
    from shoal.runtime import profiler

    lat, bw = 50e-6, 4e9
    times = {s: lat + s / bw for s in (2**10, 2**14, 2**17, 2**20, 2**22)}
    assert profiler.fit_link(times) == pytest.approx((bw, lat + 2**10 / bw), rel=1e-3)
    slow = {**times, 2**10: 1.9e-3}
    fit_bw, fit_lat = profiler.fit_link(slow)
    assert fit_lat == pytest.approx(times[2**14])
    assert 0.9 * bw < fit_bw < 1.1 * bw


def test_time_constants_scale_the_all_reduce_to_the_measured_one():
    from shoal.runtime import profiler

    bw, lat, d = 4e9, 1e-4, 2
    sizes = (2**10, 2**17, 2**20, 2**22, 2**24)
    ring = {s: 2 * (d - 1) / d * s / bw + 2 * (d - 1) * lat for s in sizes}
    doc = {"processes": d, "network": {
        "link": {"bandwidth_Bps": bw, "latency_s": lat},
        # messages under 1 MB left out; of the rest, the median ratio
        "all_reduce_s": {str(s): t * r for (s, t), r in zip(ring.items(), (50, 9, 3, 4, 6))}}}
    tc = profiler.time_constants(doc)
    assert tc.sync_scale == pytest.approx(4.0)
    assert (tc.p2p_scale, tc.p2p_overhead_s) == (1.0, 0.0)
    assert tc.sharded_sync_ratio == 1.0  # not measured: as an all-reduce
    assert profiler.time_constants({"processes": 1, "network": {}}).sync_scale == \
        profiler.TimeConstants().sync_scale
    # ZeRO's reduce-scatter and all-gather against the measured all-reduce, from 1 MB
    ar = doc["network"]["all_reduce_s"]
    doc["network"]["sharded_sync_s"] = {s: t * r for (s, t), r in zip(ar.items(),
                                                                     (9.0, 0.5, 1.5, 2.5, 3.0))}
    assert profiler.time_constants(doc).sharded_sync_ratio == pytest.approx(2.5)
    doc["network"]["sharded_sync_s"] = {s: 0.5 * t for s, t in ar.items()}
    assert profiler.time_constants(doc).sharded_sync_ratio == 1.0  # never below the all-reduce
