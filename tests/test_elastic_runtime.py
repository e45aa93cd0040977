"""Kill-free reconfiguration of running workers (the elastic runtime): a worker killed mid-run,
a worker joining mid-run, a crash while a checkpoint is written, every worker lost, and the
controller killed."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
from tests._clock import patience

torch = pytest.importorskip("torch")

from _proc import descendants, kill_all, left_after, shoal  # noqa: E402
from shoal.catalog import TINY  # noqa: E402
from shoal.runtime import checkpoint as ckpt  # noqa: E402
from shoal.runtime.elastic import PG_TIMEOUT_S, ElasticJob  # noqa: E402
from shoal.runtime.elastic_worker import CheckpointWrite, _write_async  # noqa: E402
from shoal.runtime.train import reference, spawn  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402

SEQ, STEPS = 16, 8
JOIN_STEPS = 16


def dp(n: int, total: int = 4) -> TrainingPlan:
    shares = [total // n + (1 if i < total % n else 0) for i in range(n)]
    return TrainingPlan.model_validate({"microbatch_size": 1, "stages": [{
        "layers": [0, 6], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": m}
                                       for m in shares]}]})


def pp(n: int) -> TrainingPlan:
    """Two stages when there are at least two workers (the extra ones as stage-1 replicas)."""
    if n == 1:
        return dp(1)
    reps = [{"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": m}
            for m in ([4] if n == 2 else [3, 1])]
    return TrainingPlan.model_validate({"microbatch_size": 1, "stages": [
        {"layers": [0, 3], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": 4}]},
        {"layers": [3, 6], "replicas": reps}]})


def past(j, step: int) -> bool:
    """True once the first generation has finished ``step`` steps."""
    return j.store.check(["g0/last_step"]) and int(j.store.get("g0/last_step")) >= step


def final_params(d) -> dict:
    out = {}
    for f in sorted(d.glob("rank*.pt")):
        doc = torch.load(f, weights_only=True)
        if doc["role"][1] == 0 and doc["role"][2] == 0:
            out.update(doc["state"])
    return out


def from_checkpoint(tmp, ck, step: int, plan: TrainingPlan, steps: int) -> dict:
    """A fresh run of ``plan`` from checkpoint ``step`` (the reference)."""
    ref_ck, ref_out = tmp / "ref-ck", tmp / "ref-out"
    ref_ck.mkdir()
    ref_out.mkdir()
    shutil.copytree(ck / f"step-{step}", ref_ck / f"step-{step}")
    spawn(plan, TINY, steps, SEQ, checkpoint_dir=str(ref_ck), resume=True, out_dir=str(ref_out))
    return final_params(ref_out)


def close(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm()) for k in b)


def test_killed_worker_survivors_continue_under_a_new_plan(tmp_path):
    ck, out = tmp_path / "ck", tmp_path / "out"
    out.mkdir()
    job = ElasticJob(TINY, dp, total_steps=STEPS, seq=SEQ, ckpt_dir=str(ck), every=2, keep=100,
                     out_dir=str(out))
    state = {}

    def events(j):
        # after step 3, once a checkpoint is out (its write is asynchronous)
        if "killed" not in state and past(j, 3) and ckpt.latest(ck):
            state["killed"] = time.time()
            state["pids"] = {w: j.pid(w) for w in (0, 1)}
            os.kill(j.pid(2), signal.SIGKILL)

    res = job.run(3, events=events)
    last = res["reconfigurations"][-1]
    kill_to_first_step = float(job.store.get(f"g{job.gen}/first_step_at")) - state["killed"]
    print(f"kill to the first step under the new plan: {kill_to_first_step:.2f} s "
          f"(detection to first step {last['detect_to_first_step_s']:.2f} s)")
    # under a second when the survivors rejoin at once; a survivor that tries to join while
    # its peer is still leaving the old group waits for gloo's timeout (PG_TIMEOUT_S) and
    # joins again (one CI run: 10.04 s from detection under a loaded machine)
    assert 0 < kill_to_first_step < PG_TIMEOUT_S + 10
    assert last["cause"] == "worker 2 left" and last["members"] == [0, 1]
    assert last["new_plan"] == "S0: cpu(1)x2"
    assert last["detect_to_first_step_s"] < PG_TIMEOUT_S + 7
    assert {w: job.pid(w) for w in (0, 1)} == state["pids"]  # the survivors were not restarted
    k = last["resumed_from_step"]
    assert 2 <= k <= STEPS - 1 and last["steps_lost"] >= 0
    assert close(final_params(out), from_checkpoint(tmp_path, ck, k, dp(2), STEPS - k)) <= 1e-9
    assert len(res["losses"]) == STEPS


def run_with_a_join(tmp_path, before_join=lambda: None):
    """Two workers on ``pp`` for JOIN_STEPS, a third added after step 3 (``before_join`` runs
    just before); long enough that the join lands before the last step."""
    ck, out = tmp_path / "ck", tmp_path / "out"
    out.mkdir()
    job = ElasticJob(TINY, pp, total_steps=JOIN_STEPS, seq=SEQ, ckpt_dir=str(ck), every=2,
                     keep=100, out_dir=str(out))
    state = {}

    def events(j):
        if "joined" not in state and past(j, 3) and ckpt.latest(ck):
            state["pids"] = {w: j.pid(w) for w in (0, 1)}
            before_join()
            state["joined"] = j.add_worker()

    return job, job.run(2, events=events, timeout_s=120), state, ck, out


def test_joining_worker_is_taken_in_without_restarting_the_others(tmp_path):
    job, res, state, ck, out = run_with_a_join(tmp_path)
    last = res["reconfigurations"][-1]
    assert last["cause"] == f"worker {state['joined']} joined" and last["members"] == [0, 1, 2]
    assert last["new_plan"] == pp(3).summary()
    assert {w: job.pid(w) for w in (0, 1)} == state["pids"]
    assert all(int(job.store.get(f"ready/{w}")) == state["pids"][w] for w in (0, 1))
    k = last["resumed_from_step"]
    ref = from_checkpoint(tmp_path, ck, k, pp(3), JOIN_STEPS - k)
    assert close(final_params(out), ref) <= 1e-9


def _slow_writer(port, directory):
    """Write rank 0's share of checkpoint 4 so slowly that it is killed mid-write."""

    def slow(obj, f):
        f.write(b"partial")
        f.flush()
        time.sleep(60)

    torch.save = slow
    _write_async(port, CheckpointWrite(directory, 4, 2, {"step": 4}, "run", 0), (0, 1), True,
                 {"step": 4}).join()


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    import multiprocessing as mp

    from shoal.runtime.train import store as make_store

    ck = tmp_path / "ck"
    spawn(dp(2), TINY, 2, SEQ, checkpoint_dir=str(ck))  # a whole checkpoint at step 2
    store = make_store(host=True, timeout_s=30.0)
    port = store.port
    p = mp.get_context("fork").Process(target=_slow_writer, args=(port, ck))
    p.start()
    deadline = time.time() + patience(30)
    part = ck / "step-4.tmp-run-g0" / "rank0.pt"
    while not (part.exists() and part.stat().st_size) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert part.parent.is_dir() and not (ck / "step-4").exists()
    assert ckpt.latest(ck)[0] == 2
    res = spawn(dp(2), TINY, 1, SEQ, checkpoint_dir=str(ck), resume=True)
    assert res[0]["first_step"] == 2
    del store


