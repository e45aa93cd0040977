"""Availability traces: the three file formats, their errors, and the synthetic generators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.elastic.traces import (
    DEFAULT_LAST_S,
    SYNTHETIC_KINDS,
    State,
    Trace,
    over_pool,
    synthetic,
)
from shoal.errors import SpecError
from shoal.io.traces import load_trace
from shoal.problem import Problem, build_problem
from shoal.specs.scenario import parse_scenario

A, B = "us-central1-a", "us-central1-b"
A100, V100 = "A100-40GB", "V100-16GB"


def _problem(zones: dict[str, dict[str, int]]) -> Problem:
    return build_problem(parse_scenario({
        "model": "OPT-350M",
        "job": {"global_batch": 16, "seq_len": 2048},
        "pool": {"regions": {"us-central1": {"zones": {z: {"gpus": g} for z, g in zones.items()}}}},
        "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps"},
                                 "same_region": {"bandwidth": "25Gbps", "latency": "1ms"}}},
    }))


@pytest.fixture(scope="module")
def problem() -> Problem:
    """A100s in both zones, V100s in zone a only."""
    return _problem({A: {A100: 8, V100: 8}, B: {A100: 8}})


@pytest.fixture(scope="module")
def full() -> Problem:
    """Both GPU types in both zones, as Sailor's two-zone traces have."""
    return _problem({A: {A100: 128, V100: 384}, B: {A100: 128, V100: 128}})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _spec_error(path: Path, problem: Problem, **kw) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_trace(path, problem, **kw)
    return info.value


# ------------------------------------------------------------------------------- Sailor CSV


SAILOR = """,Timestamp,A100-40_us-central1-a,V100-16_us-central1-a
0,1000.0,8,8
1,1100.0,4,8
2,1300.0,4,8
3,1400.0,0,2
"""


def test_sailor_csv_states_relative_merged_and_ended_by_median_gap(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "t.csv", SAILOR), problem)
    assert [s.time_s for s in tr.states] == [0.0, 100.0, 400.0]  # the repeated row is merged
    assert tr.states[0].avail == {(A100, A): 8, (V100, A): 8, (A100, B): 0}  # no column: none
    assert tr.states[2].avail == {(A100, A): 0, (V100, A): 2, (A100, B): 0}
    assert all(s.notice_s == 0.0 for s in tr.states)
    assert tr.end_s == 500.0  # gaps 100, 200, 100
    assert tr.durations() == [100.0, 300.0, 100.0]
    assert tr.source == str(tmp_path / "t.csv")


def test_sailor_csv_single_row_lasts_the_default(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "t.csv", SAILOR.splitlines(keepends=True)[0] + "0,5.0,8,8\n"),
                    problem)
    assert [s.time_s for s in tr.states] == [0.0]
    assert tr.end_s == DEFAULT_LAST_S


def test_sailor_csv_accepts_whole_floats(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "t.csv", SAILOR.replace(",8,8\n", ",8.0,8\n")), problem)
    assert tr.states[0].avail[(A100, A)] == 8


def test_to_json(tmp_path, problem):
    doc = load_trace(_write(tmp_path, "t.csv", SAILOR), problem).to_json()
    assert doc["end_s"] == 500.0
    assert doc["states"][1] == {"time_s": 100.0, "notice_s": 0.0, "avail": {
        "A100-40GB@us-central1-a": 4, "V100-16GB@us-central1-a": 8, "A100-40GB@us-central1-b": 0}}
    json.dumps(doc)


