"""Figures (matplotlib, written as PNG without a display), each drawn from the JSON document a
command prints with ``--json``, so that a command's ``--figure`` and ``shoal report`` draw the
same picture from the same data."""

from __future__ import annotations

from pathlib import Path

from shoal.estimate.timeline import timeline_json
from shoal.files import save_figure
from shoal.problem import Problem
from shoal.specs.plan import TrainingPlan

COLORS = {"F": "#4C72B0", "R": "#8172B3", "B": "#55A868", "sync": "#C44E52",
          "update": "#937860", "prefill": "#DD8452"}
DASHES = ["-", "--", ":", "-."]
NAMES = {"F": "forward", "R": "recompute", "B": "backward", "sync": "gradient all-reduce",
         "update": "optimizer", "prefill": "prefill"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend(ax, kinds, extra=()) -> None:
    """The legend beside the plot (right of it), never over the data."""
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=COLORS[k], label=NAMES[k]) for k in kinds] + list(extra),
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


# a worker's microbatches past this many are drawn as the first and last SHOWN / 2 and a
# summary bar between them (more bars are a barcode no one can read)
SHOWN = 32
SUMMARY = "#D9D9D9"


def _summarised(ops: list) -> tuple[list, tuple[float, float, int] | None]:
    """A row's operations to draw: all of them up to ``SHOWN`` microbatches; past that, those
    of the first and last ``SHOWN // 2`` microbatches (and the ones of no microbatch: sync,
    update), and the middle's span and number of microbatches."""
    mbs = sorted({mb for _, mb, _, _ in ops if mb is not None and mb >= 0})
    if len(mbs) <= SHOWN:
        return ops, None
    keep = set(mbs[:SHOWN // 2] + mbs[-(SHOWN // 2):])
    kept = [op for op in ops if op[1] is None or op[1] < 0 or op[1] in keep]
    middle = [op for op in ops if op not in kept]
    return kept, (min(op[2] for op in middle), max(op[3] for op in middle),
                  len(mbs) - len(keep))


def draw_timeline_doc(doc: dict, path: str | Path) -> Path:
    """One training iteration as a Gantt chart, one row per worker: forwards, backwards (sends
    included), gradient all-reduce and optimizer step; white gaps are pipeline bubbles. A row
    of more than ``SHOWN`` microbatches shows its first and last ones and a grey bar for those
    between."""
    plt = _plt()
    from matplotlib.patches import Patch

    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 2.0))
    shown = [_summarised(row["ops"]) for row in rows]
    kinds = _gantt(ax, [ops for ops, _ in shown])
    summarised = False
    for y, (_, middle) in enumerate(shown):
        if middle is not None:
            a, b, n = middle
            ax.barh(y, b - a, left=a, height=0.8, color=SUMMARY, edgecolor="white", hatch="//")
            ax.text((a + b) / 2, y, f"{n} microbatches", ha="center", va="center", fontsize=7)
            summarised = True
    ax.set_yticks(range(len(rows)), [
        f"stage {r['stage']} replica {r['replica']} · {r['gpu']} TP{r['tp']}"
        + (f" · {r['zone']}" if r.get("zone") else "")
        + f" · {r['microbatches']} microbatches" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"one iteration: {doc['iteration_time_s']:.3f} s ({doc['schedule']}, "
                 f"{doc['stages']} stage{'s' * (doc['stages'] > 1)}; {doc['shown']})")
    extra = [Patch(facecolor=SUMMARY, hatch="//", label=f"microbatches past the first and "
                   f"last {SHOWN // 2}")] if summarised else []
    _legend(ax, [k for k in COLORS if k in kinds], extra)
    return save_figure(fig, path)


def _gantt(ax, rows: list[list]) -> list[str]:
    """Every operation of every row (``rows[y]``: its operations) as one bar (height 0.8
    around its row, a thin white edge), all in one collection drawn in the rows' order: what a
    ``barh`` per operation draws, without a patch object each (an iteration of a large plan
    has thousands of operations). The kinds drawn, in order of first appearance."""
    from matplotlib.collections import PolyCollection

    boxes, faces, kinds = [], [], []
    for y, ops in enumerate(rows):
        for kind, _, t0, t1 in ops:
            boxes.append(((t0, y - 0.4), (t0, y + 0.4), (t1, y + 0.4), (t1, y - 0.4)))
            faces.append(COLORS[kind])
            if kind not in kinds:
                kinds.append(kind)
    if boxes:
        bars = PolyCollection(boxes, facecolors=faces, edgecolors="white", linewidths=0.2)
        # barh pins the x axis at its bars' left ends (no margin below the earliest start)
        bars.sticky_edges.x.append(min(b[0][0] for b in boxes))
        ax.add_collection(bars)
        ax.autoscale_view()
    return kinds


def draw_timeline(problem: Problem, plan: TrainingPlan, path: str | Path,
                  max_pipelines: int = 4) -> Path:
    """Simulate one iteration of ``plan`` (``shoal.estimate.timeline``) and draw it as a Gantt
    chart (one row per worker, at most ``max_pipelines`` pipelines) into a PNG."""
    return draw_timeline_doc(timeline_json(problem, plan, max_pipelines), path)


def fullest(workers: list[dict], most: int) -> list[dict]:
    """The ``most`` workers whose memory is fullest (peak over capacity), in their order."""
    if len(workers) <= most:
        return workers
    full = sorted(range(len(workers)),
                  key=lambda i: -workers[i]["peak_memory_bytes"] / workers[i]["capacity_bytes"])
    return [workers[i] for i in sorted(full[:most])]


def draw_memory(doc: dict, path: str | Path, most: int = 48) -> Path:
    """Peak memory of every worker, its parts stacked (weights + gradients + optimizer state,
    activations, buffers, framework), against the GPU's capacity (black tick)."""
    plt = _plt()
    import numpy as np

    workers = fullest(doc["workers"], most)
    parts = [("weights_grads_optimizer_bytes", "weights, grads, optimizer", "#4C72B0"),
             ("activation_bytes", "activations", "#55A868"), ("buffer_bytes", "buffers", "#8172B3"),
             ("framework_bytes", "framework", "#999999")]
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(workers) + 2.0))
    y = np.arange(len(workers))
    left = np.zeros(len(workers))
    for key, label, colour in parts:
        v = np.array([w.get(key, 0.0) for w in workers]) / 2**30
        ax.barh(y, v, left=left, height=0.7, color=colour, label=label)
        left += v
    cap = np.array([w["capacity_bytes"] for w in workers]) / 2**30
    ax.plot(cap, y, "|", color="black", markersize=14, label="capacity")
    for i, w in enumerate(workers):
        if w.get("oom"):
            ax.text(left[i], i, "  OOM", va="center", color="#C44E52", fontsize=7)
    ax.set_yticks(y, [f"s{w['stage']} r{w['replica']} {w['gpu']} TP{w['tp']}" for w in workers],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GiB per GPU")
    shown = (f" (the {most} fullest of {len(doc['workers'])})" if len(doc["workers"]) > most
             else "")
    ax.set_title(f"peak memory per worker{shown}")
    # beside the bars, not over the capacity ticks and OOM marks of the last rows
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


def front_doc(result) -> dict:
    """The part of ``shoal plan --json`` the Pareto figure reads, from a SearchResult."""
    def entry(c):
        return {"estimate": {"throughput_iters_per_s": c.throughput_iters_per_s,
                             "cost_per_iteration_usd": {"total": c.cost_usd},
                             "num_gpus": c.num_gpus}}

    return {"objective": result.objective, "stats": result.stats.to_json(),
            "plans": [entry(c) for c in result.ranked[:1]],
            "pareto": [entry(c) for c in result.pareto]}


def draw_pareto(doc: dict, path: str | Path) -> Path:
    """Iterations/s against $/iteration: every plan on the throughput-cost front, the chosen plan
    marked."""
    plt = _plt()

    def xy(entries):
        return ([e["estimate"]["cost_per_iteration_usd"]["total"] for e in entries],
                [e["estimate"]["throughput_iters_per_s"] for e in entries])

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x, y = xy(doc["pareto"])
    ax.plot(x, y, "o-", color="#4C72B0", label="Pareto front")
    bx, by = xy(doc["plans"][:1])
    ax.plot(bx, by, "*", markersize=14, color="#C44E52", label=f"best for {doc['objective']}")
    ax.set_xlabel("USD per iteration")
    ax.set_ylabel("iterations per second")
    st = doc["stats"]
    ax.set_title(f"{len(x)} plans on the front ({st['candidates_costed']} costed, "
                 f"{st['search_time_s']:.2f} s, {st['strategy']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def draw_replay(doc: dict, path: str | Path) -> Path:
    """Over the trace: GPUs available per type and zone; each policy's tokens/s (zero while
    switching or idle over a whole state) and cumulative tokens, with its moves marked."""
    plt = _plt()
    import numpy as np

    runs = doc.get("replays") or [doc]
    h = 1 / 3600
    end = doc["end_s"]
    steps0 = runs[0]["steps"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    keys = sorted({k for s in steps0 for k in s["available"]})
    t0 = [s["time_s"] * h for s in steps0] + [end * h]
    for k in keys:
        ys = [s["available"].get(k, 0) for s in steps0]
        axes[0].step(t0, ys + ys[-1:], where="post", label=k)
    axes[0].set_ylabel("GPUs available")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    rates = [np.array([s["tokens"] / s["duration_s"] if s["duration_s"] > 0 else 0.0
                       for s in run["steps"]]) for run in runs]
    # each policy's moves in a lane of its own under the zero line, so they do not overlap
    lane = 0.08 * max((float(r.max()) for r in rates if len(r)), default=1.0) or 0.08
    for i, (run, rate) in enumerate(zip(runs, rates, strict=True)):
        st = run["steps"]
        t = np.array([s["time_s"] for s in st])
        # identical policies stay visible: each its own dash and width, the first widest
        style = dict(linestyle=DASHES[i % len(DASHES)], linewidth=2.6 - 0.5 * min(i, 3))
        line = axes[1].step(np.append(t, end) * h, np.append(rate, rate[-1:]), where="post",
                            label=run["policy"], **style)[0]
        cum = np.concatenate([[0.0], np.cumsum([s["tokens"] for s in st])])
        # work lost and not redone by the end leaves the total (a drop at the end)
        cum = np.append(cum, cum[-1] - run["totals"].get("lost_tokens", 0.0))
        axes[2].plot(np.append(t, [end, end]) * h, cum, color=line.get_color(),
                     label=run["policy"], **style)
        moves = [s["time_s"] * h for s in st if s["decision"] in ("switch", "forced", "start")]
        axes[1].plot(moves, [-(i + 0.5) * lane] * len(moves), "|", markersize=6,
                     color=line.get_color())
    axes[1].axhline(0.0, color="black", linewidth=0.5)
    axes[1].set_ylim(bottom=-(len(runs) + 0.2) * lane)
    axes[1].set_yticks([y for y in axes[1].get_yticks() if 0 <= y <= axes[1].get_ylim()[1]])
    axes[1].set_ylabel("tokens/s (state mean)")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[2].set_ylabel("cumulative tokens")
    axes[2].set_xlabel("hours (ticks under the middle axis's zero: each policy's plan moves)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set_title(f"replay of {doc['trace']}")
    return save_figure(fig, path)


def draw_placement(doc: dict, path: str | Path) -> Path:
    """Each node's layer range as a bar (colour by GPU type, label: tokens/s through it) and the
    links the max flow uses as lines from one range's end to the next one's start, thicker for
    more flow: where the pipeline narrows is where to look."""
    plt = _plt()
    pl = doc["placement"]
    nodes = sorted(pl["nodes"], key=lambda n: (n["layers"][0], n["layers"][1], n["name"]))
    row = {n["name"]: i for i, n in enumerate(nodes)}
    end = {n["name"]: n["layers"][1] for n in nodes}
    through: dict[str, float] = {}
    for f in pl.get("flows", []):
        if f["to"] in row:
            through[f["to"]] = through.get(f["to"], 0.0) + f["tokens_per_s"]
    types = sorted({n["gpu"] for n in nodes})
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.36 * len(nodes) + 1.5)))
    flows = [f for f in pl.get("flows", []) if f["from"] in row and f["to"] in row]
    top = max((f["tokens_per_s"] for f in flows), default=1.0) or 1.0
    for f in flows:
        x = end[f["from"]]
        ax.plot([x, x], [row[f["from"]], row[f["to"]]], color="#555555", alpha=0.6,
                linewidth=0.5 + 3.0 * f["tokens_per_s"] / top)
    for n in nodes:
        s, e = n["layers"]
        c = colours(types.index(n["gpu"]) % 10)
        ax.barh(row[n["name"]], e - s, left=s, height=0.7, color=c, edgecolor="black",
                linewidth=0.4)
        ax.text(e + 0.3, row[n["name"]], f"{through.get(n['name'], 0.0):,.0f}", va="center",
                fontsize=8)
    from matplotlib.patches import Patch

    ax.set_yticks(range(len(nodes)), [f"{n['name']} ({n['gpu']})" for n in nodes], fontsize=8)
    ax.invert_yaxis()
    layers = pl.get("layers") or max(end.values(), default=1)
    ax.set_xlim(0, layers * 1.12)
    ax.set_xlabel("layer")
    ax.set_title(f"{doc.get('placer', 'placement')}: {doc['max_flow_tokens_per_s']:,.1f} tokens/s "
                 f"max flow (upper bound {doc.get('upper_bound_tokens_per_s', float('nan')):,.1f});"
                 " labels: tokens/s through each node", fontsize=9)
    ax.legend(handles=[Patch(color=colours(k % 10), label=t) for k, t in enumerate(types)],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


def draw_latency(doc: dict, path: str | Path) -> Path:
    """Distributions of prompt latency (time to first token) and per-token decode latency over
    the simulated requests, with p50 and p95 marked."""
    plt = _plt()
    hist = doc["latency_histogram"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, label in ((axes[0], "prompt", "prompt latency (s)"),
                           (axes[1], "decode", "decode latency per token (s)")):
        h = hist.get(key)
        if not h or not h["counts"]:
            ax.text(0.5, 0.5, "no requests", ha="center", transform=ax.transAxes)
            continue
        edges, counts = h["edges"], h["counts"]
        ax.stairs(counts, edges, fill=True, color="#4C72B0", alpha=0.8)
        stats = doc[f"{key}_latency_s"]
        for q, style in (("p50", "--"), ("p95", ":")):
            if stats.get(q) is not None:
                ax.axvline(stats[q], color="#C44E52", linestyle=style, label=f"{q} {stats[q]:.3g} s")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("requests")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    req = doc["requests"]
    fig.suptitle(f"{req['completed']} requests completed, {req['rejected']} rejected "
                 f"({doc.get('router', '')} routing, {doc.get('mode', '')})", fontsize=9)
    return save_figure(fig, path)


def draw_bubbles(doc: dict, path: str | Path) -> Path:
    """Per GPU of one DP-cell, two training iterations (forward, recompute, backward, gradient
    sync) with the prefills placed in their bubbles on top; white is what is still idle."""
    plt = _plt()
    tr = doc["training"]
    T = tr["iteration_time_s"]
    n_iter = doc.get("fill", {}).get("iterations", 2)
    gpus = tr["gpus"]
    fills = {(f["pipeline"], f["stage"]): f["busy"] for f in doc.get("fill", {}).get("gpus", [])}
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(gpus) + 1.2)))
    for y, g in enumerate(gpus):
        for k in range(n_iter):
            for t0, t1, kind, _ in g["busy"]:
                ax.barh(y, t1 - t0, left=t0 + k * T, height=0.7, color=COLORS[kind], linewidth=0)
            a, d = g["sync"]
            ax.barh(y, d - a, left=a + k * T, height=0.7, color=COLORS["sync"], linewidth=0)
        for t0, t1 in fills.get((g["pipeline"], g["stage"]), []):
            ax.barh(y, t1 - t0, left=t0, height=0.45, color=COLORS["prefill"], linewidth=0)
    ax.set_yticks(range(len(gpus)), [f"p{g['pipeline']} s{g['stage']} ({g['dc']})" for g in gpus],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, n_iter * T)
    ax.set_xlabel("seconds")
    _legend(ax, ["F", "R", "B", "sync", "prefill"])
    ax.set_title(f"{tr['schedule']}: GPU busy {doc['utilization_before']:.0%} -> "
                 f"{doc['utilization_after']:.0%} with prefills; iteration "
                 f"{doc['iteration_time_before_s']:.3f} s -> {doc['iteration_time_after_s']:.3f} s",
                 fontsize=9)
    return save_figure(fig, path)
