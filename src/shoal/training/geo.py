"""Pipelines across datacenters: event simulation of one iteration over WAN links.

Every pipeline is a full copy of the model cut into stages; stage s of every pipeline sits in the
same datacenter, so each stage's gradient all-reduce stays inside a datacenter and only pipeline
hand-offs cross the WAN (Atlas §4.2). Four schedules:

- ``gpipe``: every forward, then every backward (Huang et al. 2019);
- ``1f1b``: Megatron's one-forward-one-backward order (Narayanan et al. 2021);
- ``varuna``: opportunistic: a GPU runs whatever is ready, backward first, then recompute of the
  microbatch whose gradient is on its way, then forward, under an in-flight cap;
- ``atlas``: pipelines grouped in DP-cells share their WAN bandwidth in time (Atlas §4.3–4.4):
  a WAN send is scattered over the cell's same-stage GPUs inside the datacenter, each sends its
  share at once (the cell's aggregate bandwidth), and the receivers gather it; a computation whose
  result crosses the WAN starts only when that send can start right after it without overlapping
  another send of the cell on that boundary and direction (otherwise it is shifted later);
  backward before forward; an in-flight cap per stage.

The baselines send on their own node pair's link, FIFO per direction; activations and gradients go
in opposite directions and do not compete. A transfer holds its link for bytes / bandwidth and
arrives one latency later. With recompute, the fixed schedules (GPipe, 1F1B) recompute right
before each backward; Varuna and Atlas recompute as soon as the next stage has started that
microbatch's backward (its gradient is on the way), so recompute overlaps the wait. The last stage
keeps its activations and never recomputes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from shoal import catalog
from shoal.errors import SpecError
from shoal.estimate import estimate
from shoal.estimate.events import Event, EventLoop
from shoal.estimate.pipeline import stage_order
from shoal.profiles import collectives
from shoal.profiles.network import bandwidth
from shoal.training.names import GEO_SCHEDULES as SCHEDULES

INTRA_DC_BPS = 100e9 / 8  # Atlas testbed: 100 Gbit/s between nodes of one datacenter (§6.1)


@dataclass(frozen=True)
class GeoJob:
    """One iteration's work. Per stage: ``stage_dc``, ``fwd_s``/``bwd_s``/``recompute_s`` (seconds
    per microbatch; recompute 0 when off) and ``grad_bytes`` (one replica's gradients). Per
    boundary s -> s+1: ``hop_bw`` (bytes/s of one node pair), ``hop_latency_s``; a boundary is a
    WAN hop when its two stages are in different datacenters."""

    stage_dc: tuple[str, ...]
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    recompute_s: tuple[float, ...]
    act_bytes: float
    grad_bytes: tuple[float, ...]
    hop_bw: tuple[float, ...]
    hop_latency_s: tuple[float, ...]
    pipelines: int
    microbatches: int
    intra_bw: float = INTRA_DC_BPS
    sync_s: tuple[float, ...] | None = None  # per stage all-reduce + update; default: ring

    def __post_init__(self):
        S = len(self.stage_dc)
        for name in ("fwd_s", "bwd_s", "recompute_s", "grad_bytes"):
            if len(getattr(self, name)) != S:
                raise ValueError(f"{name} needs one value per stage ({S})")
        for name in ("hop_bw", "hop_latency_s"):
            if len(getattr(self, name)) != S - 1:
                raise ValueError(f"{name} needs one value per stage boundary ({S - 1})")
        if self.pipelines < 1 or self.microbatches < 1:
            raise ValueError("pipelines and microbatches must be >= 1")

    @property
    def stages(self) -> int:
        return len(self.stage_dc)

    def is_wan(self, b: int) -> bool:
        return self.stage_dc[b] != self.stage_dc[b + 1]


@dataclass(frozen=True)
class Busy:
    start: float
    end: float
    kind: str  # "F", "R", "B" (compute), "prefill" (BubbleTea)
    microbatch: int


@dataclass
class GeoTimeline:
    """Per-GPU compute intervals of one iteration. GPU ``(p, s)``: pipeline p, stage s."""

    job: GeoJob
    schedule: str
    cell: int
    busy: dict[tuple[int, int], list[Busy]]
    pipeline_s: float  # makespan of the pipelined forward/backward work
    allreduce_s: tuple[float, ...]  # per stage, after its last backward
    iteration_s: float
    wan_bytes: float = 0.0  # bytes that crossed a WAN boundary (all pipelines, both directions)
    stage_end: tuple[float, ...] = field(default=())
    max_inflight: int | None = None

    def utilization(self) -> float:
        """Busy compute time over GPU time for the iteration."""
        busy = sum(b.end - b.start for ops in self.busy.values() for b in ops)
        return busy / (len(self.busy) * self.iteration_s)

    def gpu_dc(self, g: tuple[int, int]) -> str:
        return self.job.stage_dc[g[1]]

    def to_json(self) -> dict:
        return {
            "schedule": self.schedule, "cell": self.cell, "pipeline_s": self.pipeline_s,
            "iteration_time_s": self.iteration_s, "utilization": self.utilization(),
            "allreduce_s": list(self.allreduce_s), "wan_bytes": self.wan_bytes,
            "gpus": [{"pipeline": p, "stage": s, "dc": self.job.stage_dc[s],
                      "busy": [[b.start, b.end, b.kind, b.microbatch] for b in ops],
                      "sync": [self.stage_end[s], self.stage_end[s] + self.allreduce_s[s]]}
                     for (p, s), ops in sorted(self.busy.items())],
        }


def ring_allreduce_s(nbytes: float, n: int, bw: float) -> float:
    """Ring all-reduce of ``nbytes`` over n peers (Atlas fn. 1: 2 (n-1)/n x bytes / bandwidth),
    as every estimate computes it (``shoal.profiles.collectives``)."""
    return float(collectives.ring_allreduce_s(nbytes, n, bw))


def allreduce_s(job: GeoJob) -> tuple[float, ...]:
    """Per stage, its gradient all-reduce (and update) after its last backward: the job's
    ``sync_s``, else a ring over the datacenter's links."""
    return job.sync_s or tuple(ring_allreduce_s(job.grad_bytes[s], job.pipelines, job.intra_bw)
                               for s in range(job.stages))


def iteration_bounds(job: GeoJob) -> tuple[float, float]:
    """(lower, upper) bounds on one iteration of ``job``, seconds.

    Lower, for every schedule: a stage starts once the first microbatch's forward has come
    through the stages before it; its last operation is a backward, which then still runs on
    every earlier stage; stage 0 then all-reduces. So, over stages s, the forwards and hand-offs
    before s, all of s's compute (forward, recompute, backward of every microbatch; the last
    stage never recomputes), the hand-offs and backwards (recompute done ahead) back to stage 0,
    and its all-reduce; and each stage's compute and its own all-reduce. A hand-off takes at
    least its latency plus the bytes over every pipeline's link of that boundary at once (what
    Atlas's cell shares at most).

    Upper, for the schedules that wait only for inputs (``gpipe``, ``1f1b``, ``varuna``; not
    ``atlas``, which may hold a computation back for its send): all of one pipeline's work done
    one thing at a time (every compute, and every hand-off in both directions at its own
    link's bandwidth plus latency) and then the largest all-reduce; while such a pipeline is
    unfinished, one of its GPUs or links is always busy. So no schedule of the job runs more
    than ``upper / lower`` times faster than those baselines.
    """
    S, M, P = job.stages, job.microbatches, job.pipelines
    ar = allreduce_s(job)
    work = [M * (job.fwd_s[s] + job.bwd_s[s] + (job.recompute_s[s] if s < S - 1 else 0.0))
            for s in range(S)]
    fastest = [job.act_bytes / (P * job.hop_bw[b]) + job.hop_latency_s[b] for b in range(S - 1)]
    lower = max(work[s] + ar[s] for s in range(S))
    for s in range(S):
        head = sum(job.fwd_s[i] + fastest[i] for i in range(s))
        tail = sum(fastest[i] + job.bwd_s[i] for i in range(s))
        lower = max(lower, head + work[s] + tail + ar[0])
    hops = sum(2 * M * (job.act_bytes / job.hop_bw[b] + job.hop_latency_s[b])
               for b in range(S - 1))
    return lower, sum(work) + hops + max(ar)


@dataclass(frozen=True, slots=True)
class ComputeEnds(Event):
    """GPU ``gpu`` (pipeline p, stage s at index p S + s) ends its forward ("F"), recompute
    ("R") or backward ("B") of ``microbatch``."""

    gpu: int
    kind: str
    microbatch: int


@dataclass(frozen=True, slots=True)
class ActivationArrives(Event):
    """The activations of ``microbatch`` reach GPU ``gpu`` from the previous stage."""

    gpu: int
    microbatch: int


@dataclass(frozen=True, slots=True)
class GradientArrives(Event):
    """The gradient of ``microbatch`` reaches GPU ``gpu`` from the next stage."""

    gpu: int
    microbatch: int


@dataclass(frozen=True, slots=True)
class RecomputeReady(Event):
    """The next stage has started a backward, so GPU ``gpu`` may recompute that microbatch."""

    gpu: int


# At equal times the four kinds are handled first scheduled, first handled: a GPU that frees
# the instant data arrives sees both in the order their causes happened.
_ORDER = ((ComputeEnds, ActivationArrives, GradientArrives, RecomputeReady),)


def simulate(job: GeoJob, schedule: str = "atlas", *, cell: int | None = None,
             max_inflight: int | None = None,
             blocked: dict[tuple[int, int], list[tuple[float, float]]] | None = None
             ) -> GeoTimeline:
    """Simulate one iteration of ``job`` under ``schedule`` on the event core
    (``shoal.estimate.events``). ``cell``: pipelines per DP-cell (Atlas; default all).
    ``max_inflight``: forwards a stage may hold before their backward (Varuna, Atlas; default
    every microbatch). ``blocked``: per GPU ``(p, s)``, windows in which it runs something else
    (BubbleTea's prefills): training work starts only where it fits between them."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    run = _GeoRun(job, schedule, cell, max_inflight, blocked)
    loop = EventLoop({ComputeEnds: run.compute_ends, ActivationArrives: run.activation_arrives,
                      GradientArrives: run.gradient_arrives, RecomputeReady: run.recompute_ready},
                     order=_ORDER)
    for g in range(job.pipelines * job.stages):
        loop.schedule(run.dispatch(g, 0.0))
    loop.run()
    return run.timeline()


class _GeoRun:
    """The state of one ``simulate``: per GPU what has arrived and what it has done, the WAN
    channels' free times, and the handlers of the four event kinds."""

    __slots__ = ("job", "schedule", "S", "P", "M", "max_inflight", "cell", "cap", "dynamic",
                 "atlas", "recompute", "fixed_bwd", "wan", "windows", "busy", "act_at",
                 "grad_at", "f_done", "r_done", "rb", "rr", "n_f", "n_b", "orders", "pos",
                 "chan", "wan_bytes", "idle")

    def __init__(self, job: GeoJob, schedule: str, cell: int | None, max_inflight: int | None,
                 blocked: dict[tuple[int, int], list[tuple[float, float]]] | None) -> None:
        S, P, M = job.stages, job.pipelines, job.microbatches
        self.job, self.schedule, self.S, self.P, self.M = job, schedule, S, P, M
        self.max_inflight = max_inflight
        self.cell = P if cell is None else max(1, min(int(cell), P))
        self.cap = M if max_inflight is None else max(1, int(max_inflight))
        self.dynamic = schedule in ("varuna", "atlas")
        self.atlas = schedule == "atlas"
        self.recompute = [job.recompute_s[s] if s < S - 1 else 0.0 for s in range(S)]
        # the fixed schedules recompute right before each backward
        self.fixed_bwd = [job.bwd_s[s] + (self.recompute[s] if not self.dynamic else 0.0)
                          for s in range(S)]
        self.wan = [job.is_wan(b) for b in range(S - 1)]
        G = P * S
        self.windows = [sorted((blocked or {}).get((g // S, g % S), [])) for g in range(G)]
        self.busy: list[list[Busy]] = [[] for _ in range(G)]
        self.act_at: list[list[float | None]] = [[None] * M for _ in range(G)]
        self.grad_at: list[list[float | None]] = [[None] * M for _ in range(G)]
        self.f_done = [[False] * M for _ in range(G)]
        self.r_done = [[False] * M for _ in range(G)]
        self.rb: list[list[int]] = [[] for _ in range(G)]  # dynamic: backwards ready (heap)
        self.rr: list[list[int]] = [[] for _ in range(G)]  # dynamic: recomputes ready (heap)
        self.n_f = [0] * G
        self.n_b = [0] * G
        self.orders = [stage_order("gpipe" if schedule == "gpipe" else "1f1b", S, s, M)
                       for s in range(S)]
        self.pos = [0] * G
        self.chan: dict[tuple, float] = {}  # link or cell channel -> time it is free
        self.wan_bytes = 0.0
        self.idle = [True] * G

    # ---- links ------------------------------------------------------------------------------
    def cell_of(self, p: int) -> tuple[int, int]:
        """(DP-cell of pipeline p, pipelines in that cell)."""
        c = p // self.cell
        return c, min(self.cell, self.P - c * self.cell)

    def spread_s(self, p: int) -> float:
        """Atlas: seconds to scatter a WAN send over the cell's GPUs (and to gather it)."""
        k = self.cell_of(p)[1]
        return (k - 1) / k * self.job.act_bytes / self.job.intra_bw

    def chan_key(self, p: int, b: int, d: int) -> tuple:
        """The channel a send of pipeline p over boundary b in direction d (0 down, 1 up)
        holds: the cell's on an Atlas WAN hop, else the node pair's link."""
        if self.atlas and self.wan[b]:
            return ("cell", self.cell_of(p)[0], b, d)
        return ("pair", p, b, d)

    def send_plan(self, p: int, b: int, d: int, t_ready: float) -> tuple[float, float, float]:
        """(channel start, channel free after, arrival) for a send over boundary b in direction
        d whose data is ready at t_ready; the channel is not reserved."""
        job, nb = self.job, self.job.act_bytes
        key = self.chan_key(p, b, d)
        if key[0] == "cell":
            k = self.cell_of(p)[1]
            spread = self.spread_s(p)  # scatter before, gather after
            start = max(t_ready + spread, self.chan.get(key, 0.0))
            hold = nb / (k * job.hop_bw[b])
            return start, start + hold, start + hold + spread + job.hop_latency_s[b]
        start = max(t_ready, self.chan.get(key, 0.0))
        hold = nb / job.hop_bw[b]
        return start, start + hold, start + hold + job.hop_latency_s[b]

    def send(self, p: int, b: int, d: int, t_ready: float, m: int) -> Event:
        """Reserve the channel for microbatch m's send; its arrival."""
        _, free_after, arrive = self.send_plan(p, b, d, t_ready)
        self.chan[self.chan_key(p, b, d)] = free_after
        if self.wan[b]:
            self.wan_bytes += self.job.act_bytes
        if d == 0:
            return ActivationArrives(arrive, p * self.S + b + 1, m)
        return GradientArrives(arrive, p * self.S + b, m)

    def out_hop(self, g: int, kind: str) -> tuple[int, int] | None:
        """(boundary, direction) a computation's result crosses, if any."""
        s = g % self.S
        if kind == "F" and s < self.S - 1:
            return s, 0
        if kind == "B" and s > 0:
            return s - 1, 1
        return None

    # ---- what a GPU may run -----------------------------------------------------------------
    def ready(self, g: int, kind: str, m: int) -> bool:
        s = g % self.S
        if kind == "F":
            return s == 0 or self.act_at[g][m] is not None
        if s == self.S - 1:
            return self.f_done[g][m]
        return self.grad_at[g][m] is not None and (
            self.r_done[g][m] or not self.dynamic or self.recompute[s] == 0.0)

    def note_b(self, g: int, m: int) -> None:
        """Backward m of GPU g may have become ready (dynamic schedules)."""
        if self.dynamic and self.ready(g, "B", m):
            heapq.heappush(self.rb[g], m)

    def duration(self, g: int, kind: str) -> float:
        s = g % self.S
        if kind == "F":
            return self.job.fwd_s[s]
        if kind == "R":
            return self.recompute[s]
        return self.fixed_bwd[s]

    def candidates(self, g: int) -> list[tuple[str, int]]:
        """What GPU g could run next: the fixed order's next operation once ready; for the
        dynamic schedules the lowest ready backward, then recompute, then the next forward
        under the in-flight cap."""
        if not self.dynamic:
            order = self.orders[g % self.S]
            if self.pos[g] < len(order):
                k, m = order[self.pos[g]]
                if self.ready(g, k, m):
                    return [(k, m)]
            return []
        out = []
        if self.rb[g]:
            out.append(("B", self.rb[g][0]))
        if self.rr[g]:
            out.append(("R", self.rr[g][0]))
        n_f = self.n_f[g]
        if n_f - self.n_b[g] < self.cap and n_f < self.M and self.ready(g, "F", n_f):
            out.append(("F", n_f))
        return out

    def earliest_start(self, g: int, kind: str, dur: float, now: float) -> float:
        """When GPU g could start ``kind``: now, or for Atlas on a WAN hop so late that its
        send starts right at its end, and outside the GPU's blocked windows."""
        start = now
        hop = self.out_hop(g, kind) if self.atlas else None
        if hop is not None and self.wan[hop[0]]:
            p = g // self.S
            c_start, _, _ = self.send_plan(p, hop[0], hop[1], now + dur)
            start = max(now, c_start - self.spread_s(p) - dur)
        for a, b in self.windows[g]:
            if b <= start + 1e-9 or a >= start + dur - 1e-9:  # touching is not overlapping
                continue
            start = b
        return start

    def dispatch(self, g: int, now: float) -> list[Event]:
        """If GPU g is idle, start the candidate that can start first; the events it causes."""
        if not self.idle[g]:
            return []
        best = None
        shifts = self.atlas or self.windows[g]  # else every candidate could start now
        for k, m in self.candidates(g):
            dur = self.duration(g, k)
            start = self.earliest_start(g, k, dur, now) if shifts else now
            if best is None or start < best[0]:
                best = (start, k, m, dur)
        if best is None:
            return []
        start, k, m, dur = best
        end = start + dur
        self.idle[g] = False
        if not self.dynamic:
            self.pos[g] += 1
        elif k == "B":
            heapq.heappop(self.rb[g])
        elif k == "R":
            heapq.heappop(self.rr[g])
        self.busy[g].append(Busy(start, end, k, m))
        out: list[Event] = []
        hop = self.out_hop(g, k)
        if hop is not None and self.atlas and self.wan[hop[0]]:
            out.append(self.send(g // self.S, hop[0], hop[1], end, m))  # reserve the cell now
        out.append(ComputeEnds(end, g, k, m))
        s = g % self.S
        if k == "B" and s > 0 and self.dynamic and self.recompute[s - 1] > 0:
            # the gradient is on its way: the previous stage may recompute this microbatch now
            heapq.heappush(self.rr[g - 1], m)
            out.append(RecomputeReady(start, g - 1))
        return out

    # ---- handlers ---------------------------------------------------------------------------
    def compute_ends(self, ev: ComputeEnds) -> list[Event]:
        g, k, m = ev.gpu, ev.kind, ev.microbatch
        self.idle[g] = True
        if k == "F":
            self.f_done[g][m] = True
            self.n_f[g] += 1
            if g % self.S == self.S - 1:
                self.note_b(g, m)
        elif k == "R":
            self.r_done[g][m] = True
            self.note_b(g, m)
        else:
            self.n_b[g] += 1
        out: list[Event] = []
        hop = self.out_hop(g, k)
        if hop is not None and not (self.atlas and self.wan[hop[0]]):
            out.append(self.send(g // self.S, hop[0], hop[1], ev.time_s, m))
        return out + self.dispatch(g, ev.time_s)

    def activation_arrives(self, ev: ActivationArrives) -> list[Event]:
        self.act_at[ev.gpu][ev.microbatch] = ev.time_s
        return self.dispatch(ev.gpu, ev.time_s) if self.idle[ev.gpu] else []

    def gradient_arrives(self, ev: GradientArrives) -> list[Event]:
        self.grad_at[ev.gpu][ev.microbatch] = ev.time_s
        self.note_b(ev.gpu, ev.microbatch)
        return self.dispatch(ev.gpu, ev.time_s) if self.idle[ev.gpu] else []

    def recompute_ready(self, ev: RecomputeReady) -> list[Event]:
        return self.dispatch(ev.gpu, ev.time_s) if self.idle[ev.gpu] else []

    def timeline(self) -> GeoTimeline:
        """The iteration: compute intervals, then each stage's all-reduce after its last
        backward."""
        S, P, job = self.S, self.P, self.job
        stage_end = [max(self.busy[p * S + s][-1].end for p in range(P)) for s in range(S)]
        ar = allreduce_s(job)
        return GeoTimeline(
            job=job, schedule=self.schedule, cell=self.cell,
            busy={(p, s): self.busy[p * S + s] for p in range(P) for s in range(S)},
            pipeline_s=max(stage_end), allreduce_s=ar,
            iteration_s=max(stage_end[s] + ar[s] for s in range(S)), wan_bytes=self.wan_bytes,
            stage_end=tuple(stage_end), max_inflight=self.max_inflight)


@dataclass(frozen=True)
class JobShape:
    """How a job built from a layer profile runs: ``pipelines`` pipelines of ``microbatches``
    microbatches of ``mbs`` samples each, every stage at TP ``tp``, recomputing activations in
    the backward or not."""

    mbs: int
    microbatches: int
    pipelines: int
    recompute: bool = True
    tp: int = 1


def job_from_profile(profile, gpu: str, stage_layers: list[tuple[int, int]],
                     stage_dc: list[str], link, shape: JobShape, *,
                     intra_bw: float = INTRA_DC_BPS) -> GeoJob:
    """A ``GeoJob`` of ``shape`` from a layer profile (``layer_times(gpu, tp, mbs)`` rows of
    forward, backward, update seconds per layer of the layer list) for stages holding the
    half-open layer ranges ``stage_layers``. ``link(dc_a, dc_b)`` gives (bytes/s of a node
    pair, one-way latency) between two datacenters."""
    tp, mbs = shape.tp, shape.mbs
    lt = profile.layer_times(gpu, tp, mbs)
    fwd = tuple(float(lt[a:b, 0].sum()) for a, b in stage_layers)
    bwd = tuple(float(lt[a:b, 1].sum()) for a, b in stage_layers)
    params = profile.sizes.params
    grad = tuple(float(params[a:b].sum()) * 2.0 / tp for a, b in stage_layers)  # fp16 gradients
    hops = [link(stage_dc[s], stage_dc[s + 1]) if stage_dc[s] != stage_dc[s + 1]
            else (intra_bw, 0.0) for s in range(len(stage_dc) - 1)]
    return GeoJob(
        stage_dc=tuple(stage_dc), fwd_s=fwd, bwd_s=bwd,
        recompute_s=fwd if shape.recompute else (0.0,) * len(fwd),
        act_bytes=float(profile.sizes.boundary_bytes) * mbs / tp, grad_bytes=grad,
        hop_bw=tuple(h[0] for h in hops), hop_latency_s=tuple(h[1] for h in hops),
        pipelines=shape.pipelines, microbatches=shape.microbatches, intra_bw=intra_bw)


def job_from_plan(problem, plan, est=None, *, file: str | None = None) -> GeoJob:
    """The ``GeoJob`` of a training plan whose stages each sit in one region (a datacenter) with
    the same number of replicas and equal microbatch shares: compute, hand-off and
    gradient-sync times from shoal's estimator (``estimate``), links from the scenario's
    network (WAN links between regions)."""
    est = est or estimate(problem, plan, file=file)
    reg = catalog.gpus()
    dcs, firsts = [], []
    n_rep = len(plan.stages[0].replicas)
    total = sum(r.microbatches for r in plan.stages[0].replicas)
    share = plan.stages[0].replicas[0].microbatches
    for s, st in enumerate(plan.stages):
        regions = {problem.zone_region[r.zone] for r in st.replicas}
        if len(regions) > 1:
            raise SpecError("a stage's replicas span regions; pipelines across datacenters keep "
                            "each stage in one region", file=file, field=f"stages.{s}.replicas",
                            value=sorted(regions))
        if len(st.replicas) != n_rep or any(r.microbatches != share for r in st.replicas):
            raise SpecError("every stage needs the same number of replicas with equal "
                            "microbatch shares", file=file, field=f"stages.{s}.replicas",
                            value=[r.microbatches for r in st.replicas],
                            allowed=(f"{n_rep} replicas of {total // n_rep} microbatches"
                                     if total % n_rep == 0 else
                                     f"a replica count that divides the {total} microbatches"))
        dcs.append(regions.pop())
        firsts.append(st.replicas[0])
    nbytes = float(problem.sizes.boundary_bytes) * plan.microbatch_size
    hop_bw, hop_lat = [], []
    for a, b in zip(firsts, firsts[1:]):
        link = problem.network.link(a.zone, b.zone, reg.canonical(a.gpu), reg.canonical(b.gpu))
        hop_bw.append(float(bandwidth(link.single, nbytes)))
        hop_lat.append(link.latency_s)
    z = firsts[0].zone
    intra = problem.network.link(z, z)
    rec = plan.recompute
    fwd = tuple(st.compute_fwd_s for st in est.stages)
    bwd = tuple(st.compute_bwd_s - (f if rec else 0.0) for st, f in zip(est.stages, fwd))
    return GeoJob(
        stage_dc=tuple(dcs), fwd_s=fwd, bwd_s=bwd, recompute_s=fwd if rec else (0.0,) * len(fwd),
        act_bytes=nbytes, grad_bytes=(0.0,) * len(fwd), hop_bw=tuple(hop_bw),
        hop_latency_s=tuple(hop_lat), pipelines=n_rep, microbatches=share,
        intra_bw=float(bandwidth(intra.single, nbytes)),
        sync_s=tuple(st.gradient_sync_s + st.update_s for st in est.stages))