@pytest.mark.parametrize("text, where, words", [
    (SAILOR.replace("1300.0", "1050.0"), "line 4", "increase"),
    (SAILOR.replace("1300.0", "1100.0"), "line 4", "increase"),
    # epoch seconds that differ below the microsecond the states keep
    (SAILOR.replace("1100.0", "1000.0000004"), "line 3", "to the microsecond"),
    (SAILOR.replace("1,1100.0,4,8", "1,1100.0,-4,8"), "line 3, column A100-40_us-central1-a",
     "negative"),
    (SAILOR.replace("1,1100.0,4,8", "1,1100.0,4,7.5"), "line 3, column V100-16_us-central1-a",
     "whole number"),
    (SAILOR.replace("1,1100.0,4,8", "1,1100.0,4,lots"), "line 3", "whole number"),
    (SAILOR.replace("1,1100.0", "1,soon"), "line 3, column Timestamp", "seconds"),
    (SAILOR.replace("3,1400.0,0,2", "3,1400.0,0"), "line 5", "expected 4 values"),
    (SAILOR.replace("A100-40_", "A100-4O_"), "line 1, column A100-4O_us-central1-a",
     "did you mean 'A100-40GB'"),
    (SAILOR.replace("V100-16_us-central1-a", "V100-16_us-central1-b"), "line 1",
     "no V100-16GB in zone us-central1-b"),
    (SAILOR.replace("V100-16_us-central1-a", "V100-16_us-central1-aa"), "line 1",
     "did you mean 'us-central1-a'"),
    (SAILOR.replace("V100-16_us-central1-a", "A100-40_us-central1-a"), "line 1", "same GPU"),
    (SAILOR.splitlines(keepends=True)[0], "line 1", "no rows"),
    (",Timestamp\n0,1000.0\n", "line 1", "no <GPU>_<zone> columns"),
    ("\n\n", "line 1", "empty"),
    ("hello,world\n1,2\n", "line 1", "not an availability trace"),
])
def test_sailor_csv_errors_name_the_line(tmp_path, problem, text, where, words):
    err = _spec_error(_write(tmp_path, "t.csv", text), problem)
    assert f": {where}" in str(err) and words in str(err)
    assert err.file == str(tmp_path / "t.csv")


def test_pair_missing_from_pool_lists_the_pool(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "t.csv", SAILOR.replace("V100-16_us-central1-a",
                                                               "V100-16_us-west1-b")), problem)
    assert "A100-40GB@us-central1-a, V100-16GB@us-central1-a, A100-40GB@us-central1-b" in str(err)


def test_missing_file(tmp_path, problem):
    err = _spec_error(tmp_path / "nope.csv", problem)
    assert "not found" in str(err) and err.file == str(tmp_path / "nope.csv")


# -------------------------------------------------------------------------- controller JSON


CONTROLLER = """[
    {"Time": 10, "GPUs": 4},
    {"Time": 70, "GPUs": 4},
    {"Time": 130,
     "GPUs": 2},
    {"Time": 250, "GPUs": 3}
]
"""


def test_controller_json_counts_one_pair_and_keeps_the_rest(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "c.json", CONTROLLER), problem, zone=B)
    assert [s.time_s for s in tr.states] == [0.0, 120.0, 240.0]
    assert [s.avail[(A100, B)] for s in tr.states] == [4, 2, 3]
    assert all(s.avail[(A100, A)] == 8 and s.avail[(V100, A)] == 8 for s in tr.states)
    assert tr.end_s == 300.0  # gaps 60, 60, 120


def test_controller_json_zone_defaults_to_the_only_one(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "c.json", CONTROLLER), problem, gpu="V100-16")
    assert [s.avail[(V100, A)] for s in tr.states] == [4, 2, 3]
    assert all(s.avail[(A100, B)] == 8 for s in tr.states)


def test_controller_json_needs_a_zone_when_several_hold_the_gpu(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "c.json", CONTROLLER), problem)
    assert err.field == "--trace-zone" and err.allowed == f"{A}, {B}"


def test_controller_json_zone_must_hold_the_gpu(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "c.json", CONTROLLER), problem, gpu="V100-16GB", zone=B)
    assert err.field == "--trace-zone" and err.allowed == A


def test_controller_json_gpu_not_in_pool(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "c.json", CONTROLLER), problem, gpu="H100")
    assert err.field == "--trace-gpu" and "A100-40GB, V100-16GB" in str(err)
    # with a zone given, the GPU type is still what is wrong
    err = _spec_error(_write(tmp_path, "c.json", CONTROLLER), problem, gpu="H100", zone=A)
    assert err.field == "--trace-gpu" and "A100-40GB, V100-16GB" in str(err)


