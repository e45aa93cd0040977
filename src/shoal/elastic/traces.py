"""Availability traces: at each moment, how many GPUs of each type each zone of the pool has.

A trace is what a replay follows: every state is a pool that can be planned on its own, so every
state covers exactly the (GPU type, zone) pairs of the scenario's pool. Traces come from three
kinds of file (``load_trace``) or are generated from a seed (``synthetic``). A bad file is
reported with its path and the line (or, for YAML and JSON documents, the field) at fault.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal import catalog
from shoal.errors import SpecError, close_match
from shoal.files import read_document, read_text
from shoal.problem import Problem

Pair = tuple[str, str]  # (canonical GPU name, zone)

# How long the last state lasts when the file cannot tell: a trace of a single row (or of events at
# a single time) gives no gap to go by, and an hour is long enough for any plan to pay back a move.
DEFAULT_LAST_S = 3600.0

SYNTHETIC_KINDS = ("spot", "scarcity", "outage")
NATIVE_SCHEMA = "shoal/trace@1"
NATIVE_HEADER = ("time_s", "gpu", "zone", "count")
CONTROLLER_GPU = "A100-40GB"  # Sailor's controller traces count A100s

_FORMATS = ("a Sailor availability CSV (header ',Timestamp,<GPU>_<zone>,...'), a Sailor controller "
            "JSON list ([{\"Time\": s, \"GPUs\": n}, ...]), shoal events as CSV (header "
            "'time_s,gpu,zone,count[,notice_s]', in any order) or as YAML/JSON with schema: " + NATIVE_SCHEMA)
_COUNTS = "a whole number of GPUs, 0 or more"
_CONTROLLER_KEYS = ("Time", "GPUs")  # a controller trace entry's keys
_EVENT_KEYS = ("time_s", "gpu", "zone", "count", "notice_s")

# Defaults of the synthetic generators; each can be overridden by name through ``synthetic``.
_SYNTHETIC_PARAMS: dict[str, dict[str, float]] = {
    # GCP spot VMs: preemptions with 30 s of warning; capacity comes back after a while.
    "spot": {"mean_gap_s": 1800.0, "mean_return_s": 2700.0, "notice_s": 30.0},
    # On-demand scarcity as in Sailor's Fig. 2: the count drifts by a few nodes at a time.
    "scarcity": {"mean_step_s": 1200.0, "max_step_nodes": 3},
    # A zone losing every GPU type at once, then getting them back.
    "outage": {"mean_gap_s": 3 * 3600.0, "mean_outage_s": 2400.0},
}


@dataclass(frozen=True)
class State:
    """The pool from ``time_s`` until the next state starts.

    ``notice_s`` is the warning given before the GPUs that leave at this moment go (a spot
    preemption notice): time in which the old plan can still save a checkpoint.
    """

    time_s: float
    avail: dict[Pair, int]  # every pair of the scenario's pool, in the pool's order
    notice_s: float = 0.0


@dataclass(frozen=True)
class Trace:
    """States sorted by time, strictly increasing, each differing from the one before."""

    states: tuple[State, ...]
    end_s: float  # when the last state ends
    source: str  # file path or "synthetic:<kind>:seed=<n>"

    def durations(self) -> list[float]:
        ends = [s.time_s for s in self.states[1:]] + [self.end_s]
        return [end - s.time_s for s, end in zip(self.states, ends)]

    def to_json(self) -> dict:
        return {"source": self.source, "end_s": self.end_s, "states": [
            {"time_s": s.time_s, "notice_s": s.notice_s,
             "avail": {f"{g}@{z}": n for (g, z), n in s.avail.items()}}
            for s in self.states]}


@dataclass(frozen=True)
class _Event:
    """From ``time_s`` on, ``pair`` has ``count`` GPUs; ``at`` locates it in its file."""

    time_s: float
    pair: Pair
    count: int
    notice_s: float = 0.0
    at: str = ""


# ------------------------------------------------------------------------------------------ reading


def load_trace(path: str | Path, problem: Problem, *, gpu: str | None = None,
               zone: str | None = None) -> Trace:
    """Read an availability trace, whichever of the known formats it is in.

    ``gpu`` and ``zone`` say which pair of the pool a Sailor controller trace counts (it names
    neither); the other formats name their own and reject them.
    """
    p = Path(path)
    file = str(p)
    text = _read_text(p)
    if text.lstrip().startswith("["):
        return _controller_json(text, file, problem, gpu, zone)
    if gpu is not None or zone is not None:
        raise SpecError("only a Sailor controller trace (a JSON list) takes a GPU type and zone; "
                        "this trace names its own", file=file,
                        field="--trace-gpu" if gpu is not None else "--trace-zone",
                        value=gpu if gpu is not None else zone)
    line, first = next((i, row) for i, row in enumerate(text.splitlines(), 1) if row.strip())
    names = [c.strip() for c in first.split(",")]
    if len(set(names) & set(NATIVE_HEADER)) >= 2:  # shoal events, columns in any order
        return _native_csv(_csv_rows(text, file), file, problem)
    if "timestamp" in (n.lower() for n in names):
        return _sailor_csv(_csv_rows(text, file), file, problem)
    if p.suffix.lower() in (".json", ".yaml", ".yml") or text.lstrip().startswith("{"):
        return _native_document(read_document(p), file, problem)
    raise SpecError("not an availability trace", file=file, field=f"line {line}",
                    value=",".join(names), allowed=_FORMATS)


def _read_text(p: Path) -> str:
    text = read_text(p, "trace", _FORMATS)
    if not text.strip():
        raise SpecError("empty trace: no rows", file=str(p), field="line 1", allowed=_FORMATS)
    return text


def _csv_rows(text: str, file: str) -> list[tuple[int, list[str]]]:
    """Non-blank CSV rows with their 1-based line numbers."""
    reader = csv.reader(io.StringIO(text))
    try:
        return [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except csv.Error as exc:
        raise SpecError(f"malformed CSV: {exc}", file=file,
                        field=f"line {reader.line_num}") from None


def _sailor_csv(rows: list[tuple[int, list[str]]], file: str, problem: Problem) -> Trace:
    """Sailor's availability CSV: absolute timestamps, one column per GPU type and zone.

    The trace defines availability: pool pairs without a column have no GPUs.
    """
    (hline, header), body = rows[0], rows[1:]
    header = [c.strip() for c in header]
    t_col = [n.lower() for n in header].index("timestamp")
    columns = _sailor_columns(header, t_col, hline, file, problem)
    if not body:
        raise SpecError("no rows after the header", file=file, field=f"line {hline}")
    times: list[float] = []
    avails: list[dict[Pair, int]] = []
    for line, row in body:
        if len(row) != len(header):
            raise SpecError(f"expected {len(header)} values, as many as the header has",
                            file=file, field=f"line {line}", value=len(row))
        where = f"line {line}, column {header[t_col]}"
        t = _seconds(row[t_col], file, where)
        # to the microsecond, as the states keep them (below)
        if times and round(t - times[0], 6) <= round(times[-1] - times[0], 6):
            raise SpecError("timestamps must increase from row to row (to the microsecond)",
                            file=file, field=where, value=row[t_col].strip(),
                            allowed=f"a time at least 1 us after {times[-1]!r}")
        avail = dict.fromkeys(problem.avail, 0)
        for i, pair in columns:
            avail[pair] = _count(row[i], file, f"line {line}, column {header[i]}")
        times.append(t)
        avails.append(avail)
    # Epoch seconds differ in their last bits; microseconds are all a trace can mean.
    rel = [round(t - times[0], 6) for t in times]
    states = [State(t, a) for t, a in zip(rel, avails)]
    return Trace(_merged(states), rel[-1] + _last_gap(rel), file)


def _sailor_columns(header: list[str], t_col: int, line: int, file: str,
                    problem: Problem) -> list[tuple[int, Pair]]:
    """(column index, pool pair) of every ``<GPU>_<zone>`` column."""
    out: list[tuple[int, Pair]] = []
    seen: dict[Pair, str] = {}
    for i, name in enumerate(header):
        if i == t_col or (i == 0 and not name):  # the timestamp, and pandas' unnamed index
            continue
        where = f"line {line}, column {name}"
        if "_" not in name:
            raise SpecError("column is not <GPU>_<zone>", file=file, field=where, value=name,
                            allowed="Timestamp and columns such as A100-40_us-central1-a")
        gpu_name, zone = name.split("_", 1)
        pair = _pool_pair(problem, _gpu(gpu_name, file, where), zone, file, where)
        if pair in seen:
            raise SpecError(f"same GPU type and zone as column {seen[pair]}", file=file,
                            field=where, value=name)
        seen[pair] = name
        out.append((i, pair))
    if not out:
        raise SpecError("no <GPU>_<zone> columns", file=file, field=f"line {line}",
                        allowed="Timestamp and columns such as A100-40_us-central1-a")
    return out


def _controller_json(text: str, file: str, problem: Problem, gpu: str | None,
                     zone: str | None) -> Trace:
    """Sailor's controller trace: how many GPUs of one type in one zone, over time.

    Times are made relative to the first entry; the pool's other pairs keep the scenario's counts.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"malformed JSON at column {exc.colno}: {exc.msg}", file=file,
                        field=f"line {exc.lineno}") from None
    if not data:
        raise SpecError("no entries", file=file, field=f"line {_line_of(text, text.index('['))}",
                        allowed='a list of {"Time": seconds, "GPUs": count}')
    lines = _element_lines(text)
    pair = _controller_pair(problem, gpu, zone, file)
    times: list[float] = []
    states: list[State] = []
    for item, line in zip(data, lines):
        where = f"line {line}"
        if isinstance(item, dict):  # a misspelt key first, with its close match
            _known_keys(item, _CONTROLLER_KEYS, file, lambda key, w=where: f"{w}, key {key}")
        if not isinstance(item, dict) or "Time" not in item or "GPUs" not in item:
            raise SpecError("expected an entry with Time and GPUs", file=file, field=where,
                            value=item, allowed='{"Time": seconds, "GPUs": count}')
        for key in _CONTROLLER_KEYS:
            if not isinstance(item[key], int | float) or isinstance(item[key], bool):
                raise SpecError("expected a JSON number", file=file, field=f"{where}, key {key}",
                                value=item[key], allowed="seconds" if key == "Time" else _COUNTS)
        t = _seconds(item["Time"], file, f"{where}, key Time")
        if times and t <= times[-1]:
            raise SpecError("times must increase from entry to entry", file=file,
                            field=f"{where}, key Time", value=item["Time"],
                            allowed=f"a time after {times[-1]!r}")
        avail = dict(problem.avail)
        avail[pair] = _count(item["GPUs"], file, f"{where}, key GPUs")
        times.append(t)
        states.append(State(t - times[0], avail))
    rel = [t - times[0] for t in times]
    return Trace(_merged(states), rel[-1] + _last_gap(rel), file)


