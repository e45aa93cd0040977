"""A search shows how it is going and stops when asked: progress (the best plan so far, plans
costed, time) while it runs, and on Ctrl-C the best plans found until then, marked as such."""

from __future__ import annotations

import pytest
from tests.test_planners import problem
from typer.testing import CliRunner

from shoal.cli import app
from shoal.cli import plan as plan_cmd
from shoal.training.planners import Limits, complete_front, search
from shoal.training.planners import common as planners_common


def test_progress_reports_the_best_plan_so_far(monkeypatch):
    monkeypatch.setattr(planners_common, "PROGRESS_EVERY_S", 0.0)
    seen = []
    res = search(problem(), limits=Limits(progress=seen.append))
    assert len(seen) > 3
    assert [p.costed for p in seen] == sorted(p.costed for p in seen)
    assert [p.elapsed_s for p in seen] == sorted(p.elapsed_s for p in seen)
    found = [p for p in seen if p.best_iteration_time_s is not None]
    assert found and found[-1].best_iteration_time_s >= res.ranked[0].iteration_time_s * (1 - 1e-9)
    assert not res.stats.interrupted


def test_ctrl_c_returns_the_best_plans_found_until_then(monkeypatch):
    monkeypatch.setattr(planners_common, "PROGRESS_EVERY_S", 0.0)

    def stop_once_found(p):
        if p.best_iteration_time_s is not None:
            raise KeyboardInterrupt

    pb = problem()
    with pytest.raises(KeyboardInterrupt):  # a search in a loop (a replay): Ctrl-C stops it
        search(pb, limits=Limits(progress=stop_once_found))
    res = search(pb, limits=Limits(progress=stop_once_found, interruptible=True))
    assert res.stats.interrupted and res.stats.truncated and res.ranked
    assert res.stats.to_json()["interrupted"] is True
    full = search(pb)
    assert res.stats.candidates_costed < full.stats.candidates_costed
    # the front is not completed after an interruption
    assert complete_front(pb, res).stats.candidates_costed == res.stats.candidates_costed


def test_ctrl_c_before_any_plan_is_an_interrupt(monkeypatch):
    def ctrl_c(*args):  # while the first plans are costed
        raise KeyboardInterrupt

    monkeypatch.setattr(planners_common, "run_specs", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        search(problem(), limits=Limits(interruptible=True))


def test_the_first_report_comes_after_the_first_plans_are_costed(monkeypatch):
    monkeypatch.setattr(planners_common, "PROGRESS_EVERY_S", 3600.0)
    seen = []
    search(problem(), limits=Limits(progress=seen.append))
    assert len(seen) == 1 and seen[0].costed > 0 and seen[0].best_iteration_time_s is not None


def test_piped_plan_prints_progress_lines_and_json_prints_none(monkeypatch, tmp_path):
    monkeypatch.setattr(planners_common, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(plan_cmd, "PIPED_EVERY_S", 0.0)
    from tests.test_meta import EX

    args = ["plan", str(EX / "opt350m-two-zones.yaml"), "--budget", "10"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("searching plans (auto): ")]
    assert len(lines) > 2 and "best so far" in lines[-1] and "plans costed" in lines[-1]
    assert "completing the throughput-cost front" in r.stderr
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0 and "searching plans" not in r.stderr


def test_a_search_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    import gc

    before = gc.get_threshold()
    seen = []

    def during(p):
        seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))

    monkeypatch.setattr(planners_common, "PROGRESS_EVERY_S", 0.0)
    search(problem(), limits=Limits(progress=during))
    assert seen and all(t >= 50_000 and frozen for t, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0

    def ctrl_c(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(planners_common, "run_specs", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        search(problem())
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