@pytest.mark.parametrize("old, new, where, words", [
    ('"Time": 70', '"Time": 10', "line 3, key Time", "increase"),
    ('"Time": 250', '"Time": 100', "line 6, key Time", "increase"),
    ('"GPUs": 2', '"GPUs": -2', "line 4, key GPUs", "negative"),
    ('"GPUs": 2', '"GPUs": 2.5', "line 4, key GPUs", "whole number"),
    ('"GPUs": 2', '"GPUs": "two"', "line 4, key GPUs", "JSON number"),
    ('"GPUs": 2', '"GPUs": "2"', "line 4, key GPUs", "JSON number"),
    ('"Time": 130', '"Time": "130"', "line 4, key Time", "JSON number"),
    ('"GPUs": 2', '"GPUs": true', "line 4, key GPUs", "JSON number"),
    ('"GPUs": 2}', '"GPUs": 2, "Zone": "a"}', "line 4, key Zone", "unknown key"),
    ('"GPUs": 3}', '"GPUs": 3, "GPU": 1}', "line 6, key GPU", "did you mean 'GPUs'"),
    ('"GPUs": 3}', '"GPU": 3}', "line 6, key GPU", "did you mean 'GPUs'"),
    ('"Time": 250, "GPUs": 3}', '"Time": 250}', "line 6", "Time and GPUs"),
    ('"GPUs": 3}', '"GPUs": 3', "line 7", "malformed JSON"),
])
def test_controller_json_errors_name_the_line(tmp_path, problem, old, new, where, words):
    err = _spec_error(_write(tmp_path, "c.json", CONTROLLER.replace(old, new)), problem, zone=A)
    assert f": {where}:" in str(err) and words in str(err)


def test_controller_json_empty_list(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "c.json", "\n[ ]\n"), problem, zone=A)
    assert ": line 2:" in str(err) and "no entries" in str(err)


def test_gpu_and_zone_only_for_controller_traces(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "t.csv", SAILOR), problem, zone=A)
    assert err.field == "--trace-zone"


# ----------------------------------------------------------------------------- native events


EVENTS = """time_s,gpu,zone,count,notice_s
0,A100-40GB,us-central1-b,2,
600,A100,us-central1-a,0,30
600,V100-16GB,us-central1-a,4,10
900,A100-40GB,us-central1-a,8,
"""


def test_native_csv_events(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "e.csv", EVENTS), problem)
    assert tr.states == (
        State(0.0, {(A100, A): 8, (V100, A): 8, (A100, B): 2}),  # a time-0 event replaces the pool
        State(600.0, {(A100, A): 0, (V100, A): 4, (A100, B): 2}, notice_s=10.0),  # the shorter
        State(900.0, {(A100, A): 8, (V100, A): 4, (A100, B): 2}),
    )
    assert tr.end_s == 1350.0  # distinct times 0, 600, 900: median of 600 and 300


def test_native_csv_without_notice_and_no_op_events(tmp_path, problem):
    text = "time_s,gpu,zone,count\n300,A100-40GB,us-central1-a,8\n400,A100-40GB,us-central1-a,6\n"
    tr = load_trace(_write(tmp_path, "e.csv", text), problem)
    assert [s.time_s for s in tr.states] == [0.0, 400.0]  # 300 keeps the pool's count
    assert tr.states[1].avail[(A100, A)] == 6
    assert tr.end_s == 600.0  # times 0 (the pool), 300, 400: median of 300 and 100


@pytest.mark.parametrize("old, new, where, words", [
    ("900,", "500,", "line 5, column time_s", "must not decrease"),
    ("0,A100-40GB", "-5,A100-40GB", "line 2, column time_s", "before the start"),
    ("us-central1-b,2", "us-central1-c,2", "line 2, column zone", "did you mean 'us-central1-b'"),
    ("V100-16GB,us-central1-a", "V100-16GB,us-central1-b", "line 4, column zone",
     "pairs in the pool"),
    ("A100,us", "A100-4O,us", "line 3, column gpu", "did you mean 'A100-40GB'"),
    ("A100,us", "A100-80GB,us", "line 3, column gpu", "did you mean 'A100-40GB'"),
    ("us-central1-a,4,10", "us-central1-a,four,10", "line 4, column count", "whole number"),
    ("us-central1-a,4,10", "us-central1-a,-4,10", "line 4, column count", "negative"),
    ("us-central1-a,0,30", "us-central1-a,0,-30", "line 3, column notice_s", "negative notice"),
    (",notice_s", ",notise_s", "line 1, column notise_s", "did you mean 'notice_s'"),
    ("us-central1-a,8,\n", "us-central1-a\n", "line 5", "expected 5 values"),
])
def test_native_csv_errors_name_the_line(tmp_path, problem, old, new, where, words):
    err = _spec_error(_write(tmp_path, "e.csv", EVENTS.replace(old, new)), problem)
    assert f": {where}:" in str(err) and words in str(err)


