"""WAN links, pipelines across datacenters (GPipe, 1F1B, Varuna-style, Atlas) and Atlas's Alg. 1."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests._clock import cpu_s

from shoal.estimate.timeline import simulate_pipeline
from shoal.specs.network import LinkSpec, WanSpec
from shoal.training.geo import SCHEDULES, GeoJob, iteration_bounds, simulate
from shoal.training.planners.atlas import algorithm1, best, ring_latency, uniform_cell_latency

TABLE1 = {10: 1220, 20: 600, 30: 396, 40: 293}  # Atlas Table 1: ms -> Mbit/s, one connection


@pytest.mark.parametrize("ms", sorted(TABLE1))
def test_wan_one_connection_follows_table1(ms):
    w = WanSpec(latency=f"{ms}ms", connections=1)
    mbps = w.bandwidth() * 8 / 1e6
    assert mbps == pytest.approx(TABLE1[ms], rel=1e-9)


def test_wan_many_connections_reach_the_pair_cap():
    assert WanSpec(latency="10ms").n_connections() == 5
    assert WanSpec(latency="40ms").n_connections() == 18
    for ms in TABLE1:
        assert WanSpec(latency=f"{ms}ms").bandwidth() * 8 == pytest.approx(5e9)
    assert WanSpec(latency="40ms", connections=4).bandwidth() * 8 == pytest.approx(4 * 293e6)
    assert WanSpec(latency="25ms", connections=1).bandwidth() * 8 / 1e6 == pytest.approx(
        (12000 + 11880) / 2 / 25)  # window interpolated between 20 and 30 ms
    assert WanSpec(latency="1ms", connections=1).bandwidth() * 8 == pytest.approx(5e9)  # capped


def test_wan_link_in_a_network_spec():
    link = LinkSpec(wan={"latency": "40ms"})
    assert link.latency_s() == pytest.approx(0.04)
    assert link.single_curve().bandwidth * 8 == pytest.approx(5e9)
    with pytest.raises(ValidationError, match="only one of"):
        LinkSpec(bandwidth="10Gbps", wan={"latency": "40ms"})
    with pytest.raises(ValidationError, match="latency > 0"):
        LinkSpec(wan={"latency": 0})


def _job(S=4, M=6, P=3, dcs=None, f=0.1, comm=0.2, lat=0.04, rec=True) -> GeoJob:
    dcs = dcs or ["d1", "d2", "d3", "d3"][:S]
    return GeoJob(
        stage_dc=tuple(dcs), fwd_s=(f,) * S, bwd_s=(2 * f,) * S,
        recompute_s=(f if rec else 0.0,) * S, act_bytes=1.0, grad_bytes=(1e9,) * S,
        hop_bw=tuple(1 / comm if dcs[i] != dcs[i + 1] else 100 / comm for i in range(S - 1)),
        hop_latency_s=tuple(lat if dcs[i] != dcs[i + 1] else 0.0 for i in range(S - 1)),
        pipelines=P, microbatches=M)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_datacenter_equals_the_pipeline_simulation(schedule):
    f = np.array([1.0, 1.2, 0.9, 1.1])
    job = GeoJob(stage_dc=("a",) * 4, fwd_s=tuple(f), bwd_s=tuple(2 * f), recompute_s=(0,) * 4,
                 act_bytes=0.0, grad_bytes=(0.0,) * 4, hop_bw=(1.0,) * 3,
                 hop_latency_s=(0.0,) * 3, pipelines=1, microbatches=8)
    _, ends = simulate_pipeline(f, 2 * f, 8, schedule)
    assert simulate(job, schedule).stage_end == pytest.approx(tuple(ends), rel=1e-12)


@pytest.mark.parametrize("schedule, dcs, pipelines, latency_s, iteration_s", [
    ("varuna", ["d1", "d1", "d2", "d2"], 2, 0.0, 4.920000000000001),
    ("atlas", ["d0", "d2"], 3, 0.1, 3.773333333546667),
])
def test_simultaneous_events_are_handled_first_come_first_served(schedule, dcs, pipelines,
                                                                 latency_s, iteration_s):
    """Jobs in which a GPU frees at the instant data reaches it: the dynamic schedules' choice
    then depends on which event is handled first. First scheduled, first handled gives these
    iteration times; handling every completion before every arrival gives others (5.1 s and
    3.607 s)."""
    S = len(dcs)
    job = GeoJob(stage_dc=tuple(dcs), fwd_s=(0.2,) * S, bwd_s=(0.4,) * S, recompute_s=(0.2,) * S,
                 act_bytes=1.0, grad_bytes=(1e9,) * S,
                 hop_bw=tuple(5.0 if dcs[i] != dcs[i + 1] else 50.0 for i in range(S - 1)),
                 hop_latency_s=tuple(latency_s if dcs[i] != dcs[i + 1] else 0.0
                                     for i in range(S - 1)),
                 pipelines=pipelines, microbatches=4)
    assert simulate(job, schedule).iteration_s == pytest.approx(iteration_s, rel=1e-12)


def _check_timeline(tl):
    job = tl.job
    S, M = job.stages, job.microbatches
    for p in range(job.pipelines):
        when = {}
        for s in range(S):
            ops = tl.busy[(p, s)]
            for a, b in zip(ops, ops[1:]):
                assert b.start >= a.end - 1e-9  # one thing at a time per GPU
            for op in ops:
                when[(op.kind, s, op.microbatch)] = op
            kinds = sorted(op.kind for op in ops)
            assert kinds.count("F") == M and kinds.count("B") == M
        for s in range(S):
            for m in range(M):
                f, b = when[("F", s, m)], when[("B", s, m)]
                assert b.start >= f.end - 1e-9
                if s > 0:  # activations crossed the boundary before the forward
                    lag = job.act_bytes / job.hop_bw[s - 1] + job.hop_latency_s[s - 1]
                    if tl.schedule != "atlas" or not job.is_wan(s - 1):
                        assert f.start >= when[("F", s - 1, m)].end + lag - 1e-9
                    else:  # shared by the cell: at least the cell's aggregate bandwidth
                        k = min(tl.cell, job.pipelines)
                        assert f.start >= when[("F", s - 1, m)].end + lag / k - 1e-9
                if s < S - 1:
                    assert b.start >= when[("B", s + 1, m)].end - 1e-9


@settings(max_examples=25, deadline=None)
@given(S=st.integers(2, 5), M=st.integers(1, 8), P=st.integers(1, 4),
       comm=st.floats(0.01, 1.0), schedule=st.sampled_from(SCHEDULES), rec=st.booleans(),
       cap=st.one_of(st.none(), st.integers(1, 4)))
def test_every_schedule_keeps_dependencies(S, M, P, comm, schedule, rec, cap):
    dcs = [f"d{min(i, 2)}" for i in range(S)]
    tl = simulate(_job(S=S, M=M, P=P, dcs=dcs, comm=comm, rec=rec), schedule, max_inflight=cap)
    _check_timeline(tl)
    assert 0 < tl.utilization() <= 1
    assert tl.iteration_s >= tl.pipeline_s


@settings(max_examples=40, deadline=None)
@given(f=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=5), M=st.integers(1, 8),
       P=st.integers(1, 4), comm=st.floats(0.001, 2.0), lat=st.floats(0.0, 0.1),
       rec=st.booleans(), cap=st.one_of(st.none(), st.integers(1, 4)), data=st.data())
def test_iteration_bounds_hold_for_every_schedule(f, M, P, comm, lat, rec, cap, data):
    S = len(f)
    b = data.draw(st.lists(st.floats(0.01, 2.0), min_size=S, max_size=S))
    dcs = [f"d{min(i, 2)}" for i in range(S)]
    job = GeoJob(stage_dc=tuple(dcs), fwd_s=tuple(f), bwd_s=tuple(b),
                 recompute_s=tuple(f) if rec else (0.0,) * S, act_bytes=1.0,
                 grad_bytes=(1e9,) * S,
                 hop_bw=tuple(1 / comm if dcs[i] != dcs[i + 1] else 100 / comm for i in range(S - 1)),
                 hop_latency_s=tuple(lat if dcs[i] != dcs[i + 1] else 0.0 for i in range(S - 1)),
                 pipelines=P, microbatches=M)
    lower, upper = iteration_bounds(job)
    for schedule in SCHEDULES:
        t = simulate(job, schedule, max_inflight=cap, cell=P).iteration_s
        assert t >= lower * (1 - 1e-9), schedule
        if schedule != "atlas":  # the only one that may hold ready work back
            assert t <= upper * (1 + 1e-9), schedule


def test_atlas_cell_never_overlaps_two_wan_sends():
    job = _job(M=8, comm=0.3)
    tl = simulate(job, "atlas", cell=3)
    # forwards of stage 0 end where their WAN sends start; sends of one cell take turns
    ends = sorted(op.end for p in range(3) for op in tl.busy[(p, 0)] if op.kind == "F")
    hold = job.act_bytes / (3 * job.hop_bw[0])
    spread = 2 / 3 * job.act_bytes / job.intra_bw
    assert all(b - a >= hold - 1e-9 for a, b in zip(ends, ends[1:])), (ends, hold, spread)


def test_atlas_beats_baselines_when_communication_dominates():
    job = _job(M=4, comm=0.3, lat=0.04)
    atlas = simulate(job, "atlas", cell=3).iteration_s
    for b in ("gpipe", "1f1b", "varuna"):
        assert simulate(job, b).iteration_s > 1.1 * atlas
    # and loses little when it does not
    cheap = _job(M=4, comm=0.001, lat=0.0)
    assert simulate(cheap, "atlas", cell=3).iteration_s <= 1.01 * simulate(cheap, "varuna").iteration_s


def test_memory_cap_bounds_in_flight_microbatches():
    job = _job(M=8, comm=0.05)
    tl = simulate(job, "varuna", max_inflight=2)
    for ops in tl.busy.values():
        live = 0
        for op in ops:
            live += op.kind == "F"
            live -= op.kind == "B"
            assert live <= 2


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="allowed: .*gpipe"):
        simulate(_job(), "zb")


def _alg1(fraction_tenths: int, C: int = 2):
    dcs = [("dc1", 600)] + ([("dc2", 60 * fraction_tenths)] if fraction_tenths else [])
    return best(algorithm1(dcs, C, 60, uniform_cell_latency(C, 60, 60, wan_latency_s=0.02),
                           ring_latency(1.0, 2.0)))


def test_algorithm1_reproduces_atlas_section_6_4():
    """600-GPU DC1 plus DC2 at 10%..100% of it, C = 2, 60 stages and microbatches: no gain at
    10% (DC1 alone), a plateau from 20% to 30%, and gains as DC2 grows (Atlas Fig. 12)."""
    alone = _alg1(0)
    assert (alone.cells, alone.partitions) == (5, (("dc1", 60),))
    thr = {f: _alg1(f).throughput / alone.throughput for f in (1, 2, 3, 10)}
    assert thr[1] == pytest.approx(1.0)
    assert _alg1(1).partitions == (("dc1", 60),)
    assert thr[2] > 1.05 and thr[3] == pytest.approx(thr[2])
    assert _alg1(2).partitions == (("dc1", 50), ("dc2", 10))
    assert thr[10] > thr[3] and _alg1(10).partitions == (("dc1", 30), ("dc2", 30))


def test_algorithm1_five_datacenters_of_600_is_fast():
    five = [(f"dc{i}", 600) for i in range(5)]
    b2, elapsed = cpu_s(lambda: best(algorithm1(five, 2, 60, uniform_cell_latency(2, 60, 60),
                                                ring_latency(1.0, 2.0))))
    assert b2.cells == 25 and b2.partitions == tuple((f"dc{i}", 12) for i in range(5))
    assert elapsed < 10.0  # CPU s; about 2 s alone on one core; BENCHMARKS.md has the timing


def test_algorithm1_infeasible_when_stages_do_not_fit():
    ch = algorithm1([("a", 10)], 2, 60, uniform_cell_latency(2, 60, 4), ring_latency(1.0, 2.0))
    assert ch == [] and best(ch) is None
    ch = algorithm1([("a", 130)], 2, 60, uniform_cell_latency(2, 60, 4), ring_latency(1.0, 2.0),
                    d_max=2)
    assert [c.feasible for c in ch] == [True, False]
