"""Figures (matplotlib, written as PNG without a display)."""

from __future__ import annotations

from pathlib import Path

from shoal.files import save_png


def draw_pareto(result, path: str | Path) -> Path:
    """Iterations/s against $/iteration: every costed feasible plan on the front, the chosen
    plan marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    front = result.pareto
    ax.plot([c.cost_usd for c in front], [c.throughput_iters_per_s for c in front], "o-",
            color="#4C72B0", label="Pareto front")
    best = result.ranked[0]
    ax.plot([best.cost_usd], [best.throughput_iters_per_s], "*", markersize=14, color="#C44E52",
            label=f"best for {result.objective}")
    ax.set_xlabel("USD per iteration")
    ax.set_ylabel("iterations per second")
    ax.set_title(f"{len(front)} plans on the front ({result.stats.candidates_costed} costed, "
                 f"{result.stats.search_time_s:.2f} s, {result.stats.strategy})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, path)


def draw_replay(replays, trace, path: str | Path) -> Path:
    """Over the trace: GPUs available per type and zone; each policy's tokens/s (zero while
    switching or idle over a whole state) and cumulative tokens, with its moves marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    h = 1 / 3600
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ends = [*(s.time_s for s in trace.states[1:]), trace.end_s]
    keys = sorted({k for s in trace.states for k in s.avail})
    for k in keys:
        ys = [s.avail.get(k, 0) for s in trace.states]
        axes[0].step([s.time_s * h for s in trace.states] + [trace.end_s * h], ys + ys[-1:],
                     where="post", label=f"{k[0]} @ {k[1]}")
    axes[0].set_ylabel("GPUs available")
    axes[0].legend(fontsize=7, ncol=2)
    for rep in replays:
        t = np.array([s.time_s for s in rep.steps])
        rate = np.array([s.tokens / s.duration_s if s.duration_s > 0 else 0.0 for s in rep.steps])
        line = axes[1].step(np.append(t, ends[-1]) * h, np.append(rate, rate[-1:]), where="post",
                            label=rep.policy)[0]
        cum = np.concatenate([[0.0], np.cumsum([s.tokens for s in rep.steps])])
        axes[2].plot(np.append(t, ends[-1]) * h, cum, color=line.get_color(), label=rep.policy)
        moves = [s.time_s * h for s in rep.steps if s.decision in ("switch", "forced", "start")]
        axes[1].plot(moves, [0] * len(moves), "|", markersize=12, color=line.get_color())
    axes[1].set_ylabel("tokens/s (state mean)")
    axes[1].legend(fontsize=8)
    axes[2].set_ylabel("cumulative tokens")
    axes[2].set_xlabel("hours (ticks on the middle axis: plan moves)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set_title(f"replay of {trace.source}")
    return save_png(fig, path)


def draw_placement(cluster, placed, path: str | Path) -> Path:
    """Each node's layer range as a bar (colour by node type, label its tokens/s through it)
    and the links the max flow uses as lines from one range's end to the next one's start,
    thicker for more flow: where the pipeline narrows is where to look."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pl, fl = placed.placement, placed.flow
    held = sorted((r[0], r[1], i) for i, r in enumerate(pl.ranges) if r is not None)
    row = {i: k for k, (_, _, i) in enumerate(held)}
    types = sorted({cluster.machines[i] for _, _, i in held})
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.28 * len(held) + 1.5)))
    top = max(fl.edges.values(), default=1.0)
    for (u, v), f in fl.edges.items():
        if isinstance(u, int) and isinstance(v, int):
            x = pl.ranges[u][1]
            ax.plot([x, x], [row[u], row[v]], color="#555555", alpha=0.6,
                    linewidth=0.5 + 3.0 * f / top)
    for s, e, i in held:
        c = colours(types.index(cluster.machines[i]) % 10)
        ax.barh(row[i], e - s, left=s, height=0.7, color=c, edgecolor="black", linewidth=0.4)
        ax.text(e + 0.3, row[i], f"{fl.through[i]:,.0f}", va="center", fontsize=6)
    from matplotlib.patches import Patch

    handles = [Patch(color=colours(k % 10), label=t) for k, t in enumerate(types)]
    ax.set_yticks(range(len(held)), [f"{cluster.names[i]} ({cluster.regions[i]})"
                                     if len(set(cluster.regions)) > 1 else cluster.names[i]
                                     for _, _, i in held], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(0, cluster.layers * 1.12)
    ax.set_xlabel("layer")
    ax.set_title(f"{placed.placer}: {fl.value:,.1f} tokens/s max flow "
                 f"(upper bound {placed.upper_bound:,.1f}); labels: tokens/s through each node",
                 fontsize=9)
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    ax.grid(axis="x", alpha=0.3)
    return save_png(fig, path)