def test_native_csv_columns_in_any_order(tmp_path, problem):
    lines = EVENTS.splitlines()
    order = [4, 2, 0, 3, 1]  # notice_s, zone, time_s, count, gpu
    moved = "\n".join(",".join(row.split(",")[i] for i in order) for row in lines) + "\n"
    assert moved.startswith("notice_s,zone,time_s,count,gpu\n")
    want = load_trace(_write(tmp_path, "a.csv", EVENTS), problem)
    got = load_trace(_write(tmp_path, "b.csv", moved), problem)
    assert got.states == want.states and got.end_s == want.end_s


@pytest.mark.parametrize("header, where, words", [
    ("time_s,gpu,count", "line 1", "missing column zone"),
    ("time_s,gpu,zone", "line 1", "missing column count"),
    ("gpu,zone,count", "line 1", "missing column time_s"),
    ("time_s,gpu", "line 1", "missing columns zone, count"),
    ("tme_s,gpu,zone,count", "line 1, column tme_s", "did you mean 'time_s'"),
    ("time_s,gpu,zone,count,zone", "line 1, column zone", "column given twice"),
])
def test_native_csv_header_errors(tmp_path, problem, header, where, words):
    text = header + "\n" + ",".join("0" for _ in header.split(",")) + "\n"
    err = _spec_error(_write(tmp_path, "h.csv", text), problem)
    assert f": {where}:" in str(err) and words in str(err), str(err)


def test_native_csv_header_only(tmp_path, problem):
    err = _spec_error(_write(tmp_path, "e.csv", "time_s,gpu,zone,count\n"), problem)
    assert ": line 1:" in str(err) and "no events" in str(err)


DOC = {"schema": "shoal/trace@1", "end_s": 2000, "events": [
    {"time_s": 100, "gpu": "A100-40GB", "zone": A, "count": 0, "notice_s": 30},
    {"time_s": 100, "gpu": "V100-16GB", "zone": A, "count": 2, "notice_s": 45},
    {"time_s": 700, "gpu": "A100-40GB", "zone": A, "count": 8},
]}


def test_native_yaml_and_json_documents(tmp_path, problem):
    import yaml

    want = (
        State(0.0, {(A100, A): 8, (V100, A): 8, (A100, B): 8}),
        State(100.0, {(A100, A): 0, (V100, A): 2, (A100, B): 8}, notice_s=30.0),
        State(700.0, {(A100, A): 8, (V100, A): 2, (A100, B): 8}),
    )
    for path in (_write(tmp_path, "e.yaml", yaml.safe_dump(DOC)),
                 _write(tmp_path, "e.json", json.dumps(DOC))):
        tr = load_trace(path, problem)
        assert tr.states == want and tr.end_s == 2000.0
    no_end = {k: v for k, v in DOC.items() if k != "end_s"}
    # times 0 (the pool), 100, 700: the last state lasts the median of 100 and 600
    assert load_trace(_write(tmp_path, "f.json", json.dumps(no_end)), problem).end_s == 1050.0


def test_a_document_without_events_keeps_the_scenarios_pool(tmp_path, problem):
    tr = load_trace(_write(tmp_path, "e.json", json.dumps(
        {"schema": "shoal/trace@1", "end_s": 5400, "events": []})), problem)
    assert tr.states == (State(0.0, {(A100, A): 8, (V100, A): 8, (A100, B): 8}),)
    assert tr.end_s == 5400.0


