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

from shoal.estimate.pipeline import stage_order
from shoal.profiles import collectives

SCHEDULES = ("gpipe", "1f1b", "varuna", "atlas")
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


def simulate(job: GeoJob, schedule: str = "atlas", *, cell: int | None = None,
             max_inflight: int | None = None,
             blocked: dict[tuple[int, int], list[tuple[float, float]]] | None = None
             ) -> GeoTimeline:
    """Simulate one iteration of ``job`` under ``schedule``. ``cell``: pipelines per DP-cell
    (Atlas; default all). ``max_inflight``: forwards a stage may hold before their backward
    (Varuna, Atlas; default every microbatch). ``blocked``: per GPU ``(p, s)``, windows in which
    it runs something else (BubbleTea's prefills): training work starts only where it fits
    between them."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    S, P, M = job.stages, job.pipelines, job.microbatches
    cell = P if cell is None else max(1, min(int(cell), P))
    cap = M if max_inflight is None else max(1, int(max_inflight))
    dynamic = schedule in ("varuna", "atlas")
    atlas = schedule == "atlas"
    recompute = [job.recompute_s[s] if s < S - 1 else 0.0 for s in range(S)]
    fixed_bwd = [job.bwd_s[s] + (recompute[s] if not dynamic else 0.0) for s in range(S)]
    wan = [job.is_wan(b) for b in range(S - 1)]

    def gid(p: int, s: int) -> int:
        return p * S + s

    G = P * S
    windows = [sorted((blocked or {}).get((g // S, g % S), [])) for g in range(G)]

    def unblocked(g: int, start: float, dur: float) -> float:
        for a, b in windows[g]:
            if b <= start + 1e-9 or a >= start + dur - 1e-9:  # touching is not overlapping
                continue
            start = b
        return start

    free_at = [0.0] * G
    busy: list[list[Busy]] = [[] for _ in range(G)]
    act_at = [[None] * M for _ in range(G)]  # activation of microbatch m arrived (time)
    grad_at = [[None] * M for _ in range(G)]
    f_done = [[False] * M for _ in range(G)]
    r_done = [[False] * M for _ in range(G)]
    rb: list[list[int]] = [[] for _ in range(G)]  # dynamic: backwards ready (heap)
    rr: list[list[int]] = [[] for _ in range(G)]  # dynamic: recomputes ready (heap)
    n_f = [0] * G
    n_b = [0] * G
    orders = [stage_order("gpipe" if schedule == "gpipe" else "1f1b", S, s, M) for s in range(S)]
    pos = [0] * G
    chan: dict[tuple, float] = {}  # link or cell channel -> time it is free
    wan_bytes = 0.0
    heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, gpu, microbatch)
    seq = 0
    DONE, ARRIVE_ACT, ARRIVE_GRAD, WAKE = 0, 1, 2, 3
    idle = [True] * G

    def push(t: float, kind: int, g: int, m: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, g, m))

    def cell_of(p: int) -> tuple[int, int]:
        c = p // cell
        return c, min(cell, P - c * cell)

    def send_plan(p: int, b: int, d: int, t_ready: float) -> tuple[float, float, float]:
        """(channel start, channel free after, arrival) for a send over boundary b in direction d
        (0 down, 1 up) whose data is ready at t_ready; the channel is not reserved."""
        nb = job.act_bytes
        if atlas and wan[b]:
            c, k = cell_of(p)
            key = ("cell", c, b, d)
            spread = (k - 1) / k * nb / job.intra_bw  # scatter before, gather after
            start = max(t_ready + spread, chan.get(key, 0.0))
            hold = nb / (k * job.hop_bw[b])
            return start, start + hold, start + hold + spread + job.hop_latency_s[b]
        key = ("pair", p, b, d)
        start = max(t_ready, chan.get(key, 0.0))
        hold = nb / job.hop_bw[b]
        return start, start + hold, start + hold + job.hop_latency_s[b]

    def chan_key(p: int, b: int, d: int) -> tuple:
        if atlas and wan[b]:
            return ("cell", cell_of(p)[0], b, d)
        return ("pair", p, b, d)

    def send(p: int, b: int, d: int, t_ready: float, m: int) -> None:
        nonlocal wan_bytes
        _, free_after, arrive = send_plan(p, b, d, t_ready)
        chan[chan_key(p, b, d)] = free_after
        if wan[b]:
            wan_bytes += job.act_bytes
        if d == 0:
            push(arrive, ARRIVE_ACT, gid(p, b + 1), m)
        else:
            push(arrive, ARRIVE_GRAD, gid(p, b), m)

    def ready(g: int, kind: str, m: int) -> bool:
        s = g % S
        if kind == "F":
            return s == 0 or act_at[g][m] is not None
        if s == S - 1:
            return f_done[g][m]
        return grad_at[g][m] is not None and (r_done[g][m] or not dynamic or recompute[s] == 0.0)

    def note_b(g: int, m: int) -> None:
        """Backward m of GPU g may have become ready (dynamic schedules)."""
        if dynamic and ready(g, "B", m):
            heapq.heappush(rb[g], m)

    def duration(g: int, kind: str) -> float:
        s = g % S
        if kind == "F":
            return job.fwd_s[s]
        if kind == "R":
            return recompute[s]
        return fixed_bwd[s]

    def out_hop(g: int, kind: str) -> tuple[int, int] | None:
        s = g % S
        if kind == "F" and s < S - 1:
            return s, 0
        if kind == "B" and s > 0:
            return s - 1, 1
        return None

    def candidates(g: int) -> list[tuple[str, int]]:
        s = g % S
        if not dynamic:
            if pos[g] < len(orders[s]):
                k, m = orders[s][pos[g]]
                if ready(g, k, m):
                    return [(k, m)]
            return []
        out = []
        if rb[g]:  # backward first, lowest microbatch first
            out.append(("B", rb[g][0]))
        if rr[g]:
            out.append(("R", rr[g][0]))
        if n_f[g] - n_b[g] < cap and n_f[g] < M and ready(g, "F", n_f[g]):
            out.append(("F", n_f[g]))
        return out

    def dispatch(g: int, now: float) -> None:
        if not idle[g]:
            return
        best = None
        for k, m in candidates(g):
            dur = duration(g, k)
            start = now
            hop = out_hop(g, k) if atlas else None
            if hop is not None and wan[hop[0]]:
                p = g // S
                # start so that the send can begin right when this computation ends
                c_start, _, _ = send_plan(p, hop[0], hop[1], now + dur)
                k_ = cell_of(p)[1]
                spread = (k_ - 1) / k_ * job.act_bytes / job.intra_bw
                start = max(now, c_start - spread - dur)
            if windows[g]:
                start = unblocked(g, start, dur)
            if best is None or start < best[0]:
                best = (start, k, m, dur)
        if best is None:
            return
        start, k, m, dur = best
        end = start + dur
        idle[g] = False
        free_at[g] = end
        if not dynamic:
            pos[g] += 1
        elif k == "B":
            heapq.heappop(rb[g])
        elif k == "R":
            heapq.heappop(rr[g])
        busy[g].append(Busy(start, end, k, m))
        hop = out_hop(g, k)
        if hop is not None and atlas and wan[hop[0]]:
            send(g // S, hop[0], hop[1], end, m)  # reserve the cell's channel now
        push(end, DONE, g, m * 4 + "FRB".index(k))
        if k == "B" and g % S > 0 and dynamic and recompute[g % S - 1] > 0:
            # the gradient is on its way: the previous stage may recompute this microbatch now
            heapq.heappush(rr[g - 1], m)
            push(start, WAKE, g - 1, -1)

    for g in range(G):
        dispatch(g, 0.0)
    while heap:
        t, _, kind, g, code = heapq.heappop(heap)
        if kind == DONE:
            m, op = divmod(code, 4)
            k = "FRB"[op]
            idle[g] = True
            s = g % S
            p = g // S
            if k == "F":
                f_done[g][m] = True
                n_f[g] += 1
                if s == S - 1:
                    note_b(g, m)
            elif k == "R":
                r_done[g][m] = True
                note_b(g, m)
            else:
                n_b[g] += 1
            hop = out_hop(g, k)
            if hop is not None and not (atlas and wan[hop[0]]):
                send(p, hop[0], hop[1], t, m)
            dispatch(g, t)
        elif kind == ARRIVE_ACT:
            act_at[g][code] = t
            dispatch(g, t)
        elif kind == ARRIVE_GRAD:
            grad_at[g][code] = t
            note_b(g, code)
            dispatch(g, t)
        else:
            dispatch(g, t)

    stage_end = [max(busy[gid(p, s)][-1].end for p in range(P)) for s in range(S)]
    ar = allreduce_s(job)
    pipeline_s = max(stage_end)
    iteration = max(stage_end[s] + ar[s] for s in range(S))
    return GeoTimeline(
        job=job, schedule=schedule, cell=cell,
        busy={(p, s): busy[gid(p, s)] for p in range(P) for s in range(S)},
        pipeline_s=pipeline_s, allreduce_s=ar, iteration_s=iteration, wan_bytes=wan_bytes,
        stage_end=tuple(stage_end), max_inflight=max_inflight)


def job_from_profile(profile, gpu: str, stage_layers: list[tuple[int, int]],
                     stage_dc: list[str], link, *, mbs: int, microbatches: int, pipelines: int,
                     recompute: bool = True, tp: int = 1,
                     intra_bw: float = INTRA_DC_BPS) -> GeoJob:
    """A ``GeoJob`` from a layer profile (``layer_times(gpu, tp, mbs)`` rows of forward,
    backward, update seconds per layer of the layer list) for stages holding the half-open layer
    ranges ``stage_layers``. ``link(dc_a, dc_b)`` gives (bytes/s of a node pair, one-way latency)
    between two datacenters."""
    lt = profile.layer_times(gpu, tp, mbs)
    fwd = tuple(float(lt[a:b, 0].sum()) for a, b in stage_layers)
    bwd = tuple(float(lt[a:b, 1].sum()) for a, b in stage_layers)
    params = profile.sizes.params
    grad = tuple(float(params[a:b].sum()) * 2.0 / tp for a, b in stage_layers)  # fp16 gradients
    hops = [link(stage_dc[s], stage_dc[s + 1]) if stage_dc[s] != stage_dc[s + 1]
            else (intra_bw, 0.0) for s in range(len(stage_dc) - 1)]
    return GeoJob(
        stage_dc=tuple(stage_dc), fwd_s=fwd, bwd_s=bwd,
        recompute_s=fwd if recompute else (0.0,) * len(fwd),
        act_bytes=float(profile.sizes.boundary_bytes) * mbs / tp, grad_bytes=grad,
        hop_bw=tuple(h[0] for h in hops), hop_latency_s=tuple(h[1] for h in hops),
        pipelines=pipelines, microbatches=microbatches, intra_bw=intra_bw)


def job_from_plan(problem, plan, est=None, *, file: str | None = None) -> GeoJob:
    """The ``GeoJob`` of a training plan whose stages each sit in one region (a datacenter) with
    the same number of replicas and equal microbatch shares: compute, hand-off and
    gradient-sync times from shoal's estimator (``estimate``), links from the scenario's
    network (WAN links between regions)."""
    from shoal import catalog
    from shoal.errors import SpecError
    from shoal.estimate import estimate
    from shoal.profiles.network import bandwidth

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
