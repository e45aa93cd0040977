"""Measure what the estimator needs on this machine, with the runtime's own code: per-layer
forward, backward and optimizer-update time for each TP degree and microbatch size, and the
time of point-to-point sends and all-reduces against message size through torch.distributed.

All ``procs`` processes run the measurements at once, each one started on every rank together
(TP groups of the measured degree side by side), so the numbers include the contention a plan
with that many processes meets (on a CPU, processes share cores); each time is a mean over
many calls, and the profile takes its mean over the ranks. Each layer is timed alone, then
all layers are scaled by one factor per column so they add up to the time of the whole layer
list run as one stage. Rank 0 writes a shoal profile (``shoal/profile@1``, GPU type ``cpu``
or the CUDA device's) with the network measurements beside it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.files import write_json
from shoal.problem import TimeConstants
from shoal.profiles.compute import PROFILE_SCHEMA
from shoal.runtime.model import Stage, TPGroup, token_loss
from shoal.specs.model import ModelSpec

SIZES = (2**10, 2**14, 2**17, 2**20, 2**22, 2**24, 2**26)  # bytes per message


WINDOW_S = 0.05  # timed seconds per measurement at least: several of the OS's time slices


def _clock(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _several_ranks() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _mean_time(timed, reps: int) -> float:
    """Mean of ``timed()`` (the seconds of one call it makes) over at least ``reps`` calls and
    about ``WINDOW_S`` of timed work. Where processes share cores, one waits for a core a share
    of the time, in whole time slices, so most short calls run uninterrupted and a few
    wait long: their median leaves the waiting out, a mean over several slices counts it."""
    timed()  # warm-up
    total = sum(timed() for _ in range(reps))
    # as many more calls as fill the window, the same number on every rank (TP groups' calls
    # are collective)
    more = torch.tensor([max(0, math.ceil(WINDOW_S / max(total / reps, 1e-9)) - reps)])
    if _several_ranks():
        dist.all_reduce(more, op=dist.ReduceOp.MAX)
    total += sum(timed() for _ in range(int(more)))
    return total / (reps + int(more))


def _median_time(fn, reps: int) -> float:
    fn()  # warm-up
    return statistics.median(_clock(fn) for _ in range(reps))


def layer_times(spec: ModelSpec, tp: TPGroup, mbs: int, seq: int, reps: int,
                dtype=torch.float32) -> list[list[float]]:
    """Per layer of the layer list: [forward, backward, update] seconds for one microbatch."""
    rows = []
    n = spec.num_layers + 2
    gen = torch.Generator().manual_seed(0)
    for i in range(n):
        st = Stage(spec, i, i + 1, tp=tp, dtype=dtype)
        if i == 0:
            x = torch.randint(0, spec.vocab_size, (mbs, seq), generator=gen)
        else:
            x = torch.randn(mbs, seq, spec.hidden_size, generator=gen, dtype=dtype)
        opt = torch.optim.AdamW(st.parameters(), lr=1e-3)
        targets = torch.zeros(mbs, seq, dtype=torch.long)

        def forward_graph(st=st, x=x, i=i, targets=targets):
            """The forward as the runtime runs it: with autograd recording (the graph a
            backward starts from), and the loss on the last layer."""
            xi = x if i == 0 else x.detach().requires_grad_(True)
            y = st(xi)
            return token_loss(y, targets, float(mbs * seq)) if i == n - 1 else y

        def update(opt=opt, st=st):
            for p in st.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            opt.step()

        rows.append(_measure(forward_graph, i == n - 1, update, reps))
    # the whole layer list as the runtime chains it: its forward, backward and update take
    # longer than the sum of the layers measured one at a time (each layer alone keeps its
    # weights in cache; on this project's 2-core test machine, 4 microbatches of the tiny model
    # took 12% longer whole); every layer is scaled by the chain's ratio, so the rows compose
    try:
        measured = _chain_times(spec, tp, mbs, seq, reps, dtype, gen)
    except torch.OutOfMemoryError:  # the whole model does not fit one device: rows as measured
        return rows
    for c in range(3):
        total = sum(r[c] for r in rows)
        if total > 0:
            for r in rows:
                r[c] *= measured[c] / total
    return rows


def _chain_times(spec: ModelSpec, tp: TPGroup, mbs: int, seq: int, reps: int, dtype,
                 gen) -> list[float]:
    """[forward, backward, update] seconds of every layer chained in one stage."""
    n = spec.num_layers + 2
    whole = Stage(spec, 0, n, tp=tp, dtype=dtype)
    opt = torch.optim.AdamW(whole.parameters(), lr=1e-3)
    tokens = torch.randint(0, spec.vocab_size, (mbs, seq), generator=gen)
    targets = torch.zeros(mbs, seq, dtype=torch.long)

    def chain(whole=whole, tokens=tokens, targets=targets):
        return token_loss(whole(tokens), targets, float(mbs * seq))

    def chain_update(opt=opt, whole=whole):
        for p in whole.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()

    return _measure(chain, True, chain_update, reps)


def _together() -> None:
    """Start the next measurement on every rank at once: each is then timed while all the
    others run the same work, as a plan's processes do (without it, ranks drift apart and
    a measurement may find the cores free that a run shares)."""
    if _several_ranks():
        dist.barrier()


def _measure(forward_graph, scalar: bool, update, reps: int) -> list[float]:
    """Mean [forward, backward, update] seconds (``_mean_time``): ``forward_graph()`` builds
    the graph (a scalar loss when ``scalar``, else a tensor given ones as its gradient); every
    rank measures each of the three at the same time (``_together``)."""

    def bwd_time() -> float:
        y = forward_graph()
        g = None if scalar else torch.ones_like(y)
        t0 = time.perf_counter()
        y.backward(g)
        return time.perf_counter() - t0

    out = []
    for timed in (lambda: _clock(forward_graph), bwd_time, lambda: _clock(update)):
        _together()
        out.append(_mean_time(timed, reps))
    return out


def network(reps: int) -> dict:
    """One-way point-to-point time (ranks 0 -> 1, half a ping-pong), and the all-reduce and
    ZeRO's sync (reduce-scatter, then all-gather) over every rank, per message size in bytes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"p2p_s": {}, "all_reduce_s": {}, "sharded_sync_s": {}, "ranks": world}
    for size in SIZES:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        if world > 1:
            def ping(buf=buf):
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                elif rank == 1:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
            dist.barrier()
            t = _median_time(ping, reps) / 2
            dist.barrier()
            out["p2p_s"][size] = t
            # a mean, as for the layers: a gradient all-reduce in a step meets the same waits
            # for a core, and every rank takes part, so every rank makes the same calls
            out["all_reduce_s"][size] = _mean_time(
                lambda buf=buf: _clock(lambda: dist.all_reduce(buf)), reps)
            # ZeRO's sync of the same bytes: reduce-scatter the gradient, all-gather the weights
            chunks = list(buf[:buf.numel() // world * world].chunk(world))
            mine = torch.empty_like(chunks[0])

            def sharded(chunks=chunks, mine=mine):
                dist.reduce_scatter(mine, chunks)
                dist.all_gather(chunks, mine)
            out["sharded_sync_s"][size] = _mean_time(lambda: _clock(sharded), reps)
    return out


def fit_link(times: dict[int, float]) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of ``t = latency + size / bandwidth`` through the
    smallest and the largest message. A message takes no longer than a larger one, so each
    time is first lowered to the least of its own and every larger message's: one slow
    measurement of a small message (a process waiting for a core) does not become the
    latency of every transfer."""
    sizes = sorted(times)
    low = [min(times[s] for s in sizes[i:]) for i in range(len(sizes))]
    lat = low[0]
    bw = (sizes[-1] - sizes[0]) / max(low[-1] - lat, 1e-9)
    return bw, lat


def time_constants(doc: dict, base: TimeConstants | None = None) -> TimeConstants:
    """The estimator's framework constants for a scenario whose links are this profile's
    measured link (``network.link``): pipeline transfers as measured (scale 1, no overhead),
    the gradient all-reduce scaled by the measured all-reduce over the ring all-reduce the
    estimator models on that link, for the profile's process count, and ZeRO's sync by its
    measured reduce-scatter and all-gather over the measured all-reduce (at least 1). Each is
    the median ratio over the messages of 1 MB and more: a layer list's gradients are tens of
    MB and more, where bandwidth, not latency, sets the time."""
    base = base or TimeConstants()
    net = doc.get("network", {})
    link, measured = net.get("link"), net.get("all_reduce_s", {})
    scale, sharded = base.sync_scale, base.sharded_sync_ratio
    d = int(doc.get("processes", 1))
    big = {int(size): t for size, t in measured.items() if int(size) >= 2**20}
    if link and d > 1 and big:
        scale = statistics.median(
            t / (2.0 * (d - 1) / d * size / link["bandwidth_Bps"] + 2.0 * (d - 1) * link["latency_s"])
            for size, t in big.items())
        zero = {int(size): t for size, t in net.get("sharded_sync_s", {}).items()}
        if ratios := [zero[size] / t for size, t in big.items() if size in zero and t > 0]:
            sharded = max(1.0, statistics.median(ratios))
    return replace(base, p2p_scale=1.0, p2p_overhead_s=0.0, sync_scale=scale,
                   sharded_sync_ratio=sharded)


def run(spec: ModelSpec, model_name: str, tps: list[int], mbs_list: list[int], seq: int,
        reps: int, out: Path, device_name: str = "cpu") -> dict | None:
    """Every rank measures; rank 0 writes ``out`` and returns the document."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gpus: dict[str, dict] = {}
    for tp in tps:
        if world % tp:
            raise ValueError(f"TP {tp} does not divide the {world} processes")
        groups = [dist.new_group(list(range(g * tp, (g + 1) * tp))) if tp > 1 else None
                  for g in range(world // tp)]
        me = TPGroup(tp, rank % tp, groups[rank // tp])
        for m in mbs_list:
            rows = layer_times(spec, me, m, seq, reps)
            if world > 1:
                # the mean over the ranks: where processes outnumber cores, the scheduler may
                # leave one a core of its own and make others share; a plan's processes see
                # the mean
                t = torch.tensor(rows, dtype=torch.float64)
                dist.all_reduce(t)
                rows = (t / world).tolist()
            gpus.setdefault(str(tp), {})[str(m)] = rows
    net = network(reps)
    if rank != 0:
        return None
    doc = {"schema": PROFILE_SCHEMA, "model": model_name, "n_layers": spec.num_layers + 2,
           "units": "seconds per microbatch: [forward, backward, update] per layer",
           "model_spec": spec.model_dump(), "seq_len": seq, "processes": world,
           "gpus": {device_name: gpus}, "network": {
               key: {str(k): v for k, v in net[key].items()}
               for key in ("p2p_s", "all_reduce_s", "sharded_sync_s")}}
    if net["p2p_s"]:
        bw, lat = fit_link(net["p2p_s"])
        doc["network"]["link"] = {"bandwidth_Bps": bw, "latency_s": lat}
    write_json(out, doc)
    return doc