@pytest.mark.parametrize("change, field, words", [
    (lambda d: d["events"][1].update(count=-1), "events[1].count", "negative"),
    (lambda d: d["events"][2].update(time_s=50), "events[2].time_s", "must not decrease"),
    (lambda d: d["events"][0].update(zone="us-east1-b"), "events[0].zone", "not in the scenario"),
    (lambda d: d["events"][0].update(cuont=1), "events[0].cuont", "did you mean 'count'"),
    (lambda d: d["events"][0].pop("gpu"), "events[0].gpu", "missing"),
    (lambda d: d.update(end_s=700), "end_s", "after its last event"),
    (lambda d: d.update(events={}), "events", "a list of events"),
    (lambda d: d.update(schema="shoal/plan@1"), "schema", "not a shoal trace"),
])
def test_native_document_errors_name_the_field(tmp_path, problem, change, field, words):
    doc = json.loads(json.dumps(DOC))
    change(doc)
    err = _spec_error(_write(tmp_path, "e.json", json.dumps(doc)), problem)
    assert err.field == field and words in str(err) and err.file == str(tmp_path / "e.json")


# -------------------------------------------------------------------------- Sailor's own files


@pytest.mark.reference
def test_sailor_reference_traces_parse(reference_dir, full):
    traces = reference_dir / "sailor" / "traces"
    tr = load_trace(traces / "gpu_trace_heterogeneous_imbalanced.csv", full)
    assert [s.avail[(A100, A)] for s in tr.states] == [32, 80, 128]
    assert [s.avail[(V100, A)] for s in tr.states] == [96, 240, 384]
    assert tr.states[0].avail[(A100, B)] == 0
    assert tr.durations()[0] == pytest.approx(123.17371)
    assert load_trace(traces / "gpu_trace_2zones_2gpus.csv", full).end_s == DEFAULT_LAST_S
    static = load_trace(traces / "static_trace.json", full, zone=A)
    assert len(static.states) == 1 and static.states[0].avail[(A100, A)] == 8
    walk = load_trace(traces / "a100_trace.json", full, zone=B)
    assert walk.states[0].avail[(A100, B)] == 4 and len(walk.states) > 1
    assert all(s.avail[(A100, A)] == 128 for s in walk.states)


# ------------------------------------------------------------------------------------ synthetic


def _check_bounds(tr: Trace, problem: Problem) -> None:
    assert tr.states[0] == State(0.0, problem.avail)
    times = [s.time_s for s in tr.states]
    assert times == sorted(set(times)) and times[-1] < tr.end_s
    for before, s in zip(tr.states, tr.states[1:]):
        assert (s.avail, s.notice_s) != (before.avail, before.notice_s)
    for s in tr.states:
        assert list(s.avail) == list(problem.avail)
        assert all(0 <= n <= problem.avail[k] for k, n in s.avail.items())


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(SYNTHETIC_KINDS), seed=st.integers(0, 2**32 - 1),
       hours=st.floats(0.01, 24))
def test_synthetic_stays_within_capacity(full, kind, seed, hours):
    _check_bounds(synthetic(full, kind, seed=seed, duration_s=hours * 3600), full)


@pytest.mark.parametrize("kind", SYNTHETIC_KINDS)
def test_synthetic_is_deterministic_by_seed(problem, kind):
    a = synthetic(problem, kind, seed=7, duration_s=48 * 3600)
    assert a == synthetic(problem, kind, seed=7, duration_s=48 * 3600)
    assert a != synthetic(problem, kind, seed=8, duration_s=48 * 3600)
    assert a.source == f"synthetic:{kind}:seed=7" and a.end_s == 48 * 3600
    assert len(a.states) > 1


def test_spot_losses_carry_the_notice(full):
    tr = synthetic(full, "spot", seed=3)
    losses = 0
    for before, s in zip(tr.states, tr.states[1:]):
        if any(s.avail[k] < before.avail[k] for k in s.avail):
            losses += 1
            assert s.notice_s == 30.0
        else:
            assert s.notice_s in (0.0, 30.0)
    assert losses > 3
    assert any(s.notice_s == 0.0 for s in tr.states[1:])  # returns come without notice