def _controller_pair(problem: Problem, gpu: str | None, zone: str | None, file: str) -> Pair:
    """The pool pair a controller trace counts: given, or the only zone holding the GPU type."""
    g = catalog.gpus().canonical(gpu or CONTROLLER_GPU, field="--trace-gpu")
    zones = sorted(z for gg, z in problem.avail if gg == g)
    if zone is not None:
        if not zones:  # the GPU type is what is wrong
            raise SpecError(f"the scenario's pool has no {g} in any zone", file=file,
                            field="--trace-gpu", value=g,
                            allowed=f"GPU types in zone {zone}: " + ", ".join(
                                sorted(gg for gg, z in problem.avail if z == zone))
                            if zone in problem.zones else f"pairs in the pool: {_pairs(problem)}")
        if (g, zone) not in problem.avail:
            raise SpecError(f"the scenario's pool has no {g} in this zone", file=file,
                            field="--trace-zone", value=zone,
                            allowed=", ".join(zones) or f"pairs in the pool: {_pairs(problem)}",
                            suggestion=close_match(zone, zones or problem.zones))
        return (g, zone)
    if len(zones) == 1:
        return (g, zones[0])
    if not zones:
        raise SpecError(f"the scenario's pool has no {g} for this controller trace to count",
                        file=file, field="--trace-gpu", value=g,
                        allowed="GPU types in the pool: " + ", ".join(sorted(problem.gpus)))
    raise SpecError(f"the scenario's pool has {g} in several zones: say which one this trace "
                    "counts", file=file, field="--trace-zone", allowed=", ".join(zones))


