"""The training runtime on torch.distributed (gloo, CPU, float64): every plan shape trains exactly
as one process on the same data (data and pipeline parallelism, TP, TP degrees that differ
between stages and between a stage's replicas, uneven shares, ZeRO 2 and 3, 1F1B, GPipe and the
zorse schedule's ministages), and checkpoints move between plans."""

from __future__ import annotations

import pytest
from tests._clock import patience

torch = pytest.importorskip("torch")

from tests._meta import check_meta  # noqa: E402

from shoal.catalog import TINY  # noqa: E402
from shoal.errors import SpecError  # noqa: E402
from shoal.runtime.model import Stage, shard, unshard  # noqa: E402
from shoal.runtime.pipeline import layout  # noqa: E402
from shoal.runtime.train import reference, spawn  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402

SEQ, STEPS, TOL = 16, 4, 1e-9


def plan(stages, mbs=1, schedule="1f1b", zero=0, recompute=False, ministages=1):
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "schedule": schedule, "zero_stage": zero, "recompute": recompute,
        "ministages": ministages,
        "stages": [{"layers": list(lay), "replicas": [
            {"gpu": "cpu", "tp": tp, "zone": "local", "microbatches": m} for tp, m in reps]}
            for lay, reps in stages]})


PLANS = {
    "dp2": plan([((0, 6), [(1, 2), (1, 2)])]),
    "pp2-1f1b": plan([((0, 3), [(1, 4)]), ((3, 6), [(1, 4)])]),
    "asymmetric-3-1": plan([((0, 3), [(1, 4)]), ((3, 6), [(1, 3), (1, 1)])]),
    "tp2-then-tp1": plan([((0, 3), [(2, 4)]), ((3, 6), [(1, 4)])]),
    # issue 66's acceptance: TP 2 then TP 1, uneven shares
    "tp2-then-tp1-uneven": plan([((0, 2), [(2, 4)]), ((2, 6), [(1, 3), (1, 1)])]),
    "mixed-tp-in-a-stage": plan([((0, 3), [(2, 3), (1, 1)]), ((3, 6), [(1, 4)])]),
    "zero3-uneven": plan([((0, 3), [(1, 3), (1, 1)]), ((3, 6), [(1, 4)])], zero=3),
    "zero3-mixed-tp": plan([((0, 6), [(2, 3), (1, 1)])], zero=3),
    "zero2-mixed-tp": plan([((0, 6), [(2, 2), (1, 2)])], mbs=2, zero=2),
    "zorse-ministages": plan([((0, 3), [(1, 3), (1, 1)]), ((3, 6), [(1, 2), (1, 2)])],
                             schedule="zorse", zero=2, recompute=True, ministages=2),
    "zorse-one-stage": plan([((0, 6), [(1, 3), (1, 1)])], schedule="zorse", zero=2,
                            ministages=3),
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
    """Relative difference, against a floor for tensors that stay near zero (a key bias has
    no gradient: softmax ignores a shift of every key)."""
    return float((a - b).norm() / max(float(b.norm()), 1e-3))


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
    # every replica of a stage holds the same weights as its first replica (whatever its TP)
    for st_i, st in enumerate(p.stages):
        for j in range(1, len(st.replicas)):
            ranks = sorted((r for r in res if r["role"][:2] == (st_i, j)),
                           key=lambda r: r["role"][2])
            for k in ranks[0]["state"]:
                assert rel(unshard(k[1], [r["state"][k] for r in ranks]), got[k]) <= TOL


@pytest.mark.parametrize("before,after", [("tp2-then-tp1", "asymmetric-3-1"),
                                          ("zero2", "pp2-1f1b"),
                                          ("zorse-ministages", "zero3-mixed-tp")])
def test_checkpoint_continues_exactly_under_another_plan(before, after, tmp_path):
    ck = tmp_path / "ck"
    spawn(PLANS[before], TINY, 2, SEQ, checkpoint_dir=str(ck))
    assert (ck / "step-2" / "meta.json").is_file() and not list(ck.glob("*.tmp*"))
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
    with pytest.raises(SpecError, match="cannot make 3 ministages"):
        layout(plan([((0, 2), [(1, 2)]), ((2, 6), [(1, 2)])], schedule="zorse", ministages=3),
               TINY)
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
    from shoal.runtime.checkpoint import checkpoint_dirs, latest

    for name in ("step-2", "step-10", "step-10.bak", "step-3.tmp", "step-4.tmp-1a2b", "step-x"):
        (tmp_path / name).mkdir()
    for name in ("step-2", "step-10.bak", "step-4.tmp-1a2b"):
        (tmp_path / name / "meta.json").write_text("{}")
    assert [n for n, _ in checkpoint_dirs(tmp_path)] == [2, 10]
    assert latest(tmp_path) == (2, tmp_path / "step-2")  # step-10 has no meta.json: not complete


def test_cli_train_refuses_what_would_fail_later(tmp_path):
    """Refused before any worker starts: a folder with another run's checkpoint (the save at
    the end would fail), a checkpoint of another model, several machines with no rendezvous,
    elastic-only options without --elastic, a folder under a file."""
    import json

    from typer.testing import CliRunner

    from shoal.cli import app
    from shoal.runtime.launch import check_resumable as _check_resumable

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
                        (("--keep", 3), "needs --checkpoint-dir"),
                        (("--checkpoint-every", 2), "needs --checkpoint-dir"),
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
    from shoal.runtime.launch import worker_errors

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
    check_meta(doc, command="shoal train", model=True, job=True)
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
    bad.write_text(plan([((0, 6), [(1, 2), (3, 2)])]).model_dump_json(by_alias=True))
    r = CliRunner().invoke(app, ["train", str(bad), "--model", "tiny", "--steps", "1"])
    assert r.exit_code == 2 and "TP 3 does not divide" in r.output and "bad.json" in r.output


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
    check_meta(doc, command="shoal profile", model=True)
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


# ------------------------------------------------------------ checkpoints a run can trust (issue 61)

def test_a_folder_a_killed_run_left_is_never_merged_into_a_checkpoint(tmp_path):
    """A killed run left ``step-2.tmp/`` with a rank file of other weights in it; the next run
    into that folder writes its own step-2, and a resume from it trains exactly as one
    process: nothing of the leftover is read."""
    import shutil

    ck, other = tmp_path / "ck", tmp_path / "other"
    spawn(PLANS["dp2"], TINY, 2, SEQ, checkpoint_dir=str(other), seed=1)  # other weights
    leftover = ck / "step-2.tmp"
    leftover.mkdir(parents=True)
    shutil.copy(other / "step-2" / "rank0.pt", leftover / "rank5.pt")
    spawn(PLANS["dp2"], TINY, 2, SEQ, checkpoint_dir=str(ck))
    assert sorted(f.name for f in (ck / "step-2").iterdir()) == ["meta.json", "rank0.pt"]
    res = spawn(PLANS["dp2"], TINY, 2, SEQ, checkpoint_dir=str(ck), resume=True)
    ref_losses, _ = reference(TINY, PLANS["dp2"], 4, SEQ)
    assert res[0]["first_step"] == 2
    assert res[0]["losses"] == pytest.approx(ref_losses[2:], rel=TOL)


def _train_cli(tmp_path, *args):
    from typer.testing import CliRunner

    from shoal.cli import app

    f = tmp_path / "plan.json"
    f.write_text(PLANS["dp2"].model_dump_json(by_alias=True))
    return CliRunner().invoke(app, ["train", str(f), "--model", "tiny", "--seq", str(SEQ),
                                    "--dtype", "float64", *map(str, args)])


def test_a_checkpoint_that_is_not_whole_is_refused_naming_the_file(tmp_path):
    ck = tmp_path / "ck"
    r = _train_cli(tmp_path, "--steps", "2", "--checkpoint-dir", ck, "--json")
    assert r.exit_code == 0, r.output
    rank0 = ck / "step-2" / "rank0.pt"
    good = rank0.read_bytes()
    for damage, words in ((lambda: rank0.write_bytes(good[:-10]), "bytes where meta.json says"),
                          (lambda: rank0.write_bytes(good[:-1] + bytes([good[-1] ^ 1])),
                           "SHA-256"),
                          (lambda: rank0.unlink(), "missing"),
                          (lambda: (ck / "step-2" / "rank1.pt").write_bytes(good),
                           "does not list")):
        rank0.write_bytes(good)
        for extra in (ck / "step-2").glob("rank1.pt"):
            extra.unlink()
        damage()
        r = _train_cli(tmp_path, "--steps", "1", "--checkpoint-dir", ck, "--resume")
        assert r.exit_code == 2 and words in r.output and "step-2" in r.output, r.output


def test_a_failed_run_removes_only_what_it_made(tmp_path, monkeypatch):
    """``--checkpoint-dir sweep/run-a`` with ``sweep/`` new: while run A runs, run B finishes
    into ``sweep/run-b``; A's launcher then fails. A removes its own temporary folder and the
    folder it made, and leaves ``sweep/`` and B's checkpoint alone."""
    import subprocess
    import sys

    sweep = tmp_path / "sweep"
    run_a, b5 = sweep / "run-a", sweep / "run-b" / "step-5"
    real = subprocess.Popen

    def popen(cmd, *args, **kwargs):
        b5.mkdir(parents=True)
        (b5 / "meta.json").write_text("{}")
        if "--run-token" in cmd:  # a write of run A's own, cut short
            part = run_a / f"step-1.tmp-{cmd[cmd.index('--run-token') + 1]}"
            part.mkdir()
            (part / "rank0.pt").write_bytes(b"partial")
        return real([sys.executable, "-c", "raise SystemExit(3)"], *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    r = _train_cli(tmp_path, "--steps", "1", "--checkpoint-dir", run_a)
    assert r.exit_code == 1, r.output
    assert (b5 / "meta.json").is_file()
    assert not run_a.exists()


def test_resume_never_runs_code_from_a_checkpoint_file(tmp_path):
    """A crafted ``rank0.pt`` whose unpickling would run a shell command, with a manifest that
    matches it: the resume refuses the file (weights only) and nothing runs."""
    import hashlib
    import json
    import os

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    step = tmp_path / "ck" / "step-2"
    step.mkdir(parents=True)
    torch.save({"step": 2, "tp_rank": 0, "tp": 1, "rows": Payload()}, step / "rank0.pt")
    data = (step / "rank0.pt").read_bytes()
    (step / "meta.json").write_text(json.dumps({"step": 2, "files": {"rank0.pt": {
        "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}))
    r = _train_cli(tmp_path, "--steps", "1", "--checkpoint-dir", tmp_path / "ck", "--resume")
    assert not marker.exists()
    assert r.exit_code == 1 and "rank0.pt" in r.output and "weights-only" in r.output, r.output


def test_cli_train_checkpoints_every_k_steps_and_keeps_the_newest(tmp_path):
    """Without --elastic: --checkpoint-every 2 --keep 2 over 5 steps leaves step-4 and step-5;
    a resume from step-5 continues exactly."""
    import json

    from shoal.runtime.checkpoint import checkpoint_dirs

    ck = tmp_path / "ck"
    r = _train_cli(tmp_path, "--steps", "5", "--checkpoint-dir", ck, "--checkpoint-every", "2",
                   "--keep", "2", "--json")
    assert r.exit_code == 0, r.output
    assert [n for n, _ in checkpoint_dirs(ck)] == [4, 5]
    assert not [d for d in ck.iterdir() if ".tmp" in d.name]
    r = _train_cli(tmp_path, "--steps", "1", "--checkpoint-dir", ck, "--resume", "--json")
    assert r.exit_code == 0, r.output
    ref_losses, _ = reference(TINY, PLANS["dp2"], 6, SEQ)
    assert json.loads(r.output)["losses"] == pytest.approx(ref_losses[5:], rel=TOL)


def _train_and_kill_rank(tmp_path, rank: int, after_step: int, *args, until=None):
    """``shoal train`` (3 ranks, a long run) in a process of its own; once rank 0 reports
    ``after_step`` (and ``until()`` holds, when given), rank ``rank`` gets SIGKILL. The exit
    code and stderr."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    from _proc import rank_pid, shoal

    f = tmp_path / "plan.json"
    f.write_text(PLANS["asymmetric-3-1"].model_dump_json(by_alias=True))
    run = uuid.uuid4().hex
    proc = shoal("train", f, "--model", "tiny", "--steps", 100000, "--seq", SEQ, "--dtype",
                 "float64", *args, env={"SHOAL_TEST_RUN": run}, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, text=True)
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            words = line.split()
            if words[:1] == ["step"] and int(words[1].rstrip(":")) >= after_step \
                    and (until is None or until()):
                break
        deadline = time.time() + patience(120)  # a loaded machine may take long to start the ranks
        pid = None
        while pid is None and time.time() < deadline and proc.poll() is None:
            pid = rank_pid(f"SHOAL_TEST_RUN={run}", rank)
            time.sleep(0.05)
        assert pid is not None, "".join(err)
        os.kill(pid, signal.SIGKILL)
        err += proc.stderr.readlines()
        return proc.wait(timeout=300), "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_rank_is_named_as_the_one_that_failed_first(tmp_path):
    rc, err = _train_and_kill_rank(tmp_path, 2, 3)
    assert rc == 1, err
    assert "rank 2 failed first" in err and "killed by a signal" in err, err


def test_a_crash_keeps_the_checkpoints_written_before_it(tmp_path):
    """--checkpoint-every without --elastic: a rank killed once a checkpoint is out ends the
    run with exit 1; the checkpoints stay whole, and --resume continues exactly from the
    newest."""
    import json

    from shoal.runtime.checkpoint import latest, verify

    ck = tmp_path / "ck"
    rc, err = _train_and_kill_rank(tmp_path, 2, 2, "--checkpoint-dir", ck,
                                   "--checkpoint-every", "2", until=lambda: latest(ck))
    assert rc == 1 and "--resume continues from it" in err, err
    step, folder = latest(ck)
    assert step >= 2 and step % 2 == 0
    verify(folder)
    assert not [d for d in ck.iterdir() if ".tmp" in d.name]  # the killed run's own write
    from typer.testing import CliRunner

    from shoal.cli import app

    r = CliRunner().invoke(app, ["train", str(tmp_path / "plan.json"), "--model", "tiny",
                                 "--steps", "1", "--seq", str(SEQ), "--dtype", "float64",
                                 "--checkpoint-dir", str(ck), "--resume", "--json"])
    assert r.exit_code == 0, r.output
    ref_losses, _ = reference(TINY, PLANS["asymmetric-3-1"], step + 1, SEQ)
    assert json.loads(r.output)["losses"] == pytest.approx(ref_losses[step:], rel=TOL)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_killing_shoal_train_ends_torchrun_and_every_rank(tmp_path, sig):
    """``shoal train`` (torchrun, 3 ranks) killed mid-run: 10 s later no process it started
    is left; SIGTERM is passed on (torchrun stops the ranks) and the run says so, exit 1."""
    import signal
    import subprocess

    from _proc import descendants, kill_all, left_after, shoal

    f = tmp_path / "plan.json"
    f.write_text(PLANS["asymmetric-3-1"].model_dump_json(by_alias=True))
    proc = shoal("train", f, "--model", "tiny", "--steps", 100000, "--seq", SEQ,
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        for line in proc.stderr:  # rank 0 reports its steps once every rank trains
            if line.startswith("step "):
                break
        pids = descendants(proc.pid)
        assert len(pids) >= 4, pids  # torchrun and three ranks
        proc.send_signal(getattr(signal, sig))
        rc = proc.wait(timeout=120)
        assert left_after(pids, 10) == []
        if sig == "SIGTERM":
            rest = proc.stderr.read()
            assert rc == 1 and "stopped by SIGTERM" in rest, (rc, rest)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        kill_all(pids)
