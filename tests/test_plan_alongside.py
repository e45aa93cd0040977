"""The front's longest search runs in a copy of the process while the process runs the search
under its objective (``planners.Alongside``): the plans, the front and the statistics are those
of running every search in one process, a copy that fails is made up for, and no copy outlives
the command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests._clock import patience
from tests._proc import descendants, left_after
from tests._proc import shoal as run_shoal
from tests.test_meta import EX

from shoal import forks
from shoal.cli import plan as plan_cmd
from shoal.problem import load_problem
from shoal.training import planners

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux")


def _result(res) -> tuple:
    return ([(c.spec, c.iteration_time_s, c.cost_usd) for c in res.ranked],
            sorted((c.spec, c.iteration_time_s, c.cost_usd) for c in res.pareto),
            res.stats.candidates_costed, res.stats.truncated)


def _searches(pb):
    return plan_cmd._searches(pb, "auto", None, pb.constraints, 5, 600.0)


@pytest.fixture
def copies(monkeypatch) -> list:
    """The copies ``shoal plan``'s searches start (None where one could not)."""
    if not forks.can_fork() or not forks.spare_core():
        pytest.skip("a copy needs one thread running and a second core")
    started = []
    start = planners.Alongside.start.__func__

    def recorded(cls, *args, **kwargs):
        started.append(start(cls, *args, **kwargs))
        return started[-1]

    monkeypatch.setattr(planners.Alongside, "start", classmethod(recorded))
    monkeypatch.setattr(plan_cmd, "ALONE_S", 0.0)  # forked at the first plan, however quick
    return started


def _alone(pb, monkeypatch) -> tuple:
    with monkeypatch.context() as m:
        m.setenv(planners.ALONGSIDE_ENV, "0")
        return _result(_searches(pb))


def test_the_plans_and_the_front_are_those_of_one_process(copies, monkeypatch):
    pb = load_problem(EX / "het-a100-v100.yaml")
    alone = _alone(pb, monkeypatch)
    assert copies == [None]  # asked not to
    copies.clear()
    assert _result(_searches(pb)) == alone
    [alongside] = copies  # started once, after the first plan
    assert alongside.goals == ("max-throughput-per-dollar",)
    assert alongside.child.returncode == 0 and not forks.alive(alongside.child.pid)


def test_a_copy_that_fails_is_made_up_for(copies, monkeypatch):
    pb = load_problem(EX / "het-a100-v100.yaml")
    alone = _alone(pb, monkeypatch)
    copies.clear()
    here = os.getpid()
    front_search = planners._front_search

    def fails_in_the_copy(*args, **kwargs):
        if os.getpid() != here:
            raise RuntimeError("the copy fails")
        return front_search(*args, **kwargs)

    monkeypatch.setattr(planners, "_front_search", fails_in_the_copy)
    assert _result(_searches(pb)) == alone
    [alongside] = copies
    assert alongside.child.returncode == 1  # it did fail, and was waited for


def test_off_where_asked_or_where_it_cannot_run(monkeypatch):
    pb = load_problem(EX / "het-a100-v100.yaml")
    monkeypatch.setenv(planners.ALONGSIDE_ENV, "0")
    assert planners.Alongside.start(pb) is None
    monkeypatch.delenv(planners.ALONGSIDE_ENV)
    monkeypatch.setattr(forks, "spare_core", lambda: False)
    assert planners.Alongside.start(pb) is None
    # espresso completes its front with min-cost alone: that search runs alongside
    monkeypatch.setattr(forks, "spare_core", lambda: True)
    if forks.can_fork():
        with planners.Alongside.start(pb, "max-throughput", strategy="espresso") as alongside:
            assert alongside.goals == ("min-cost",)


def test_a_copy_runs_only_its_function_and_ends_with_its_code(tmp_path):
    if not forks.can_fork():
        pytest.skip("another thread runs")
    read, write = os.pipe()
    other = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)

    def run():
        with os.fdopen(write, "w") as f:  # the kept descriptor is open, the other is not
            f.write(json.dumps([os.getppid(), _is_open(other)]))

    child = forks.Forked.start(run, name=b"shoal-test", keep=(write,))
    os.close(write)
    with os.fdopen(read) as f:
        assert json.loads(f.read()) == [os.getpid(), False]
    assert child.wait(patience(30)) == 0
    os.close(other)
    failing = forks.Forked.start(lambda: 1 / 0, name=b"shoal-test")
    assert failing.wait(patience(30)) == 1


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_no_copy_outlives_a_plan_ended_by_ctrl_c_or_run_to_its_end():
    scenario = EX / "opt350m-two-zones.yaml"
    p = run_shoal("plan", scenario, "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=patience(600))
    assert p.returncode == 0, err.decode()
    assert json.loads(out)["pareto"]
    p = run_shoal("plan", scenario, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: set[int] = set()
    end = time.monotonic() + patience(120)
    while p.poll() is None and not seen and time.monotonic() < end:
        seen.update(descendants(p.pid))  # the copy (and a first run's compiling helper)
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=patience(600))
    assert p.returncode in (0, 130, -signal.SIGINT), err.decode()
    assert left_after(seen, patience(10)) == []


def test_an_interrupted_search_does_not_wait_for_its_copy(copies, monkeypatch):
    from shoal.training.planners import complete_front, search

    pb = load_problem(EX / "het-a100-v100.yaml")
    res = search(pb)
    res.stats.interrupted = True
    alongside = planners.Alongside.start(pb, limits=planners.Limits(budget_s=600.0))
    monkeypatch.setattr(alongside, "result", lambda goal: pytest.fail("waited for the copy"))
    with alongside:
        done = complete_front(pb, res, alongside=alongside)
    assert done.stats.candidates_costed == res.stats.candidates_costed