_SPACE = re.compile(r"\s*")


def _element_lines(text: str) -> list[int]:
    """1-based line on which each element of a top-level JSON list starts.

    Only called on text that parsed, so the walk cannot fail.
    """
    decoder = json.JSONDecoder()
    i = _SPACE.match(text, text.index("[") + 1).end()
    lines: list[int] = []
    line, seen = 1, 0
    while text[i] != "]":
        line += text.count("\n", seen, i)
        seen = i
        lines.append(line)
        _, i = decoder.raw_decode(text, i)
        i = _SPACE.match(text, i).end()
        if text[i] == ",":
            i = _SPACE.match(text, i + 1).end()
    return lines


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _native_csv(rows: list[tuple[int, list[str]]], file: str, problem: Problem) -> Trace:
    """shoal events as CSV: from ``time_s`` on, ``zone`` has ``count`` GPUs of type ``gpu``
    (the header names the columns, in any order)."""
    (hline, header), body = rows[0], rows[1:]
    names = [c.strip() for c in header]
    known = (*NATIVE_HEADER, "notice_s")
    allowed = "time_s, gpu, zone, count and optionally notice_s, in any order"
    for i, name in enumerate(names):
        if name not in known:
            raise SpecError("unexpected column", file=file, field=f"line {hline}, column {name}",
                            value=name, allowed=allowed,
                            suggestion=close_match(name, [k for k in known if k not in names]))
        if name in names[:i]:
            raise SpecError("column given twice", file=file, field=f"line {hline}, column {name}",
                            value=name, allowed=allowed)
    missing = [k for k in NATIVE_HEADER if k not in names]
    if missing:
        raise SpecError(f"missing column{'s' if len(missing) > 1 else ''} "
                        + ", ".join(missing), file=file, field=f"line {hline}", allowed=allowed)
    if not body:
        raise SpecError("no events after the header", file=file, field=f"line {hline}")
    events: list[_Event] = []
    for line, row in body:
        if len(row) != len(names):
            raise SpecError(f"expected {len(names)} values, as many as the header has",
                            file=file, field=f"line {line}", value=len(row))
        cell = dict(zip(names, row))
        at = f"line {line}, column "
        events.append(_event(problem, file, at + "time_s", cell["time_s"],
                             _gpu(cell["gpu"], file, at + "gpu"), cell["zone"].strip(),
                             at + "zone", cell["count"], at + "count",
                             cell.get("notice_s"), at + "notice_s"))
    return Trace(_merged(_states(problem, events, file)), _events_end(events, None, file), file)


