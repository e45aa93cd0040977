"""Reading availability trace files: Sailor's availability CSV and its controller traces (a JSON
list), and shoal's own events as CSV or as a YAML/JSON document (``shoal/trace@1``). Every state
of a trace covers exactly the (GPU type, zone) pairs of the scenario's pool
(``shoal.elastic.traces``). A bad file is reported with its path and the line (or, for YAML and
JSON documents, the field) at fault.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import NamedTuple

from shoal import catalog
from shoal.elastic.traces import Event, Pair, State, Trace, apply_events, last_gap, merged
from shoal.errors import SpecError, close_match
from shoal.files import read_document, read_text
from shoal.problem import Problem

NATIVE_SCHEMA = "shoal/trace@1"
NATIVE_HEADER = ("time_s", "gpu", "zone", "count")
CONTROLLER_GPU = "A100-40GB"  # Sailor's controller traces count A100s

_FORMATS = ("a Sailor availability CSV (header ',Timestamp,<GPU>_<zone>,...'), a Sailor controller "
            "JSON list ([{\"Time\": s, \"GPUs\": n}, ...]), shoal events as CSV (header "
            "'time_s,gpu,zone,count[,notice_s]', in any order) or as YAML/JSON with schema: " + NATIVE_SCHEMA)
_COUNTS = "a whole number of GPUs, 0 or more"
_CONTROLLER_KEYS = ("Time", "GPUs")  # a controller trace entry's keys
_EVENT_KEYS = ("time_s", "gpu", "zone", "count", "notice_s")


class _Cell(NamedTuple):
    """A value as the file gives it, and where it is in the file (for errors)."""

    raw: object
    at: str


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
    return Trace(merged(states), rel[-1] + last_gap(rel), file)


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
    return Trace(merged(states), rel[-1] + last_gap(rel), file)


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
    events: list[Event] = []
    for line, row in body:
        if len(row) != len(names):
            raise SpecError(f"expected {len(names)} values, as many as the header has",
                            file=file, field=f"line {line}", value=len(row))
        cell = dict(zip(names, row))
        at = f"line {line}, column "
        events.append(_event(problem, file, _Cell(cell["time_s"], at + "time_s"),
                             _gpu(cell["gpu"], file, at + "gpu"),
                             _Cell(cell["zone"].strip(), at + "zone"),
                             _Cell(cell["count"], at + "count"),
                             _Cell(cell.get("notice_s"), at + "notice_s")))
    return Trace(merged(_states(problem, events, file)), _events_end(events, None, file), file)


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
    return Trace(merged(_states(problem, events, file)), _events_end(events, end_s, file), file)


def _known_keys(mapping: dict, keys: tuple[str, ...], file: str, field) -> None:
    """A SpecError for the first key of ``mapping`` not among ``keys`` (``field(key)``: where it
    is), with its close match."""
    for key in mapping:
        if key not in keys:
            raise SpecError("unknown key", file=file, field=field(key), allowed=", ".join(keys),
                            suggestion=close_match(str(key), keys))


def _document_event(problem: Problem, file: str, at: str, ev: object) -> Event:
    if not isinstance(ev, dict):
        raise SpecError("expected a mapping", file=file, field=at, value=ev,
                        allowed="{time_s, gpu, zone, count, notice_s (optional)}")
    _known_keys(ev, _EVENT_KEYS, file, lambda key: f"{at}.{key}")
    for key in NATIVE_HEADER:
        if key not in ev:
            raise SpecError("missing", file=file, field=f"{at}.{key}")
    return _event(problem, file, _Cell(ev["time_s"], f"{at}.time_s"),
                  _gpu(str(ev["gpu"]), file, f"{at}.gpu"),
                  _Cell(str(ev["zone"]).strip(), f"{at}.zone"), _Cell(ev["count"], f"{at}.count"),
                  _Cell(ev.get("notice_s"), f"{at}.notice_s"))


def _event(problem: Problem, file: str, time: _Cell, gpu: str, zone: _Cell, count: _Cell,
           notice: _Cell) -> Event:
    """The event of a file's row or entry: its time, GPU type (already canonical), zone, count
    and notice."""
    t = _seconds(time.raw, file, time.at)
    if t < 0:
        raise SpecError("time before the start of the trace", file=file, field=time.at,
                        value=time.raw, allowed="0 or more seconds")
    return Event(t, _pool_pair(problem, gpu, zone.raw, file, zone.at),
                 _count(count.raw, file, count.at), _notice(notice.raw, file, notice.at), time.at)


def _notice(raw: object, file: str, field: str) -> float:
    """A preemption notice; left out (or an empty CSV cell) means none."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 0.0
    n = _seconds(raw, file, field)
    if n < 0:
        raise SpecError("negative notice", file=file, field=field, value=raw,
                        allowed="0 or more seconds")
    return n


def _states(problem: Problem, events: list[Event], file: str) -> list[State]:
    """The scenario's pool at time 0, then one state per distinct event time.

    Events at the same time apply together; the state's notice is the shortest of those
    whose GPUs leave.
    """
    for before, ev in zip(events, events[1:]):
        if ev.time_s < before.time_s:
            raise SpecError("times must not decrease from one event to the next", file=file,
                            field=ev.at, value=ev.time_s,
                            allowed=f"{before.time_s!r} or later")
    return apply_events(problem, events)


def _events_end(events: list[Event], end_s: float | None, file: str) -> float:
    # the scenario's pool is the state at 0, before the first event
    times = sorted({0.0} | {ev.time_s for ev in events})
    if end_s is None:
        return times[-1] + last_gap(times)
    if end_s <= times[-1]:
        raise SpecError("the trace must end after its last event", file=file, field="end_s",
                        value=end_s, allowed=f"more than {times[-1]!r}")
    return end_s


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

