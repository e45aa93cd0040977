"""The readable tables of ``shoal bubbles``: training GPUs before and after prefill fills their
bubbles, the prefill requests, and the load the bubbles sustain. ``s`` is the placement's
``summary()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.report.tables import Table
from shoal.units import fmt_seconds

if TYPE_CHECKING:
    from shoal.training.bubbles import Sustainable


def _time(t: float | None) -> str:
    return fmt_seconds(t) if t is not None else "-"


def training_table(s: dict) -> Table:
    t = Table("training GPUs", ["", "before", "after"], left=("",))
    t.add_row("GPU busy", f"{s['utilization_before']:.1%}", f"{s['utilization_after']:.1%}")
    t.add_row("training iteration", fmt_seconds(s["iteration_time_before_s"]),
              fmt_seconds(s["iteration_time_after_s"]))
    t.add_row("prefills rejected", "", f"{s['rejected_fraction']:.1%}")
    return t


def estimate_note(estimate_s: float, recompute: bool) -> str:
    """Why ``shoal estimate``'s iteration time for the plan differs from the simulation's."""
    return (f"(`shoal estimate` gives {fmt_seconds(estimate_s)} for this plan: its pipeline "
            "formula adds each microbatch's hand-off to its stage's busy time"
            + (" and recomputes on every stage" if recompute else "")
            + ", where this event simulation overlaps hand-offs with other microbatches' "
            "compute" + (" and the last stage keeps its activations" if recompute else "") + ")")


def requests_table(s: dict) -> Table:
    q = Table("prefill requests", ["placed", "rejected", "TTFT p50", "TTFT p95", "decision p50"])
    q.add_row(f"{s['requests']['placed']}", f"{s['rejected_fraction']:.1%}",
              _time(s["ttft_s"]["p50"]), _time(s["ttft_s"]["p95"]),
              f"{s['decision_us']['p50']:.0f} us")
    return q


def rejected_warning(s: dict, sus: Sustainable) -> str | None:
    """What to warn of when more prefills were turned away than the sustainable load allows."""
    if s["rejected_fraction"] <= sus.max_rejected:
        return None
    return (f"{s['rejected_fraction']:.1%} of these prefills "
            f"were turned away: the GPU busy after ({s['utilization_after']:.1%}) counts "
            f"only the {1 - s['rejected_fraction']:.1%} placed")


def sustainable(sus: Sustainable) -> Table | str:
    """The highest request rate served with at most ``sus.max_rejected`` turned away, as a
    table; when there is none, why, and the rates longer waits would sustain."""
    if sus.rate_per_s is None:
        return _unsustainable(sus)
    a = sus.result
    q = Table(f"sustainable load (at most {sus.max_rejected:.0%} rejected)",
              ["requests/s", "rejected", "GPU busy", "training iteration", "TTFT p95"])
    q.add_row(f"{sus.rate_per_s:.3g}", f"{a['rejected_fraction']:.1%}",
              f"{a['utilization_before']:.1%} -> {a['utilization_after']:.1%}",
              f"{fmt_seconds(a['iteration_time_before_s'])} -> "
              f"{fmt_seconds(a['iteration_time_after_s'])}",
              _time(a["ttft_s"]["p95"]))
    return q


def _unsustainable(sus: Sustainable) -> str:
    msg = (f"no request rate is served with at most {sus.max_rejected:.0%} rejected at "
           f"--max-wait {fmt_seconds(sus.max_wait_s)}: even at {sus.lowest_rate_per_s:.3g}/s, "
           f"{sus.floor:.1%} of the prefills find no bubble long enough within the wait")
    if sus.relaxed:
        msg += "; with a longer --max-wait: " + ", ".join(
            f"{fmt_seconds(r['max_wait_s'])} "
            + (f"{r['rate_per_s']:.3g}/s (GPU busy {r['utilization_after']:.1%})"
               if r["rate_per_s"] is not None else
               f"none ({r['rejected_at_lowest_rate']:.1%} rejected at the lowest rate)")
            for r in sus.relaxed)
    return msg