def _native_document(doc: dict, file: str, problem: Problem) -> Trace:
    """shoal events as a YAML or JSON document (``schema: shoal/trace@1``)."""
    keys = ("schema", "end_s", "events")
    _known_keys(doc, keys, file, str)
    if doc.get("schema") != NATIVE_SCHEMA:
        raise SpecError("not a shoal trace", file=file, field="schema", value=doc.get("schema"),
                        allowed=NATIVE_SCHEMA)
    raw = doc.get("events")
    if not isinstance(raw, list):
        raise SpecError("expected a list of events (empty: the scenario's pool throughout)",
                        file=file, field="events", value=raw,
                        allowed="[{time_s, gpu, zone, count, notice_s (optional)}]")
    events = [_document_event(problem, file, f"events[{i}]", ev) for i, ev in enumerate(raw)]
    end = doc.get("end_s")
    end_s = None if end is None else _seconds(end, file, "end_s")
    return Trace(_merged(_states(problem, events, file)), _events_end(events, end_s, file), file)


def _known_keys(mapping: dict, keys: tuple[str, ...], file: str, field) -> None:
    """A SpecError for the first key of ``mapping`` not among ``keys`` (``field(key)``: where it
    is), with its close match."""
    for key in mapping:
        if key not in keys:
            raise SpecError("unknown key", file=file, field=field(key), allowed=", ".join(keys),
                            suggestion=close_match(str(key), keys))


