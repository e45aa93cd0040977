"""A serving placement run for real: one worker process per node, each holding its range of the
model's transformer blocks and a KV cache per request, and a coordinator that routes every
request along its own chain of workers (Helix §5).

The coordinator (``LiveServer``) holds the embedding and the output head, routes with the
simulator's own router and KV admission (``routing.route_chain``: interleaved weighted
round-robin over the max flow's edges, nodes whose KV cache would pass its high-water mark
masked out), samples greedily, and sends each decode step along the same chain (KV locality).
Its workers (``worker``) run here or, for nodes whose serving file names a ``host``, on that
host (``shoal serve worker``); ``launch`` starts, links and restarts them, and ``wire`` is the
messages between them all.

Weights are those of ``shoal.runtime.model`` for the model spec and seed, so a placement's output
equals a one-process run of the same model (``shard.reference_generate``; tested with greedy
decoding).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from shoal.errors import SpecError
from shoal.runtime.model import Stage
from shoal.runtime.serve.launch import WorkerPool
from shoal.runtime.serve.traffic import Rejected, Request
from shoal.runtime.serve.wire import DTYPES, FREE, PING, STEP, BadMessage
from shoal.serving.perf import kv_capacity
from shoal.serving.routing import KVCache, Router, reachable, route_chain
from shoal.serving.simulator import KV_SETTINGS


@dataclass(frozen=True)
class LiveOptions:
    """How a ``LiveServer`` runs: the model's ``seed`` and ``dtype`` (float32 or float64); the
    simulator's ``router``, the ``mean_output`` tokens it assumes and its KV settings for
    ``mode`` (online or offline); how long its workers have to start (``start_timeout_s``) and
    how many times a node's worker is started again (``restarts``)."""

    seed: int = 0
    dtype: str = "float32"
    router: str = "iwrr"
    mean_output: float = 16.0
    mode: str = "online"
    start_timeout_s: float = 120.0
    restarts: int = 3


class _Run:
    """One ``run``'s requests: those yet to enter (``pending``, by arrival; the first ``k``
    have), those waiting for a chain with KV room, and those running (``live``, by key)."""

    def __init__(self, requests: list[Request], timeout_s: float, inbox: queue.Queue | None,
                 stop: threading.Event | None):
        self.requests = requests
        self.timeout_s, self.inbox, self.stop = timeout_s, inbox, stop
        self.t0 = time.perf_counter()
        self.pending = sorted(requests, key=lambda r: r.arrival)
        self.waiting: list[Request] = []
        self.live: dict[tuple[int, int], Request] = {}
        self.k = 0

    def more(self) -> bool:
        """Whether requests are still to come: pending ones, or ones put in the inbox until
        ``stop`` is set."""
        return self.k < len(self.pending) or (self.inbox is not None
                                              and not (self.stop and self.stop.is_set()))

    def take(self, now: float) -> None:
        """The pending requests that have arrived by ``now``, and those put in the inbox (which
        join ``requests``), wait for a chain."""
        while self.k < len(self.pending) and self.pending[self.k].arrival <= now:
            self.pending[self.k].entered = now
            self.waiting.append(self.pending[self.k])
            self.k += 1
        while self.inbox is not None:
            try:
                r = self.inbox.get_nowait()
            except queue.Empty:
                break
            r.arrival = r.entered = now
            self.requests.append(r)
            self.waiting.append(r)


def _reject(r: Request, why: str) -> None:
    r.rejected = why
    if r.sink is not None:
        r.sink.put(Rejected(why))