def test_outage_takes_a_whole_zone_to_zero_then_back(full):
    tr = synthetic(full, "outage", seed=1, duration_s=24 * 3600, mean_gap_s=3600)
    down = [s for s in tr.states[1:] if any(n == 0 for n in s.avail.values())]
    assert down
    for s in down:
        dark = {z for (_, z), n in s.avail.items() if n == 0}
        assert len(dark) == 1
        zone = dark.pop()
        assert all(n == 0 for (_, z), n in s.avail.items() if z == zone)
        assert all(n == full.avail[(g, z)] for (g, z), n in s.avail.items() if z != zone)
    assert any(s.avail == full.avail for s in tr.states[1:])  # it came back


def test_synthetic_rejects_unknown_kind_and_parameters(problem):
    with pytest.raises(SpecError) as info:
        synthetic(problem, "spto", seed=0)
    assert info.value.field == "--synthetic" and info.value.suggestion == "spot"
    assert info.value.allowed == "spot, scarcity, outage"
    with pytest.raises(SpecError, match="mean_gap_s"):
        synthetic(problem, "spot", seed=0, mean_gap=10)
    with pytest.raises(SpecError, match="more than 0"):
        synthetic(problem, "outage", seed=0, mean_outage_s=0)


def test_a_notice_is_for_the_gpus_that_leave(tmp_path, problem):
    """A notice on a row that takes nothing away gives none to the GPUs leaving at that time,
    and of two losses at once the shorter notice holds; a row that changes nothing is no new
    state, with a notice or without."""
    lose = "time_s,gpu,zone,count,notice_s\n1800,A100-40GB,us-central1-a,4,0\n"
    tr = load_trace(_write(tmp_path, "a.csv", lose + "1800,V100-16GB,us-central1-a,8,3600\n"),
                    problem)
    assert [(s.time_s, s.notice_s) for s in tr.states] == [(0.0, 0.0), (1800.0, 0.0)]
    both = lose.replace(",4,0", ",4,60") + "1800,V100-16GB,us-central1-a,2,3600\n"
    assert load_trace(_write(tmp_path, "b.csv", both), problem).states[1].notice_s == 60.0
    same = "time_s,gpu,zone,count,notice_s\n1800,V100-16GB,us-central1-a,8,30\n"
    assert [s.time_s for s in load_trace(_write(tmp_path, "c.csv", same), problem).states] == [0.0]


def test_files_saved_with_a_byte_order_mark_are_read(tmp_path, problem):
    """Spreadsheets save CSV with a UTF-8 byte order mark: it is not part of the header."""
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + EVENTS.encode())
    assert load_trace(path, problem).states == load_trace(_write(tmp_path, "e.csv", EVENTS),
                                                          problem).states


# ------------------------------------------------------------------------- larger than the pool


def test_over_pool_names_each_pair_the_trace_exceeds(tmp_path, problem):
    """Sailor's trace of 400 A100s where the pool has 8: the pair, both numbers and the time
    it is first reached; pairs within the pool are not named."""
    sailor = (",Timestamp,A100-40_us-central1-a,V100-16_us-central1-a\n"
              "0,1000.0,8,8\n1,1100.0,400,8\n2,1200.0,200,9\n3,1300.0,400,2\n")
    tr = load_trace(_write(tmp_path, "big.csv", sailor), problem)
    found = over_pool(problem, tr)
    assert [(o.gpu, o.zone, o.trace_count, o.pool_count, o.time_s) for o in found] == [
        (A100, A, 400, 8, 100.0), (V100, A, 9, 8, 200.0)]
    msg = found[0].message()
    assert "400 A100-40GB in us-central1-a" in msg and "pool has 8" in msg
    assert "trace's 400" in msg and "quotas" not in msg
    assert over_pool(problem, load_trace(_write(tmp_path, "t.csv", SAILOR), problem)) == []


def test_over_pool_mentions_a_quota_that_still_caps(problem):
    from dataclasses import replace

    capped = replace(problem, quotas={A100: 12})
    tr = Trace((State(0.0, {(A100, A): 20, (V100, A): 8, (A100, B): 8}),), 3600.0, "t")
    (o,) = over_pool(capped, tr)
    assert "pool.quotas still caps A100-40GB at 12" in o.message()