def _document_event(problem: Problem, file: str, at: str, ev: object) -> _Event:
    if not isinstance(ev, dict):
        raise SpecError("expected a mapping", file=file, field=at, value=ev,
                        allowed="{time_s, gpu, zone, count, notice_s (optional)}")
    _known_keys(ev, _EVENT_KEYS, file, lambda key: f"{at}.{key}")
    for key in NATIVE_HEADER:
        if key not in ev:
            raise SpecError("missing", file=file, field=f"{at}.{key}")
    return _event(problem, file, f"{at}.time_s", ev["time_s"],
                  _gpu(str(ev["gpu"]), file, f"{at}.gpu"), str(ev["zone"]).strip(), f"{at}.zone",
                  ev["count"], f"{at}.count", ev.get("notice_s"), f"{at}.notice_s")


def _event(problem: Problem, file: str, time_at: str, time: object, gpu: str, zone: str,
           zone_at: str, count: object, count_at: str, notice: object, notice_at: str) -> _Event:
    t = _seconds(time, file, time_at)
    if t < 0:
        raise SpecError("time before the start of the trace", file=file, field=time_at,
                        value=time, allowed="0 or more seconds")
    return _Event(t, _pool_pair(problem, gpu, zone, file, zone_at),
                  _count(count, file, count_at), _notice(notice, file, notice_at), time_at)


def _notice(raw: object, file: str, field: str) -> float:
    """A preemption notice; left out (or an empty CSV cell) means none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 0.0
    n = _seconds(raw, file, field)
    if n < 0:
        raise SpecError("negative notice", file=file, field=field, value=raw,
                        allowed="0 or more seconds")
    return n


def _states(problem: Problem, events: list[_Event], file: str) -> list[State]:
    """The scenario's pool at time 0, then one state per distinct event time.

    Events at the same time apply together; the state's notice is the shortest of those
    whose GPUs leave.
    """
    for before, ev in zip(events, events[1:]):
        if ev.time_s < before.time_s:
            raise SpecError("times must not decrease from one event to the next", file=file,
                            field=ev.at, value=ev.time_s,
                            allowed=f"{before.time_s!r} or later")
    return _apply(problem, events)


def _apply(problem: Problem, events: Iterable[_Event]) -> list[State]:
    """States from events sorted by time (unchecked: the generators make them sorted)."""
    groups: dict[float, list[_Event]] = {}
    for ev in events:
        groups.setdefault(ev.time_s, []).append(ev)
    avail = dict(problem.avail)
    states = [] if 0.0 in groups else [State(0.0, dict(avail))]
    for t, group in groups.items():
        before = dict(avail)
        for ev in group:
            avail[ev.pair] = ev.count
        # the warning is for the GPUs that leave: the shortest of theirs (none leave: none)
        notices = [ev.notice_s for ev in group if avail[ev.pair] < before[ev.pair]]
        states.append(State(t, dict(avail), min(notices, default=0.0)))
    return states


def _events_end(events: list[_Event], end_s: float | None, file: str) -> float:
    # the scenario's pool is the state at 0, before the first event
    times = sorted({0.0} | {ev.time_s for ev in events})
    if end_s is None:
        return times[-1] + _last_gap(times)
    if end_s <= times[-1]:
        raise SpecError("the trace must end after its last event", file=file, field="end_s",
                        value=end_s, allowed=f"more than {times[-1]!r}")
    return end_s


def _merged(states: list[State]) -> tuple[State, ...]:
    """Drop states equal to the one before: a row that changes nothing is no new state (its
    notice is for GPUs that do not leave)."""
    kept: list[State] = []
    for st in states:
        if kept and st.avail == kept[-1].avail:
            continue
        kept.append(st)
    return tuple(kept)


def _last_gap(times: list[float]) -> float:
    """How long the last of these times lasts: the median gap between them, which a trace with
    regular sampling continues, and which one odd interval does not skew."""
    if len(times) < 2:
        return DEFAULT_LAST_S
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def _number(raw: object) -> float | None:
    """A finite number from a CSV cell or a YAML/JSON value, else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        x = float(raw)
    elif isinstance(raw, str):
        try:
            x = float(raw.strip())
        except ValueError:
            return None
    else:
        return None
    return x + 0.0 if math.isfinite(x) else None  # + 0.0 turns -0.0 into 0.0


