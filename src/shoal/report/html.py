"""``shoal report``: one self-contained HTML page from the JSON outputs of shoal's commands.

Each input is recognised by its fields (a ``plan``, ``estimate``, ``replay``, ``bubbles``,
``serve plan`` or ``serve simulate`` result), becomes a section with a summary table and its
figures, drawn by ``shoal.report.figures`` (the same drawers as the commands' ``--figure``) and
embedded as PNG data, so the page needs no network and can be forwarded as one file. Every
figure has a one-line caption that says what to look at.
"""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Callable
from pathlib import Path

from shoal.errors import SpecError
from shoal.files import read_json, write_text
from shoal.report import figures
from shoal.specs.plan import TrainingPlan
from shoal.units import fmt_bytes, fmt_per_usd, fmt_seconds

KINDS = ("plan", "estimate", "replay", "bubbles", "serve plan", "serve simulate")


def kind_of(doc: dict) -> str | None:
    if "plans" in doc and "pareto" in doc:
        return "plan"
    if "utilization_before" in doc and "training" in doc:
        return "bubbles"
    if "iteration_time_s" in doc and "workers" in doc:
        return "estimate"
    if ("steps" in doc and "totals" in doc) or "replays" in doc:
        return "replay"
    if "max_flow_tokens_per_s" in doc and "placement" in doc:
        return "serve plan"
    if "decode_throughput_tokens_per_s" in doc:
        return "serve simulate"
    return None


def _png(draw: Callable[[dict, Path], Path], doc: dict) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = draw(doc, Path(d) / "f.png")
        return base64.b64encode(path.read_bytes()).decode()


def _figure(draw, doc: dict, caption: str, name: str) -> str:
    data = _png(draw, doc)
    return (f'<figure data-figure="{html.escape(name)}"><img alt="{html.escape(name)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}'
            f"</figcaption></figure>")