class LiveServer(WorkerPool):
    """Workers for every node that holds layers, on this machine (and on the hosts the serving
    file names), and the coordinator.

    Every message is checked (``decode``); one that is malformed or makes no sense where it
    arrives is dropped and counted in ``dropped`` (by reason), never fatal. A worker this
    machine started that dies (its process ends, or its queue fills because it takes nothing)
    is taken out of routing, its requests run again from the prompt on other chains, and it is
    started again, up to ``restarts`` times per node: once it has its layers and it and every
    live worker know its new address, it is routed to again. A worker on another host that is
    lost stays out of routing (it does not rejoin a running server). ``health`` is a snapshot,
    renewed by the serving loop, of every worker's state, whether a chain of live workers holds
    the model, and the dropped messages."""

    def __init__(self, cluster, placement, flow, spec, options: LiveOptions | None = None):
        o = options or LiveOptions()
        if cluster.layers != spec.num_layers:
            raise SpecError(f"the placement splits {cluster.layers} layers but {spec.name} has "
                            f"{spec.num_layers} blocks", field="--model", value=spec.name,
                            allowed=f"a model of {cluster.layers} blocks, or a serving file and "
                                    f"placement over {spec.num_layers} layers")
        self.cluster, self.pl, self.spec = cluster, placement, spec
        self.router = Router(o.router, cluster, placement, flow, o.seed, mean_output=o.mean_output)
        layers = np.array([(r[1] - r[0]) if r else 0 for r in placement.ranges], dtype=float)
        hw, ratio = KV_SETTINGS[o.mode]
        self.kv = KVCache(kv_capacity(cluster, placement), layers, hw, ratio, o.mean_output)
        dt = getattr(torch, o.dtype)
        self.dtype = np.dtype(DTYPES[o.dtype])
        L = spec.num_layers
        self.embed = Stage(spec, 0, 1, seed=o.seed, dtype=dt).requires_grad_(False)
        self.head = Stage(spec, L + 1, L + 2, seed=o.seed, dtype=dt).requires_grad_(False)
        self.health: dict = {}
        self._pinged = 0.0
        self.wall_s = 0.0
        super().__init__(cluster, placement, spec, seed=o.seed, dtype=o.dtype,
                         start_timeout_s=o.start_timeout_s, restarts=o.restarts)
        self._snapshot(0, 0)

    def _step(self, req: Request, tokens: list[int], offset: int) -> None:
        with torch.no_grad():
            tok = torch.tensor([tokens], dtype=torch.long)
            x = self.embed.layers[0](tok, start=offset).numpy()
        self._send(req.chain[0], {"kind": STEP, "key": req.key, "chain": req.chain, "hop": 0,
                                  "at": 0, "x": x})

    def _next_token(self, x: np.ndarray) -> int:
        with torch.no_grad():
            logits = self.head.layers[0](torch.from_numpy(x[:, -1:]))
        return int(logits[0, -1].argmax())

    def run(self, requests: list[Request] | None = None, *, timeout_s: float = 600.0,
            inbox: queue.Queue | None = None, stop: threading.Event | None = None
            ) -> list[Request]:
        """Serve ``requests`` (each entering at its ``arrival`` seconds after the start; greedy
        decoding of ``max_new`` tokens) and, with ``inbox``, requests put there (entering when
        taken) until ``stop`` is set; returns ``requests`` with tokens and timings. A request no
        chain can admit waits for KV room. A worker that dies is taken out of routing and the
        requests on it run again from the prompt on other chains (a worker started again is
        routed to once it is linked); a request that no chain of live workers can serve (and
        no worker is being started again), or that is not done within ``timeout_s`` of its
        arrival, is rejected with the reason. A request with a ``sink`` queue gets each new
        token as it comes, then None, or a ``Rejected``."""
        run = _Run(requests or [], timeout_s, inbox, stop)
        while run.more() or run.waiting or run.live:
            now = time.perf_counter() - run.t0
            if stop is not None and stop.is_set():  # the server stops: nothing more is answered
                self._stop_all(run)
                break
            self._expire(run, now)
            for name in self._check_workers():
                self._again(run, name)
            self._tend(len(run.waiting), len(run.live))
            run.take(now)
            self._admit(run, now)
            if not run.live and run.waiting and run.k >= len(run.pending) and not self.starting:
                for r in run.waiting:
                    _reject(r, "no chain of live workers holds the model" if self.dead else
                            "no chain of workers has KV room for the prompt")
                run.waiting.clear()
                if inbox is None:
                    break
            wait_ms = (50 if run.k >= len(run.pending) else
                       max(0, int((run.pending[run.k].arrival - now) * 1000)))
            msg = self._receive(min(wait_ms, 50 if inbox is None else 10))
            if msg is not None:
                self._answer(run, msg)
        self.wall_s = time.perf_counter() - run.t0
        self._snapshot(0, 0)
        return run.requests

    def _stop_all(self, run: _Run) -> None:
        """The server stops: every request waiting or running is rejected."""
        for r in run.waiting + list(run.live.values()):
            if r.key in run.live:
                self._free(r)
            _reject(r, "the server stopped")
        run.waiting.clear()
        run.live.clear()

    def _expire(self, run: _Run, now: float) -> None:
        """Reject every request not done within the run's timeout of its arrival (of when it
        was taken from the inbox)."""
        for r in [r for r in run.waiting + list(run.live.values())
                  if now - (r.arrival if run.inbox is None else r.entered) > run.timeout_s]:
            run.live.pop(r.key, None)
            if r in run.waiting:
                run.waiting.remove(r)
            else:
                self._free(r)
            _reject(r, f"not finished within {run.timeout_s:g} s")

    def _admit(self, run: _Run, now: float) -> None:
        """Start the waiting requests, first come first served, while a chain has KV room."""
        while run.waiting:
            r = run.waiting[0]
            chain = route_chain(self.router, self.kv, self.n, len(r.prompt), self.dead)
            if chain is None:
                return
            run.waiting.pop(0)
            r.nodes = chain[:-1]
            r.chain = [self.names[v] for v in r.nodes] + ["coord"]
            if math.isnan(r.start):
                r.start = now
            run.live[r.key] = r
            self._step(r, r.prompt, 0)

    def _again(self, run: _Run, name: str) -> None:
        """The requests on worker ``name``, which died, wait to run from the prompt."""
        for r in [r for r in run.live.values() if self.index[name] in r.nodes]:
            del run.live[r.key]
            self._free(r)
            r.attempt += 1
            r.tokens, r.first = [], math.nan
            run.waiting.insert(0, r)

    def _answer(self, run: _Run, msg: dict) -> None:
        """Act on a message; one that carries a request's next token: the token goes to the
        request, which is done or sends its next decode step along its chain."""
        try:
            r = self._handle(msg, run.live)
        except BadMessage as exc:
            self._drop(str(exc))
            return
        except Exception as exc:  # no message may stop the loop
            self._drop(f"could not be handled: {type(exc).__name__}")
            return
        if r is None:
            return
        now = time.perf_counter() - run.t0
        tok = self._next_token(msg["x"])
        r.tokens.append(tok)
        if r.sink is not None and len(r.tokens) > r.sent:  # a re-run repeats its tokens
            r.sink.put(tok)
            r.sent += 1
        if len(r.tokens) == 1:
            r.first = now
        if len(r.tokens) >= r.max_new:
            r.finish = now
            del run.live[r.key]
            self._free(r)
            if r.sink is not None:
                r.sink.put(None)
            self._admit(run, now)
        else:
            self.router.decode_step(np.array(self.router.edges_of(r.nodes + [self.n + 1]),
                                             dtype=int))
            self._step(r, [tok], len(r.prompt) + len(r.tokens) - 1)

    def _handle(self, msg: dict, live: dict) -> Request | None:
        """Act on a message from a worker; the request whose next token it carries, if it is
        one. A BadMessage for one that makes no sense here: of a kind only workers take, from
        no worker of ours, or a step's hidden states of another shape or chain than its
        request's."""
        if msg["kind"] != STEP:
            self._control(msg)
            return None
        chain = msg["chain"]
        if msg["hop"] != len(chain) - 1 or chain[-1] != "coord":
            raise BadMessage("step: not at the end of its chain")
        r = live.get(msg["key"])
        if r is None:  # from a run that a dead worker cut short
            return None
        if chain != r.chain:
            raise BadMessage("step: not its request's chain")
        positions = 1 if r.tokens else len(r.prompt)
        if msg["x"].shape != (1, positions, self.spec.hidden_size) or msg["x"].dtype != self.dtype:
            raise BadMessage("step: hidden states of another shape than its request's")
        return r

    def _tend(self, waiting: int, running: int) -> None:
        """Every second a ping to each live worker (its pong: when it was last seen, and what
        it dropped); a few times a second, and at once after a change, a new ``health``
        snapshot."""
        now = time.perf_counter()
        if now - self._pinged >= 1.0:
            self._pinged = now
            for name in self.ranges:
                if name in self.addr and self.index[name] not in self.dead:
                    self._send(name, {"kind": PING})
        if now - self._tended >= 0.2:
            self._snapshot(waiting, running)

    def _snapshot(self, waiting: int, running: int) -> None:
        now = self._tended = time.perf_counter()
        workers = {}
        for name, (a, b) in self.ranges.items():
            state = ("starting" if name in self.starting else
                     "dead" if self.index[name] in self.dead else "live")
            w = {"state": state, "layers": [a, b], "host": self.remote.get(name),
                 "restarts": self.restarts[name],
                 "dropped_messages": self.worker_dropped.get(name, 0)}
            if name in self.seen:
                w["last_seen_s"] = round(now - self.seen[name], 3)
            workers[name] = w
        # one assignment: a reader in another thread sees the old snapshot or the new, whole
        self.health = {"at": now, "can_serve": reachable(self.router, self.n, self.dead),
                       "workers": workers, "dropped_messages": sum(self.dropped.values()),
                       "dropped_why": dict(self.dropped),
                       "requests": {"waiting": waiting, "running": running}}

    def _free(self, r: Request) -> None:
        """Drop request ``r``'s caches on the live workers of its chain, and its KV
        reservation."""
        for v in r.nodes:
            if v not in self.dead:
                self._send(self.names[v], {"kind": FREE, "key": r.key})
        self.kv.release(r.nodes, len(r.prompt))
        self.router.finish(r.nodes + [self.n + 1], len(r.prompt))
