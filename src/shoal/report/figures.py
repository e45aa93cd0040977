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