def _table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _grid(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="grid"><tr>{head}</tr>{body}</table>'


def _s(t: float | None) -> str:

    return "-" if t is None else fmt_seconds(t)


def _summary(plan_json: dict) -> str:

    return TrainingPlan.model_validate(plan_json).summary()


def _estimate_rows(e: dict) -> list[tuple[str, str]]:
    c = e["cost_per_iteration_usd"]
    peak = max(e["workers"], key=lambda w: w["peak_memory_bytes"] / w["capacity_bytes"])
    return [("iteration time", _s(e["iteration_time_s"])),
            ("tokens/s", f"{e['tokens_per_s']:,.0f}"), ("MFU", f"{e.get('mfu', 0.0):.1%}"),
            ("USD per iteration", f"{c['total']:.4g} (compute {c['compute']:.4g}, "
                                  f"egress {c['egress']:.4g})" if c["total"] is not None
             else f"unknown: {c.get('reason')} (egress {c['egress']:.4g})"),
            ("GPUs", str(e.get("num_gpus", len(e["workers"])))),
            ("fullest worker", f"stage {peak['stage']} replica {peak['replica']} "
                               f"({peak['gpu']}): {fmt_bytes(peak['peak_memory_bytes'])} of "
                               f"{fmt_bytes(peak['capacity_bytes'])}"),
            ("out of memory", "yes" if e["oom"] else "no")]


def _section_estimate(doc: dict) -> str:
    parts = [_table(_estimate_rows(doc))]
    straggler = [s for s in doc["stages"] if s.get("straggler")]
    parts.append(_grid(["stage", "layers", "replicas", "forward", "backward", "send/recv",
                        "grad sync", "bubble"],
                       [[str(s["stage"]) + (" (straggler)" if s.get("straggler") else ""),
                         f"{s['layers'][0]}-{s['layers'][1]}", str(s["replicas"]),
                         _s(s["compute_fwd_s"]), _s(s["compute_bwd_s"]), _s(s["send_recv_s"]),
                         _s(s["gradient_sync_s"]), _s(s["bubble_s"])] for s in doc["stages"]]))
    if "timeline" in doc:
        who = f" stage {straggler[0]['stage']} sets the pace" if straggler else ""
        parts.append(_figure(figures.draw_timeline_doc, doc["timeline"],
                             "Timeline of one iteration: white gaps are pipeline bubbles;" + who
                             + ", and long red bars mean gradient sync dominates.", "timeline"))
    parts.append(_figure(figures.draw_memory, doc,
                         "Peak memory per GPU against its capacity (tick): bars that reach the "
                         "tick are the workers closest to running out of memory.", "memory"))
    return "".join(parts)


def _section_plan(doc: dict) -> str:
    best = doc["plans"][0]
    st = doc["stats"]
    rows = [("objective", doc["objective"]), ("strategy", st["strategy"]),
            ("search", f"{st['search_time_s']:.2f} s, {st['candidates_costed']} plans costed"
                       + (" (cut by the time budget)" if st.get("truncated") else "")),
            ("best plan", _summary(best["plan"]))] + _estimate_rows(best["estimate"])
    front = _grid(["it/s", "USD/iteration", "GPUs", "plan"],
                  [[f"{e['estimate']['throughput_iters_per_s']:.4g}",
                    f"{e['estimate']['cost_per_iteration_usd']['total']:.4g}",
                    str(e["estimate"].get("num_gpus", "")), _summary(e["plan"])]
                   for e in doc["pareto"]])
    return "".join([
        _table(rows), front,
        _figure(figures.draw_pareto, doc, "Throughput against cost of every plan on the front; "
                "the star is the chosen plan: look where the front bends, the cheapest plans "
                "past it buy little speed.", "pareto"),
        _figure(figures.draw_memory, best["estimate"], "Peak memory of the chosen plan per "
                "GPU against capacity: how much headroom each worker has.", "memory")])


def _section_replay(doc: dict) -> str:
    runs = doc.get("replays") or [doc]
    # checkpoint time: absent from a replay written before checkpoints stalled training
    grid = _grid(["policy", "tokens", "USD", "tokens/USD", "moves", "switching", "checkpoints"],
                 [[r["policy"], f"{r['totals']['tokens']:.4g}", f"{r['totals']['cost_usd']:,.2f}",
                   fmt_per_usd(r["totals"]["tokens_per_usd"]), str(r["totals"]["switches"]),
                   _s(r["totals"]["switch_time_s"]),
                   _s(r["totals"]["checkpoint_time_s"]) if "checkpoint_time_s" in r["totals"]
                   else "-"] for r in runs])
    rows = [("trace", str(doc["trace"])), ("availability states", str(doc["states"])),
            ("length", _s(doc["end_s"]))]
    return "".join([_table(rows), grid, _figure(
        figures.draw_replay, doc, "Availability, throughput and cumulative tokens over the "
        "trace; ticks mark plan moves: a policy whose tokens fall behind paid for its moves or "
        "kept a slow plan.", "replay")])


def _section_bubbles(doc: dict) -> str:
    rows = [("GPU busy", f"{doc['utilization_before']:.1%} -> {doc['utilization_after']:.1%}"),
            ("training iteration", f"{_s(doc['iteration_time_before_s'])} -> "
                                   f"{_s(doc['iteration_time_after_s'])}"),
            ("time to first token", f"p50 {_s(doc['ttft_s']['p50'])}, "
                                    f"p95 {_s(doc['ttft_s']['p95'])}"),
            ("rejected", f"{doc['rejected_fraction']:.1%} of {doc['requests']['total']}"),
            ("schedule", doc["training"]["schedule"])]
    return _table(rows) + _figure(
        figures.draw_bubbles, doc, "Training work per GPU with prefills (orange) in its "
        "bubbles: white is still idle, and no orange bar may touch training work.", "bubbles")


def _section_serve_plan(doc: dict) -> str:
    rows = [("placer", str(doc.get("placer"))),
            ("max flow", f"{doc['max_flow_tokens_per_s']:,.1f} tokens/s"),
            ("upper bound", f"{doc.get('upper_bound_tokens_per_s', float('nan')):,.1f} tokens/s"),
            ("nodes used", str(doc.get("nodes_used", len(doc["placement"]["nodes"])))),
            ("solve time", _s(doc.get("solve_time_s")))]
    return _table(rows) + _figure(
        figures.draw_placement, doc, "Layer range per node and the links the max flow uses "
        "(thicker: more tokens/s): the narrowest layer band limits the whole cluster.",
        "placement")


def _section_serve_simulate(doc: dict) -> str:
    p, d = doc["prompt_latency_s"], doc["decode_latency_s"]
    rows = [("decode throughput", f"{doc['decode_throughput_tokens_per_s']:,.1f} tokens/s"),
            ("prompt latency", f"mean {_s(p['mean'])}, p50 {_s(p['p50'])}, p95 {_s(p['p95'])}"),
            ("decode latency", f"mean {_s(d['mean'])}, p50 {_s(d['p50'])}, p95 {_s(d['p95'])}"),
            ("requests", f"{doc['requests']['completed']} completed, "
                         f"{doc['requests']['rejected']} rejected")]
    out = _table(rows)
    if doc.get("latency_histogram"):
        out += _figure(figures.draw_latency, doc, "Latency distributions over the simulated "
                       "requests: a long right tail of prompt latency means requests queue.",
                       "latency")
    return out


SECTIONS = {"plan": _section_plan, "estimate": _section_estimate, "replay": _section_replay,
            "bubbles": _section_bubbles, "serve plan": _section_serve_plan,
            "serve simulate": _section_serve_simulate}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;padding:0 1rem}h1{font-size:1.6rem}h2{font-size:1.2rem;border-bottom:1px solid #ddd;
padding-bottom:.3rem;margin-top:2.5rem}table{border-collapse:collapse;margin:.8rem 0;
font-size:.9rem}table.kv th{text-align:left;padding:.2rem 1rem .2rem 0;color:#555;font-weight:500}
table.grid th,table.grid td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
table.grid td:last-child{text-align:left}figure{margin:1rem 0}img{max-width:100%;
border:1px solid #eee}figcaption{color:#555;font-size:.9rem;margin-top:.3rem}
nav a{margin-right:1rem}.src{color:#888;font-size:.8rem}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.1rem 1rem;font-size:.8rem;
color:#555;margin:.5rem 0 1rem}dl.meta dt{font-weight:500}dl.meta dd{margin:0;
font-family:ui-monospace,monospace;overflow-wrap:anywhere}
"""

CHECK = """
window.shoalErrors=[];window.addEventListener('error',e=>{shoalErrors.push(String(e.message));
document.body.dataset.errors=shoalErrors.length;});
window.addEventListener('load',()=>{const imgs=[...document.querySelectorAll('figure img')];
const ok=imgs.filter(i=>i.complete&&i.naturalWidth>0&&i.naturalHeight>0).length;
document.body.dataset.figures=imgs.length;document.body.dataset.figuresOk=ok;});
"""


def _meta_block(meta: dict, path: Path) -> str:
    """What a section's result is: the ``meta`` block of the command that made it (an output
    without one, made by an older shoal, says so)."""
    rows = [("file", str(path))]
    if not meta:
        rows.append(("made by", "an output without a meta block (an older shoal)"))
    else:
        rows += [("command", meta.get("command", "")),
                 ("made", f"{meta.get('utc_time', '')} by shoal {meta.get('shoal_version', '')}")]
        if meta.get("scenario"):
            s = meta["scenario"]
            rows.append(("input", f"{s['file']} (sha256 {str(s.get('sha256'))[:12]})"))
        if meta.get("model"):
            m = meta["model"]
            size = f", {m['parameters'] / 1e9:.2f} B parameters" if m.get("parameters") else ""
            rows.append(("model", f"{m['name']}{size}"))
        if meta.get("job"):
            j = meta["job"]
            rows.append(("job", f"global batch {j['global_batch']}, sequence {j['seq_len']}, "
                                f"{j['precision']}"))
        if meta.get("pool"):
            rows.append(("pool", "; ".join(
                f"{gpu}: " + ", ".join(f"{n} in {zone}" for zone, n in zones.items())
                for gpu, zones in meta["pool"]["gpus"].items())))
    cells = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in rows)
    return f'<dl class="meta" data-meta>{cells}</dl>'


def build(inputs: list[Path], out: Path, title: str | None = None) -> Path:
    """Write the report of ``inputs`` (JSON files) to ``out``; every input problem is a SpecError
    naming the file, and nothing is written then."""
    docs = []
    for path in inputs:
        if Path(path).suffix.lower() in (".yaml", ".yml"):
            raise SpecError("not a shoal result (a YAML file: a scenario or serving file, say): "
                            "run the command with --json and save its output", file=str(path),
                            allowed=", ".join(KINDS))
        doc = read_json(path, "result file")
        kind = kind_of(doc)
        if kind is None:
            if "final_loss" in doc:
                what = "a `shoal train` result, which the report does not draw"
            elif set(doc) == {"error"}:
                what = f"the error of a command that failed ({doc['error']}), not a result"
            else:
                what = ("not a result the report draws: give the --json output of one of the "
                        "commands listed")
            raise SpecError(what, file=str(path), allowed=", ".join(KINDS))
        docs.append((path, kind, doc))
    sections, nav = [], []
    for i, (path, kind, doc) in enumerate(docs):
        try:
            body = SECTIONS[kind](doc)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError,
                ArithmeticError) as exc:
            raise SpecError(f"incomplete or inconsistent {kind} result "
                            f"({type(exc).__name__}: {exc})",
                            file=str(path)) from None
        anchor = f"s{i}"
        meta = doc.get("meta") or {}
        label = (meta.get("scenario") or {}).get("name") or path.name
        nav.append(f'<a href="#{anchor}">{html.escape(kind)}: {html.escape(label)}</a>')
        sections.append(f'<section id="{anchor}" data-kind="{html.escape(kind)}"><h2>'
                        f'{html.escape(kind)}: {html.escape(label)}</h2>'
                        f"{_meta_block(meta, path)}{body}</section>")
    title = title or "shoal report"
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>'
            f"{html.escape(title)}</title><style>{CSS}</style><script>{CHECK}</script></head>"
            f"<body><h1>{html.escape(title)}</h1><nav>{''.join(nav)}</nav>"
            f"{''.join(sections)}</body></html>")
    return write_text(out, page)
