"""The readable tables of ``shoal estimate`` and ``shoal plan``, and what every command's tables
are made of: ``Table``, a title, columns and rows of text, which the command line draws on the
terminal (``cli.common.render``). Built here with no terminal library, printed by the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shoal.units import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from shoal.estimate.api import Estimate, WorkerMemory
    from shoal.specs.job import Deadline
    from shoal.training.planners.common import Progress, SearchResult, SearchStats


@dataclass(frozen=True)
class Styled:
    """A cell shown in a style ("bold red", "green"; "": none) and taken as plain text (the
    terminal reads other cells' [brackets] as markup)."""

    text: str
    style: str = ""


Cell = str | Styled


@dataclass
class Table:
    """A table as a command shows it: a title, columns (those named in ``left`` aligned left,
    the others right; those in ``whole``, GPU types and zones, never split across lines), rows
    of cells each with an optional style, and a caption under it. ``listing``: a list of what
    and value, two columns with no header."""

    title: str
    columns: list[str]
    left: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    caption: str | None = None
    listing: bool = False
    rows: list[tuple[tuple[Cell, ...], str | None]] = field(default_factory=list)

    def add_row(self, *cells: Cell, style: str | None = None) -> None:
        self.rows.append((cells, style))


def written_table(written: dict) -> Table:
    """The files a command wrote: name -> path."""
    t = Table("Written", ["file", "path"], left=("file", "path"))
    for name, path in written.items():
        t.add_row(name, str(path))
    return t


def seconds(t: float) -> str:
    """A duration in a table cell: ``fmt_seconds``, or 0 for none."""
    return fmt_seconds(t) if t > 0 else "0"


# ---------------------------------------------------------------------------------------- estimate


def stage_table(est: Estimate) -> Table:
    t = Table("Stages (per-microbatch times of the slowest replica)",
              ["stage", "layers", "replicas", "fwd\n/mb", "bwd\n/mb", "send/recv\n/mb", "grad\nsync",
               "update", "busy", "bubble", "profile"], left=("layers", "profile"),
              caption="* straggler: the stage whose busiest replica works longest; it sets the pace")
    for s in est.stages:
        a, b = s.layers
        t.add_row(
            Styled(f"{s.stage}*", "bold yellow") if s.straggler else Styled(f"{s.stage} "),
            f"[{a}, {b})", str(s.replicas), seconds(s.compute_fwd_s), seconds(s.compute_bwd_s),
            seconds(s.send_recv_s), seconds(s.gradient_sync_s), seconds(s.update_s),
            seconds(s.busy_s), seconds(s.bubble_s), s.profile_source,
        )
    return t


def worker_table(est: Estimate) -> Table:
    t = Table("Workers (peak memory per GPU; in flight = microbatches whose activations are held; "
              "identical neighbouring replicas share a row)",
              ["stage", "replica", "gpu", "zone", "tp", "peak\nmemory", "capacity", "used",
               "in flight", "memory"], left=("gpu", "zone"), whole=("gpu", "zone"))
    for first, last in _runs(est.workers):
        w = first
        used = w.peak_memory_bytes / w.capacity_bytes if w.capacity_bytes else float("inf")
        reps = str(w.replica) if first is last else f"{first.replica}-{last.replica}"
        t.add_row(
            str(w.stage), reps, w.gpu, w.zone, str(w.tp), fmt_bytes(w.peak_memory_bytes),
            fmt_bytes(w.capacity_bytes), f"{used:.0%}", str(w.microbatches_in_flight),
            Styled("OOM", "bold red") if w.oom else "ok", style="red" if w.oom else None,
        )
    return t


def _runs(workers: list[WorkerMemory]) -> list[tuple]:
    """(first, last) of each run of consecutive replicas of a stage that would print the same."""
    def key(w):
        return (w.stage, w.gpu, w.zone, w.tp, round(w.peak_memory_bytes), round(w.capacity_bytes),
                w.microbatches_in_flight, w.oom)

    runs: list[list] = []
    for w in workers:
        if runs and key(runs[-1][1]) == key(w) and runs[-1][1].replica + 1 == w.replica:
            runs[-1][1] = w
        else:
            runs.append([w, w])
    return [tuple(r) for r in runs]


def summary_table(est: Estimate) -> Table:
    t = Table("Summary", ["what", "value"], listing=True)
    n_oom = sum(w.oom for w in est.workers)
    t.add_row("GPUs", str(est.num_gpus))
    t.add_row("iteration time", fmt_seconds(est.iteration_time_s))
    t.add_row("iterations/s", f"{est.throughput_iters_per_s:.4g}")
    t.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    t.add_row("MFU", f"{est.mfu:.1%}")
    unknown = f"n/a (no price for {', '.join(est.unpriced_gpus)})"
    t.add_row("$/iteration compute", unknown if est.cost_unknown else f"{est.cost_compute_usd:.4f}")
    t.add_row("$/iteration egress", f"{est.cost_egress_usd:.4f}")
    t.add_row("$/iteration total",
              unknown if est.cost_unknown else f"{est.cost_per_iteration_usd:.4f}")
    t.add_row("peak memory", fmt_bytes(est.peak_memory_bytes))
    t.add_row("memory", Styled(f"OOM on {n_oom} of {len(est.workers)} workers", "bold red")
              if est.oom else Styled("fits on every worker", "green"))
    return t


# -------------------------------------------------------------------------------------------- plan


STAGES = "stages: GPU(TP) x replicas @ zone"


def plans_table(result: SearchResult, tokens_per_iter: int, slo: Deadline | None) -> Table:
    """The ranked plans; with a training-time SLO, each plan's dollars and time for it."""
    t = Table(f"Best plans ({result.objective}, {result.stats.strategy})",
              ["#", "it/s", "tokens/s", "$/iter"]
              + ([f"$ for {slo.iterations:,} it", f"time for {slo.iterations:,} it"] if slo else [])
              + ["GPUs", "stages", "pipelines", "mbs", "schedule", "layers", STAGES],
              left=(STAGES,))
    for i, c in enumerate(result.ranked):
        p = c.plan
        total = ([f"{c.cost_usd * slo.iterations:,.4g}",
                  fmt_seconds(c.iteration_time_s * slo.iterations)] if slo else [])
        t.add_row(str(i + 1), f"{c.throughput_iters_per_s:.4g}",
                  f"{tokens_per_iter * c.throughput_iters_per_s:,.0f}",
                  f"{c.cost_usd:.4g}", *total, str(c.num_gpus), str(len(p.stages)),
                  str(len(p.stages[0].replicas)), str(p.microbatch_size),
                  p.schedule + (f" x{p.ministages}" if p.schedule == "zorse" else ""),
                  p.layer_split(), p.summary(zones=True))
    return t


def rent_table(rows: list[dict]) -> Table:
    """``training.rent.rent``'s rows: GPUs and VMs per zone and GPU type."""
    t = Table("What to rent for plan 1", ["zone", "GPU", "GPUs", "VMs (count x GPUs each)"],
              left=("zone", "GPU", "VMs (count x GPUs each)"))
    for row in rows:
        t.add_row(row["zone"], row["gpu"], str(row["gpus"]),
                  " + ".join(f"{v['count']} x {v['gpus_per_vm']}" for v in row["vms"]))
    return t


def pareto_table(result: SearchResult) -> Table:
    t = Table("Throughput-cost Pareto front", ["it/s", "$/iter", "GPUs", "layers", STAGES],
              left=(STAGES,))
    for c in result.pareto:
        t.add_row(f"{c.throughput_iters_per_s:.4g}", f"{c.cost_usd:.4g}", str(c.num_gpus),
                  c.plan.layer_split(), c.plan.summary(zones=True))
    return t


def search_line(st: SearchStats) -> str:
    """How long the search took and what it costed, pruned and cut short."""
    cut = (" (interrupted: the best plans found until then)" if st.interrupted else
           " (time budget reached: the search was cut short)" if st.truncated else "")
    return (f"searched in {st.search_time_s:.2f} s: {st.candidates_costed} plans costed, {st.oom} out "
            f"of memory, {st.infeasible} against a constraint, {st.pruned} shapes pruned" + cut)


def progress_line(strategy: str, p: Progress, budget_s: float | None) -> str:
    """A running search (``planners.Progress``): its best plan so far, plans costed, time."""
    best = ("no plan yet" if p.best_iteration_time_s is None else
            f"best so far {1 / p.best_iteration_time_s:.4g} it/s at "
            f"{p.best_cost_usd:.4g} USD/iteration")
    of = f" of {budget_s:g} s" if budget_s is not None else ""
    return (f"searching plans ({strategy}): {best}; {p.costed:,} plans costed; "
            f"{p.elapsed_s:.1f} s{of} (Ctrl-C: stop with the best so far)")


def _gbs(bw_Bps: float) -> str:
    return f"{bw_Bps / 1e9:.3g} GB/s"


def network_defaults_line(defaults: list[dict]) -> str | None:
    """One line saying which links the catalog gave because the scenario did not
    (``Problem.network_defaults``): per cloud and distance, each GPU pair's bandwidth of one
    flow and the latency; then the intra-node links it gave. None when no link between nodes
    came from the catalog."""
    links = [d for d in defaults if d["kind"] == "link"]
    if not links:
        return None
    groups: dict[tuple[str, str], list[dict]] = {}
    for d in links:
        groups.setdefault((d["cloud"], d["distance"]), []).append(d)
    parts = []
    for (cloud, dist), ds in groups.items():
        pairs = ", ".join(dict.fromkeys(
            f"{'/'.join(d['gpus']) or 'no GPUs'} {_gbs(d['bandwidth_Bps'])}" for d in ds))
        lat = sorted({fmt_seconds(d["latency_s"]) if d["latency_s"] else "none added"
                      for d in ds})
        parts.append(f"{cloud} {dist.replace('_', '-')} ({pairs} per flow; latency "
                     f"{', '.join(lat)})")
    intra = [d for d in defaults if d["kind"] == "intra_node"]
    if intra:
        parts.append("intra-node " + ", ".join(f"{d['gpu']} {_gbs(d['bandwidth_Bps'])}"
                                               for d in intra))
    return ("network: catalog defaults for " + "; ".join(parts)
            + " (network.defaults or network.links override them; --json names the sources)")