def _seconds(raw: object, file: str, field: str) -> float:
    x = _number(raw)
    if x is None:
        raise SpecError("expected a number of seconds", file=file, field=field, value=raw)
    return x


def _count(raw: object, file: str, field: str) -> int:
    """A GPU count; ``8.0`` is accepted because pandas writes whole numbers that way."""
    x = _number(raw)
    if x is None or x != int(x):
        raise SpecError("expected a whole number of GPUs", file=file, field=field, value=raw,
                        allowed=_COUNTS)
    if x < 0:
        raise SpecError("negative GPU count", file=file, field=field, value=raw, allowed=_COUNTS)
    return int(x)


def _gpu(name: str, file: str, field: str) -> str:
    return catalog.gpus().canonical(name.strip(), field=field, file=file)


def _pool_pair(problem: Problem, gpu: str, zone: str, file: str, field: str) -> Pair:
    """(gpu, zone) if the scenario's pool has it; a trace cannot add GPUs the plans never saw."""
    if (gpu, zone) in problem.avail:
        return (gpu, zone)
    holding = sorted(z for g, z in problem.avail if g == gpu)
    if not holding:  # the fault is the GPU type (the event's gpu column, where it has one)
        gpus = list(dict.fromkeys(g for g, _ in problem.avail))
        raise SpecError(f"the scenario's pool has no {gpu} in any zone", file=file,
                        field=field[:-4] + "gpu" if field.endswith("zone") else field,
                        value=gpu, allowed=f"pairs in the pool: {_pairs(problem)}",
                        suggestion=close_match(gpu, gpus))
    if zone in problem.zones:
        reason, suggestion = f"the scenario's pool has no {gpu} in zone {zone}", None
    else:
        reason = f"zone {zone!r} is not in the scenario's pool"
        suggestion = close_match(zone, holding) or close_match(zone, problem.zones)
    raise SpecError(reason, file=file, field=field, value=f"{gpu} in {zone}",
                    allowed=f"pairs in the pool: {_pairs(problem)}", suggestion=suggestion)


def _pairs(problem: Problem) -> str:
    return ", ".join(f"{g}@{z}" for g, z in problem.avail)


# ---------------------------------------------------------------------------------------- synthetic


def synthetic(problem: Problem, kind: str, *, seed: int, duration_s: float = 8 * 3600,
              **params: float) -> Trace:
    """A generated trace, the same for the same seed, starting from the scenario's full pool.

    The scenario's counts are the capacity: a pair never has more, nor fewer than none.
    ``params`` override the kind's defaults (``_SYNTHETIC_PARAMS``). Event times are whole
    seconds, so changes within the same second make one state.
    """
    if kind not in SYNTHETIC_KINDS:
        raise SpecError("unknown kind of synthetic trace", field="--synthetic", value=kind,
                        allowed=", ".join(SYNTHETIC_KINDS),
                        suggestion=close_match(kind, SYNTHETIC_KINDS))
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError("the trace must last some time", field="duration_s", value=duration_s,
                        allowed="more than 0 seconds")
    defaults = _SYNTHETIC_PARAMS[kind]
    for name, value in params.items():
        if name not in defaults:
            raise SpecError(f"unknown parameter of a {kind} trace", field=name,
                            allowed=", ".join(defaults), suggestion=close_match(name, defaults))
        if not (math.isfinite(value) and value > 0):
            raise SpecError("must be more than 0", field=name, value=value)
    options = {**defaults, **params}
    rng = np.random.default_rng(seed)
    make = {"spot": _spot, "scarcity": _scarcity, "outage": _outage}[kind]
    events = make(problem, rng, float(duration_s), **options)
    events.sort(key=lambda ev: ev.time_s)  # stable: one pair's same-second changes stay in order
    return Trace(_merged(_apply(problem, events)), float(duration_s),
                 f"synthetic:{kind}:seed={seed}")