def test_killed_tp_worker_planner_chooses_the_new_plan(tmp_path):
    """TP 2 then two replicas; one stage-1 replica dies; shoal's planner picks the plan for the
    three survivors (it may leave one idle) and training continues exactly."""
    from shoal.runtime.elastic import PolicyChoice

    start = TrainingPlan.model_validate({"microbatch_size": 2, "stages": [
        {"layers": [0, 3], "replicas": [{"gpu": "cpu", "tp": 2, "zone": "local",
                                         "microbatches": 4}]},
        {"layers": [3, 6], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": m} for m in (3, 1)]}]})
    choice = PolicyChoice(TINY, 8, SEQ, 2)
    choice.cache[4] = start
    ck, out = tmp_path / "ck", tmp_path / "out"
    out.mkdir()
    job = ElasticJob(TINY, choice, total_steps=STEPS, seq=SEQ, ckpt_dir=str(ck), every=2,
                     keep=100, out_dir=str(out))
    state = {}

    def events(j):
        if "killed" not in state and past(j, 3) and ckpt.latest(ck):
            state["killed"] = True
            os.kill(j.pid(3), signal.SIGKILL)

    res = job.run(4, events=events)
    last = res["reconfigurations"][-1]
    assert last["cause"] == "worker 3 left"
    assert last["new_plan"] == choice(3).summary()
    assert last["detect_to_first_step_s"] < PG_TIMEOUT_S + 7
    k = last["resumed_from_step"]
    assert close(final_params(out), from_checkpoint(tmp_path, ck, k, choice(3), STEPS - k)) <= 1e-9


class _NeverPays:
    """A plan chooser whose switch policy never moves for a joining worker."""

    def __call__(self, n):
        return dp(n)

    def pays(self, old_n, new_n, remaining_steps, redo_steps):
        return False


def test_joining_worker_waits_when_the_switch_would_not_pay(tmp_path, monkeypatch):
    from shoal.runtime import pipeline

    # the workers' steps after the second wait until the controller has seen the new worker,
    # so that the join is weighed before the run ends however loaded the machine is
    parent, seen = os.getpid(), tmp_path / "seen"
    real, calls = pipeline.Worker.step, {"n": 0}

    def held(self, tokens):  # the workers are forked: they see this
        calls["n"] += 1
        while os.getpid() != parent and calls["n"] > 2 and not seen.exists():
            time.sleep(0.02)
        return real(self, tokens)

    monkeypatch.setattr(pipeline.Worker, "step", held)
    job = ElasticJob(TINY, _NeverPays(), total_steps=6, seq=SEQ, ckpt_dir=str(tmp_path / "ck"),
                     every=2)
    state = {}

    def events(j):
        if "joined" not in state and past(j, 2):
            state["joined"] = j.add_worker()
        if "joined" in state and any("joined" in r.cause for r in j.reconfigurations):
            seen.touch()

    res = job.run(2, events=events)
    recs = res["reconfigurations"]
    # a generation retried after a collective timed out on a loaded machine is republished
    # with the same members; the joining worker is never taken in
    joined = [r for r in recs if "worker 2 joined" in r["cause"]]
    assert joined and all(r["decision"].startswith("stay") for r in joined), recs
    assert all(r["members"] == [0, 1] for r in recs), recs
    assert job.gen == sum("retried" in r["cause"] for r in recs), recs
    assert len(res["losses"]) == 6


def _profiled_choice(tmp_path, **kw):
    from shoal.runtime import profiler
    from shoal.runtime.elastic import PolicyChoice
    from shoal.runtime.train import launch

    prof = tmp_path / "p.json"
    launch(2, profiler.run, TINY, "tiny", [1], [1], SEQ, 2, prof)
    return PolicyChoice(TINY, 4, SEQ, 1, profile=str(prof), **kw)


def test_switch_policy_weighs_the_gain_against_the_cost(tmp_path):
    """A join late in the run does not pay the switch; early, a faster plan for more workers
    does; the same workers never move."""
    choice = _profiled_choice(tmp_path)
    choice.cache[1] = dp(1)
    assert choice(1) is choice.cache[1]
    t1 = choice.iteration_s(dp(1))
    assert not choice.pays(1, 2, 1, 1)  # one step left: a 1 s switch cannot pay
    assert not choice.pays(1, 1, 10**6, 0)  # no more workers, no move
    best2 = choice.decisions[0].options[0]
    if best2.iteration_time_s < t1:  # the measured profile makes two workers faster
        many = int(20 * (1.0 + best2.iteration_time_s) / (t1 - best2.iteration_time_s)) + 10
        assert choice.pays(1, 2, many, 1)  # enough steps left: the faster plan pays
        assert choice(2).summary() == best2.cand.plan.summary()


def test_a_live_switch_decision_is_the_replay_policys(tmp_path):
    """The controller's decision on a join is ``shoal.elastic.policy.choose`` on the run's own
    history, with the re-planner's ranked plans and this runtime's switch costs: the same
    inputs given to the policy directly give the same plan, and a measured switch cost goes
    into the next decision."""
    from shoal.elastic.policy import Change, choose
    from shoal.elastic.replan import Replanner
    from shoal.runtime.elastic import SwitchCosts

    choice = _profiled_choice(tmp_path, costs=SwitchCosts(restart_s=0.25))
    choice.cache[1] = dp(1)
    choice(1)
    for left in (2, 40, 10**5):
        choice.observe(1.0, 5, 1, 5 + left)
        moved = choice.pays(1, 2, left, 1)
        d = choice.decisions[-1]
        assert d.problem.switching.restart == 0.25 and d.problem.switching.node_startup == 0
        ranked = Replanner(choice.problem).plan({("cpu", "local"): 2},
                                                hints=[d.current.cand.spec]).ranked
        assert [c.spec for c in ranked][:3] == [r.cand.spec for r in d.options][:3]
        got = choose("shoal", d.problem, d.problem.objective, d.current, d.options,
                     Change(seen=d.seen, forced=False, notice_s=0.0,
                            since_checkpoint_s=d.since_checkpoint_s,
                            known=list(choice.known.values()), end_s=d.end_s))
        assert moved == (got.cand.spec != d.current.cand.spec)
        if moved:
            assert choice(2).summary() == got.cand.plan.summary()
            break
    choice.measured_switch(0.7)
    choice.pays(2, 3, 10, 1)
    assert choice.decisions[-1].problem.switching.restart == pytest.approx(0.7)


def test_the_switch_policy_estimates_a_plan_of_any_gpus_and_zones():
    """The run's own plan (as ``shoal plan`` writes it: real GPU types and zones) is costed as
    the CPU processes that run it, so the policy weighs it rather than switching blind."""
    from shoal.runtime.elastic import PolicyChoice

    choice = PolicyChoice(TINY, 4, SEQ, 1)
    doc = dp(1).to_json()
    for st in doc["stages"]:
        for r in st["replicas"]:
            r["gpu"], r["zone"] = "A100-40GB", "us-central1-a"
    assert choice.iteration_s(TrainingPlan.model_validate(doc)) == \
        pytest.approx(choice.iteration_s(dp(1)))
    choice.cache[1] = TrainingPlan.model_validate(doc)
    choice(1)
    assert not choice.pays(1, 1, 10**6, 0)  # the same workers: no move


def test_cli_elastic_lists_the_reconfigurations(tmp_path):
    import json

    from typer.testing import CliRunner

    from shoal.cli import app

    f = tmp_path / "plan.json"
    f.write_text(pp(3).model_dump_json(by_alias=True))
    r = CliRunner().invoke(app, ["train", str(f), "--model", "tiny", "--steps", "6", "--seq",
                                 str(SEQ), "--elastic", "--fault-at", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    causes = [x["cause"] for x in doc["reconfigurations"]]
    assert causes[0] == "start" and causes[1] == "worker 2 left"
    for x in doc["reconfigurations"]:
        assert {"time_s", "old_plan", "new_plan", "detect_to_first_step_s", "steps_lost",
                "decision"} <= x.keys()
    assert len(doc["losses"]) == 6



def test_a_generation_that_fails_with_every_worker_alive_is_published_again(tmp_path,
                                                                            monkeypatch):
    """The generation after a join fails in every worker (a checkpoint read fails once) while
    all are alive: the controller publishes the same members again after a heartbeat timeout,
    and the run finishes without restarting anyone."""

    parent = os.getpid()
    armed, fired = tmp_path / "armed", tmp_path / "fired"
    real = ckpt.latest

    def flaky(directory):  # the workers are forked: they see this
        if os.getpid() != parent and armed.exists() and not fired.exists():
            fired.touch()
            raise OSError("checkpoint unreadable (injected)")
        return real(directory)

    monkeypatch.setattr(ckpt, "latest", flaky)
    job, res, state, ck, out = run_with_a_join(tmp_path, armed.touch)
    causes = [r["cause"] for r in res["reconfigurations"]]
    assert causes[:2] == ["start", f"worker {state['joined']} joined"]
    assert len(causes) == 3 and "OSError: checkpoint unreadable (injected)" in causes[2]
    assert causes[2].endswith("retried")
    last = res["reconfigurations"][-1]
    assert last["members"] == [0, 1, 2] and last["new_plan"] == pp(3).summary()
    assert {w: job.pid(w) for w in (0, 1)} == state["pids"]  # nobody was restarted
    assert len(res["losses"]) == JOIN_STEPS
    k = last["resumed_from_step"]
    ref = from_checkpoint(tmp_path, ck, k, pp(3), JOIN_STEPS - k)
    assert close(final_params(out), ref) <= 1e-9


def test_a_generation_that_cannot_start_stops_the_job_with_its_error(tmp_path, monkeypatch):
    """Every start of the generation after a join fails (the workers cannot build their
    stages): after a worker's starts run out it reports the error, the controller publishes the
    generation again a few times, then stops the job with that error (no silent wait)."""
    from shoal.runtime import elastic, elastic_worker

    parent = os.getpid()
    armed = tmp_path / "armed"
    real = elastic_worker.Worker

    def broken(*args, **kwargs):  # the workers are forked: they see this
        if os.getpid() != parent and armed.exists():
            raise ValueError("cannot build this stage (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(elastic_worker, "Worker", broken)
    monkeypatch.setattr(elastic_worker, "JOIN_ATTEMPTS", 1)  # each start of a group can take seconds
    started = time.time()
    with pytest.raises(RuntimeError, match="cannot build this stage") as e:
        run_with_a_join(tmp_path, armed.touch)
    assert f"failed {elastic.MAX_RETRIES + 1} times in a row" in str(e.value)
    assert time.time() - started < patience(100)


def test_cli_elastic_resume_runs_steps_more_and_a_used_folder_needs_resume(tmp_path):
    """``--resume`` with ``--elastic`` continues from the newest checkpoint for ``--steps``
    more iterations, as without ``--elastic``; a folder holding a checkpoint without
    ``--resume`` is refused (the workers would reload it when they reconfigure)."""
    import json

    from typer.testing import CliRunner

    from shoal.cli import app

    f, ck = tmp_path / "plan.json", tmp_path / "ck"
    f.write_text(dp(2).model_dump_json(by_alias=True))
    args = ["train", str(f), "--model", "tiny", "--seq", str(SEQ), "--checkpoint-dir", str(ck)]
    r = CliRunner().invoke(app, [*args, "--steps", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert ckpt.latest(ck)[0] == 3
    r = CliRunner().invoke(app, [*args, "--steps", "2", "--elastic"])
    assert r.exit_code == 2 and "step-3" in r.output and "--resume" in r.output
    r = CliRunner().invoke(app, [*args, "--steps", "2", "--elastic", "--resume", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["steps"] == 5 and len(doc["losses"]) == 2 and doc["final_loss"] is not None


def test_cli_train_checks_its_folders_and_options_before_starting(tmp_path):
    from typer.testing import CliRunner

    from shoal.cli import app

    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(dp(1).model_dump_json(by_alias=True))
    two.write_text(dp(2).model_dump_json(by_alias=True))
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    for args, says in (
            ([str(two), "--checkpoint-dir", str(a_file)], "a file, not a folder"),
            ([str(two), "--checkpoint-dir", str(tmp_path / "none"), "--resume"],
             "no checkpoint to resume from"),
            ([str(one), "--elastic", "--fault-at", "2"], "one worker"),
            ([str(two), "--elastic", "--profile", str(tmp_path / "missing.json")],
             "profile not found"),
            ([str(two), "--elastic", "--profile", str(two)], "not a shoal profile")):
        r = CliRunner().invoke(app, ["train", *args, "--model", "tiny", "--steps", "2"])
        assert r.exit_code == 2 and says in r.output, (args, r.output)
    r = CliRunner().invoke(app, ["profile", "--model", "tiny", "-o", str(tmp_path / "p.json"),
                                 "--mbs", "0,1"])
    assert r.exit_code == 2 and "--mbs: must be at least 1" in r.output


def test_a_join_after_the_last_step_is_not_a_switch(tmp_path):
    """Workers that join once every step has run have nothing left to speed up: the plan
    stays, whatever the switch policy (here, one that always switches)."""
    job = ElasticJob(TINY, dp, total_steps=6, seq=SEQ, ckpt_dir=str(tmp_path / "ck"))
    try:
        job.gen, job.members = 0, [0, 1]
        job.store.set("g0/last_step", "5")
        assert job._why_stay(3) is None  # a step left: the policy (always) switches
        job.store.set("g0/last_step", "6")
        assert job._why_stay(3) == "stay: the run has done its steps"
    finally:
        job.shutdown()


# ------------------------------------------------------- reliability of the elastic runtime (issue 61)

def test_elastic_checkpoints_never_take_in_a_folder_a_killed_run_left(tmp_path):
    """A killed run left ``step-2.g0.tmp/`` with another run's rank file: the elastic writer
    never writes into it, and a resume from this run's step-2 continues exactly."""
    from shoal.runtime.train import reference

    ck, other = tmp_path / "ck", tmp_path / "other"
    spawn(dp(2), TINY, 2, SEQ, checkpoint_dir=str(other), seed=1)  # other weights
    leftover = ck / "step-2.g0.tmp"
    leftover.mkdir(parents=True)
    shutil.copy(other / "step-2" / "rank0.pt", leftover / "rank5.pt")
    ElasticJob(TINY, dp, total_steps=4, seq=SEQ, ckpt_dir=str(ck), every=2, keep=100).run(2)
    assert sorted(f.name for f in (ck / "step-2").iterdir()) == ["meta.json", "rank0.pt"]
    again = tmp_path / "again"
    again.mkdir()
    shutil.copytree(ck / "step-2", again / "step-2")
    res = spawn(dp(2), TINY, 2, SEQ, checkpoint_dir=str(again), resume=True)
    ref_losses, _ = reference(TINY, dp(2), 4, SEQ)
    assert res[0]["losses"] == pytest.approx(ref_losses[2:], rel=1e-9)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_controller_ends_its_workers_and_store(tmp_path, sig):
    import subprocess

    f, ck = tmp_path / "plan.json", tmp_path / "ck"
    f.write_text(dp(2).model_dump_json(by_alias=True))
    proc = shoal("train", f, "--model", "tiny", "--steps", 100000, "--seq", SEQ, "--elastic",
                  "--checkpoint-dir", ck, "--checkpoint-every", 2, "--json",
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        deadline = time.time() + patience(180)  # a loaded machine may start the workers slowly
        while ckpt.latest(ck) is None and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ckpt.latest(ck) is not None, "the run did not start training"
        pids = descendants(proc.pid)
        assert len(pids) >= 3  # the store and two workers
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        assert left_after(pids, 10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        kill_all(pids)


def test_losing_every_worker_ends_the_run_saying_they_died(tmp_path):
    from shoal.errors import RunFailed

    job = ElasticJob(TINY, dp, total_steps=STEPS, seq=SEQ, ckpt_dir=str(tmp_path / "ck"))
    state = {}

    def events(j):
        if "killed" not in state and past(j, 1):
            state["killed"] = True
            for w in (0, 1):
                os.kill(j.pid(w), signal.SIGKILL)

    with pytest.raises(RunFailed, match="workers died") as e:
        job.run(2, events=events)
    assert "worker 0 was killed by SIGKILL" in str(e.value)
    assert "worker 1 was killed by SIGKILL" in str(e.value)


def test_cli_elastic_prints_each_step_and_reconfiguration_as_it_happens(tmp_path):
    import subprocess
    import threading

    f = tmp_path / "plan.json"
    f.write_text(pp(3).model_dump_json(by_alias=True))
    proc = shoal("train", f, "--model", "tiny", "--steps", 100000, "--seq", SEQ, "--elastic",
                  "--fault-at", 2, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.time() + patience(180)  # a loaded machine may start the workers slowly
        while not any("worker 2 left" in x for x in seen) and time.time() < deadline \
                and proc.poll() is None:
            time.sleep(0.1)
        # while the run goes on (100000 steps), both kinds of line are out
        assert proc.poll() is None, "".join(seen)
        steps = [x for x in seen if x.startswith("step ")]
        assert steps and steps[0].startswith("step 1: loss "), "".join(seen)
        assert any("worker 2 left" in x and "plan S0" in x for x in seen), "".join(seen)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 1
        reader.join(timeout=60)
        assert "stopped by SIGTERM" in "".join(seen), "".join(seen)
    finally:
        if proc.poll() is None:
            left = descendants(proc.pid)
            proc.kill()
            proc.wait()
            kill_all(left)


def test_a_pipeline_reconfiguration_does_not_wait_for_gloos_timeout(tmp_path, monkeypatch):
    """The last stage-1 replica of a pipeline dies after its sends of step 3, as its gradient
    sync starts: the stage-0 ranks are then left waiting in the iteration's loss all-reduce on
    the other stage-1 rank, which has left with the old group's connections still open. With
    gloo's timeout at 60 s, the survivors still train under the new plan within seconds."""
    import torch.distributed as dist

    from shoal.runtime import elastic_worker, shards

    # the workers are forked: they see this
    monkeypatch.setattr(elastic_worker, "PG_TIMEOUT_S", 60.0)
    parent = os.getpid()
    real, calls = shards.ParamStore.finish, {"n": 0}

    def dies(self):  # the gradient sync after the iteration's sends
        calls["n"] += 1
        if os.getpid() != parent and dist.get_rank() == 3 and calls["n"] == 3:
            os._exit(3)
        return real(self)

    monkeypatch.setattr(shards.ParamStore, "finish", dies)
    start = TrainingPlan.model_validate({"microbatch_size": 2, "stages": [
        {"layers": [0, 3], "replicas": [{"gpu": "cpu", "tp": 2, "zone": "local",
                                         "microbatches": 4}]},
        {"layers": [3, 6], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": m} for m in (3, 1)]}]})
    plans = {4: start, 3: dp(2, 8), 2: dp(2, 8)}
    job = ElasticJob(TINY, lambda n: plans[n], total_steps=STEPS, seq=SEQ,
                     ckpt_dir=str(tmp_path / "ck"))
    res = job.run(4)
    last = res["reconfigurations"][-1]
    assert last["cause"] == "worker 3 left"
    assert last["detect_to_first_step_s"] < 30, res["reconfigurations"]
    assert len(res["losses"]) == STEPS


def test_the_losses_hold_every_step_whichever_generation_ran_it(tmp_path):
    """Generation 0 runs steps 5 and 6 (and checkpoints step 6) after the controller looked
    last; generation 1 fails; generation 2 resumes from step 6: the run's losses are those of
    steps 1-6 as generation 0 ran them and 7-8 as generation 2 did, each once."""
    import json

    ck = tmp_path / "ck"
    job = ElasticJob(TINY, dp, total_steps=8, seq=SEQ, ckpt_dir=str(ck))
    shown = []
    job.on_event = lambda kind, doc: shown.append(doc["step"]) if kind == "step" else None

    def ran(g, steps):
        for s in steps:
            job.store.set(f"g{g}/step/{s}", json.dumps([10.0 * g + s, 0.1]))
        job.store.set(f"g{g}/last_step", str(steps[-1]))

    def checkpoint(step):
        (ck / f"step-{step}").mkdir()
        (ck / f"step-{step}" / "meta.json").write_text("{}")

    try:
        job._publish([0, 1], "start", time.time())
        ran(0, [1, 2, 3, 4])
        checkpoint(4)
        job._report_steps()
        job._publish([0, 1], "worker 2 joined", time.time())
        ran(0, [5, 6])  # before generation 0 saw generation 1
        checkpoint(6)
        job._publish([0, 1], "worker 1 failed: retried", time.time(), abort=True)
        ran(2, [7, 8])
        job._report_steps()
        assert job._losses == {s: float(s) for s in range(1, 7)} | {7: 27.0, 8: 28.0}
        assert shown == list(range(1, 9))
    finally:
        job.shutdown()
        job.host.close()


def test_two_machines_train_elastic_and_go_on_without_a_lost_worker(tmp_path):
    """``--elastic --nnodes 2`` on two "machines" of 127.0.0.1: the first serves the store at
    the rendezvous endpoint and runs the controller, the second's workers register there; the
    run trains as one process would, and when the second machine's worker is killed the first
    machine's worker goes on alone under a new plan and finishes."""
    import json
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f, ck = tmp_path / "plan.json", tmp_path / "ck"
    f.write_text(dp(2).model_dump_json(by_alias=True))
    common = ["train", f, "--model", "tiny", "--steps", 10, "--seq", SEQ, "--dtype", "float64",
              "--elastic", "--nnodes", 2, "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--checkpoint-dir", ck, "--checkpoint-every", 2]
    second = shoal(*common, "--node-rank", 1, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, text=True)
    first = shoal(*common, "--node-rank", 0, "--json", stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        deadline = time.time() + 240  # a loaded machine may start the workers slowly
        while ckpt.latest(ck) is None and time.time() < deadline and first.poll() is None:
            time.sleep(0.05)
        pids = descendants(second.pid)
        assert pids, "the second machine started no worker"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
        second.wait(timeout=60)
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()
        kill_all(pids)
    doc = json.loads(out)
    recs = doc["reconfigurations"]
    assert recs[0]["cause"] == "start" and recs[0]["members"] == [0, 1]
    # ids come from one counter, whichever machine starts its workers first
    assert any(r["cause"] in ("worker 0 left", "worker 1 left") and len(r["members"]) == 1
               for r in recs), recs
    assert len(doc["losses"]) == 10
    ref, _ = reference(TINY, dp(2), 10, SEQ)
    first_gen = recs[-1]["resumed_from_step"]  # the steps before it: both machines' workers
    assert doc["losses"][:first_gen] == pytest.approx(ref[:first_gen], rel=1e-9)
    assert doc["losses"] == pytest.approx(ref, rel=1e-9)  # the survivor's plan: the same batch
