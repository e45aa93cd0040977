"""The readable tables of ``shoal replay``: the plan at every availability change, the totals per
policy, and what the re-planning took."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.report.tables import Table, seconds
from shoal.units import fmt_per_usd

if TYPE_CHECKING:
    from shoal.elastic.replan import Replanner
    from shoal.elastic.replay import Replay
    from shoal.elastic.traces import Trace


def avail_text(avail: dict, zones: list[str]) -> str:
    """'A100-40GB 8/0, V100-16GB 8/8': GPUs of each type per zone, zones in ``zones`` order."""
    gpus = sorted({g for g, _ in avail})
    return ", ".join(f"{g} " + "/".join(str(avail.get((g, z), 0)) for z in zones) for g in gpus)


def steps_table(rep: Replay, cut: list[bool]) -> Table:
    """One row per availability state (``cut``: whether its search hit the time budget)."""
    zones = sorted({z for s in rep.steps for _, z in s.avail})
    t = Table(f"Plan per availability change (policy {rep.policy}; GPUs available per zone: "
              f"{'/'.join(zones)})",
              ["time", "available", "decision", "it/s", "$/h GPUs\n+ egress", "move cost",
               "switching", "plan"],
              left=("available", "decision", "plan"))
    for s, timed_out in zip(rep.steps, cut, strict=True):
        p = s.plan
        t.add_row(f"{s.time_s / 3600:.2f} h" + (" *" if timed_out else ""),
                  avail_text(s.avail, zones), s.decision,
                  f"{1 / p.iteration_time_s:.4g}" if p else "-",
                  f"{p.usd_per_s * 3600:,.1f} + {p.egress_usd_per_s * 3600:,.1f}" if p else "-",
                  seconds(s.switch.total_s) if s.switch else "",
                  seconds(s.switch_s) if s.switch_s > 0 else "",
                  p.cand.plan.summary() if p and s.decision != "keep" else "")
    return t


def totals_table(trace: Trace, runs: list[Replay]) -> Table:
    t = Table(f"Totals over {trace.end_s / 3600:.2f} h of {trace.source}",
              ["policy", "tokens", "USD", "tokens/USD", "moves", "switching", "checkpoints"],
              left=("policy",))
    for r in runs:
        tot = r.totals()
        t.add_row(r.policy, f"{tot['tokens']:.4g}", f"{tot['cost_usd']:,.2f}",
                  fmt_per_usd(tot["tokens_per_usd"]), str(tot["switches"]),
                  seconds(tot["switch_time_s"]), seconds(tot["checkpoint_time_s"]))
    return t


def notes(trace: Trace, runs: list[Replay], replanner: Replanner, budget_s: float) -> list[str]:
    """What the totals leave out (work lost at the end), and what planning the states took."""
    out = []
    lost = [f"{r.policy} {r.lost_tokens:.4g}" for r in runs if r.lost_tokens > 0]
    if lost:
        out.append("Not in the tokens: work trained, then lost and not redone by the trace's end: "
                   + ", ".join(lost))
    calls = [c.time_s for c in replanner.calls if not c.remembered]
    if calls:
        out.append(f"{len(trace.states)} availability states, {len(calls)} distinct: planned in "
                   f"{sum(calls):.2f} s (slowest {max(calls):.2f} s)")
    cut = [c.timed_out for c in replanner.calls]
    if any(cut):
        out.append(f"{sum(cut)} states' searches were cut short by --budget {budget_s:g} s "
                   "(marked *): a larger budget may find faster plans for them")
    return out