def _second(t: float) -> float:
    """Whole seconds, never 0: the trace starts from the full pool."""
    return float(max(1, math.ceil(t)))


def _node(problem: Problem, pair: Pair) -> int:
    """GPUs that come and go together: a VM, or the whole pair when it is smaller than one."""
    return max(1, min(problem.gpus[pair[0]].gpus_per_node, problem.avail[pair]))


def _spot(problem: Problem, rng: np.random.Generator, duration_s: float, *, mean_gap_s: float,
          mean_return_s: float, notice_s: float) -> list[_Event]:
    """Per pair, preemptions as a Poisson process, each taking whole nodes of those still there;
    each preemption's GPUs come back together after an exponential delay."""
    events: list[_Event] = []
    for pair in sorted(problem.avail):
        node = _node(problem, pair)
        have = problem.avail[pair]
        back: list[tuple[float, int]] = []  # (when, GPUs) of preempted GPUs yet to return
        preempt = rng.exponential(mean_gap_s)
        while True:
            now = min(preempt, back[0][0] if back else math.inf)
            t = _second(now)
            if t >= duration_s:
                break
            if back and back[0][0] == now:
                have += heapq.heappop(back)[1]
                events.append(_Event(t, pair, have))
                continue
            nodes = math.ceil(have / node)
            if nodes:
                gone = min(have, int(rng.integers(1, nodes + 1)) * node)
                have -= gone
                events.append(_Event(t, pair, have, notice_s))
                heapq.heappush(back, (now + rng.exponential(mean_return_s), gone))
            preempt = now + rng.exponential(mean_gap_s)
    return events


def scarcity_down_p(have: float, cap: float) -> float:
    """The chance that a scarcity step goes down from ``have`` of ``cap`` GPUs: the pull
    towards 5/8 of capacity, between 0.1 and 0.9."""
    return min(0.9, max(0.1, 0.5 + (have - 0.625 * cap) / max(cap, 1)))


def _scarcity(problem: Problem, rng: np.random.Generator, duration_s: float, *,
              mean_step_s: float, max_step_nodes: float) -> list[_Event]:
    """Per pair, a random walk of a few nodes at a time, pulled towards 5/8 of capacity so that it
    stays mostly between a quarter and all of it."""
    events: list[_Event] = []
    for pair in sorted(problem.avail):
        cap = problem.avail[pair]
        node = _node(problem, pair)
        have, now = cap, 0.0
        while True:
            now += rng.exponential(mean_step_s)
            t = _second(now)
            if t >= duration_s:
                break
            step = int(rng.integers(1, int(max_step_nodes) + 1)) * node
            down = rng.random() < scarcity_down_p(have, cap)
            new = min(cap, max(0, have - step if down else have + step))
            if new != have:
                have = new
                events.append(_Event(t, pair, have))
    return events


def _outage(problem: Problem, rng: np.random.Generator, duration_s: float, *, mean_gap_s: float,
            mean_outage_s: float) -> list[_Event]:
    """One zone at a time loses every GPU type, then gets its capacity back.

    The gap is counted from the end of the previous outage, so outages never overlap and a
    zone always returns to its full pool.
    """
    zones = sorted({z for _, z in problem.avail})
    events: list[_Event] = []
    now = 0.0
    while zones:
        now += rng.exponential(mean_gap_s)
        start = _second(now)
        if start >= duration_s:
            break
        zone = zones[int(rng.integers(len(zones)))]
        now += rng.exponential(mean_outage_s)
        stop = _second(now)
        pairs = [p for p in sorted(problem.avail) if p[1] == zone]
        events += [_Event(start, p, 0) for p in pairs]
        if stop >= duration_s:
            break
        events += [_Event(stop, p, problem.avail[p]) for p in pairs]
    return events
