"""``simulate``: check the inputs, build the run's state, run it on the event core, report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shoal.errors import InfeasibleError, SpecError
from shoal.estimate.events import EventLoop
from shoal.serving.cluster import Cluster
from shoal.serving.flow import Flow
from shoal.serving.names import ROUTERS
from shoal.serving.placement import Placement
from shoal.serving.simulator.batch import BATCHING
from shoal.serving.simulator.events import ORDER, BatchEnds, MessageArrives, RequestArrives, TokensArrive
from shoal.serving.simulator.result import SimResult, summarise
from shoal.serving.simulator.state import ServeRun, Settings
from shoal.serving.workload import Workload

PROGRESS_EVERY_S = 5.0  # simulated seconds between calls of ``progress``


@dataclass(frozen=True)
class SimOptions:
    """How ``simulate`` runs: the ``router`` (``names.ROUTERS``) and its ``seed``; offline
    runs last ``warmup_s + duration_s`` of simulated time, online runs until every request is
    done (``duration_s``: stop earlier); ``batching``: ``vllm`` schedules as vLLM 0.4 (Helix's
    engine: prefill-only steps while prompts wait, batches capped by each machine's ``batch``
    limits, one prefill over all their tokens), ``live`` as the workers of ``shoal serve run``:
    one request's step at a time, in arrival order, each sent on when done; ``concurrency``:
    offline, that many requests in flight instead of the KV feeder; ``progress(time_s, end_s or
    None, completed)`` is called every few simulated seconds."""

    router: str = "iwrr"
    warmup_s: float = 60.0
    duration_s: float | None = 600.0
    seed: int = 0
    progress: Callable[[float, float | None, int], None] | None = None
    batching: str = "vllm"
    concurrency: int | None = None


def simulate(cluster: Cluster, pl: Placement, flow: Flow | None, work: Workload,
             options: SimOptions = SimOptions()) -> SimResult:
    """Simulate ``work`` on the placement, as ``options`` say (``SimOptions``)."""
    router, warmup_s, duration_s, seed = (options.router, options.warmup_s, options.duration_s,
                                          options.seed)
    progress, batching, concurrency = options.progress, options.batching, options.concurrency
    _check(cluster, pl, router, batching)
    wall0 = time.perf_counter()
    end = (warmup_s + duration_s) if duration_s is not None else float("inf")
    run = ServeRun(cluster, pl, flow, work, Settings(router, warmup_s, end, seed,
                                                     batching == "vllm", concurrency))
    if concurrency is not None and (run.mode != "offline" or concurrency < 1):
        raise SpecError("a fixed concurrency is for offline runs, at least 1", field="concurrency",
                        value=concurrency)
    loop = EventLoop({BatchEnds: run.batch_ends, MessageArrives: run.message_arrives,
                      TokensArrive: run.tokens_arrive, RequestArrives: run.request_arrives},
                     order=ORDER, trace=None if progress is None else _reporter(progress, run))
    loop.schedule(run.initial())
    loop.run(until_s=end)
    return summarise(run, router, wall0, loop.handled)


def _check(cluster: Cluster, pl: Placement, router: str, batching: str) -> None:
    """The errors a person can act on, before anything runs."""
    if router not in ROUTERS:
        raise SpecError("unknown router", field="--router", value=router, allowed=", ".join(ROUTERS))
    if batching not in BATCHING:
        raise SpecError("unknown batching", field="--batching", value=batching,
                        allowed=", ".join(BATCHING))
    bare = pl.uncovered_text(cluster)
    if bare:
        raise InfeasibleError(
            f"no request can finish: layers {bare} are on no node", binding="placement",
            relaxation="give those layers to a node (serve plan places every layer)")
    missing = [cluster.names[i] for i, r in enumerate(pl.ranges)
               if r is not None and cluster.times[i] is None]
    if missing:
        raise SpecError("simulation needs per-layer times for every node used: give its machine "
                        "a 'profile' or a catalog 'gpu'", value=missing[0])


def _reporter(progress, run: ServeRun):
    """The loop's trace hook that calls ``progress`` when the simulated time has moved on
    more than ``PROGRESS_EVERY_S`` since it last did (before the event is handled)."""
    end = run.end_s if run.end_s != float("inf") else None
    last = [0.0]

    def trace(ev) -> None:
        if ev.time_s - last[0] > PROGRESS_EVERY_S:
            last[0] = ev.time_s
            progress(ev.time_s, end, run.completed)

    return trace
