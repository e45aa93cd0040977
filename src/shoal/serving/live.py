"""A serving placement run for real: one worker process per node, each holding its range of the
model's transformer blocks and a KV cache per request, and a coordinator that routes every
request along its own chain of workers (Helix §5).

Transport is ZeroMQ (pyzmq): every worker binds a PULL socket and pushes its output to the next
hop of the request's chain (another worker, or the coordinator); a message is a JSON header and
the hidden states' raw bytes. Workers run here or, for nodes whose serving file names a
``host``, on that host (``shoal serve worker``): each says hello with its address and gets its
layers from the coordinator. The coordinator holds the embedding and the output head,
routes with the simulator's own router and KV admission (``routing.route_chain``: interleaved
weighted round-robin over the max flow's edges, nodes whose KV cache would pass its high-water
mark masked out), samples greedily, and sends each decode step along the same chain (KV
locality). A worker takes every message that arrived while it ran its previous batch (dynamic
batching) and runs each request's step with that request's cache; a request whose chain enters a
worker past the start of its range (partial inference) runs only the blocks from there.

Weights are those of ``shoal.runtime.model`` for the model spec and seed, so a placement's output
equals a one-process run of the same model (tested with greedy decoding).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from shoal.errors import ShoalError, SpecError

STOP, STEP, FREE, PEERS = "stop", "step", "free", "peers"
HELLO, CONFIG, READY, LINKED = "hello", "config", "ready", "linked"


@dataclass(frozen=True)
class Rejected:
    """Put in a request's sink when it is rejected."""

    reason: str


def block_step(blk, x, past):
    """One block on new positions ``x`` (1, S, h) with the cached keys and values ``past`` of
    the earlier positions (or None): the output and the cache extended by these positions."""
    import torch
    import torch.nn.functional as F

    B, S, h = x.shape
    nh, dh = blk.nh_local, blk.dh
    y = F.layer_norm(x, (h,), blk.ln1_w, blk.ln1_b)
    qkv = F.linear(y, blk.qkv, blk.qkv_b).view(B, S, 3, nh, dh)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    if past is not None:
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
    T = k.shape[2]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
    mask = torch.ones(S, T, dtype=torch.bool).triu(T - S + 1)  # position T-S+i sees keys <= it
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    a = (att @ v).transpose(1, 2).reshape(B, S, nh * dh)
    x = x + F.linear(a, blk.o) + blk.o_b
    y = F.layer_norm(x, (h,), blk.ln2_w, blk.ln2_b)
    m = F.gelu(F.linear(y, blk.fc1, blk.fc1_b))
    return x + F.linear(m, blk.fc2) + blk.fc2_b, (k, v)


class Shard:
    """Blocks ``[a, b)`` of the model (block indices, not the layer list) with one KV cache per
    request."""

    def __init__(self, spec, a: int, b: int, seed: int = 0, dtype_name: str = "float32"):
        import torch

        from shoal.runtime.model import Stage

        self.a, self.b = a, b
        self.stage = Stage(spec, a + 1, b + 1, seed=seed, dtype=getattr(torch, dtype_name))
        self.stage.requires_grad_(False)
        self.cache: dict[int, list] = {}

    def step(self, rid, x: np.ndarray, at: int) -> np.ndarray:
        """Run the blocks from ``at`` (where the hidden state ``x`` stands) to the end of the
        range, with and into the request's cache."""
        import torch

        cache = self.cache.setdefault(rid, [None] * (self.b - self.a))
        h = torch.from_numpy(x)
        with torch.no_grad():
            for i in range(max(at, self.a), self.b):
                h, cache[i - self.a] = block_step(self.stage.layers[i - self.a], h,
                                                  cache[i - self.a])
        return h.numpy()


def send(sock, msg: dict, flags: int = 0) -> None:
    """One message: a JSON header and, when it carries hidden states ``x``, their raw bytes in a
    second frame (no pickle: a worker may listen on a network)."""
    if msg.get("x") is None:
        sock.send(json.dumps(msg).encode(), flags)
        return
    x = np.ascontiguousarray(msg["x"])
    head = {k: v for k, v in msg.items() if k != "x"} | {"x": [x.dtype.str, list(x.shape)]}
    sock.send_multipart([json.dumps(head).encode(), x.data], flags, copy=False)


def recv(sock, flags: int = 0) -> dict:
    """The message ``send`` sent (``key`` as a tuple, ``x`` as an array)."""
    frames = sock.recv_multipart(flags)
    msg = json.loads(frames[0])
    if len(frames) > 1:
        dt, shape = msg["x"]
        msg["x"] = np.frombuffer(frames[1], dtype=dt).reshape(shape).copy()
    if "key" in msg:
        msg["key"] = tuple(msg["key"])
    return msg


def watch(sock):
    """A monitor of ``sock``'s connection events, with ZeroMQ's heartbeat dropping a peer that
    stops answering (1 s pings, 5 s); set up before ``sock`` connects."""
    import zmq

    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    return sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)


def lost(monitor, state: dict) -> bool:
    """Whether the peer ``monitor`` watches was connected and has gone (``state`` remembers
    both between calls; gone stays gone)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    while not state.get("gone"):
        try:
            ev = recv_monitor_message(monitor, flags=zmq.NOBLOCK)["event"]
        except zmq.Again:
            return False
        if ev == zmq.EVENT_CONNECTED:
            state["connected"] = True
        elif ev == zmq.EVENT_DISCONNECTED and state.get("connected"):
            state["gone"] = True
    return True


def spawned_worker(name: str, coord: str, bind: str) -> None:
    """``worker_main`` in a process ``LiveServer`` started: Ctrl-C in the terminal is the
    coordinator's to act on (it stops its workers, and a worker ends with it), so the worker
    ignores it rather than print a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker_main(name, coord, bind)


def worker_main(name: str, coord: str, bind: str = "127.0.0.1", advertise: str | None = None,
                with_parent: bool = True) -> str | None:
    """A worker process for node ``name``: receive steps, run them in batches of whatever has
    arrived, forward. Returns why it stopped (None: told to by the coordinator).

    It binds a port of its own on ``bind`` (a port picked for it beforehand can be taken by
    another process before it binds) and says hello to the coordinator at ``coord`` with the
    address others reach it at (``advertise``, default ``bind``); the coordinator answers with
    the model and its layer range, and, once every worker is ready, with every worker's
    address. It ends with its parent process (``with_parent``, a worker ``shoal serve run``
    started) or when the coordinator's connection drops (a worker on another host)."""
    import torch
    import zmq

    from shoal.specs.model import ModelSpec

    torch.set_num_threads(1)
    ctx = zmq.Context()
    # no socket waits for unsent messages at exit: a worker interrupted before any
    # coordinator answered would otherwise hang there on its hello
    ctx.setsockopt(zmq.LINGER, 0)
    pull = ctx.socket(zmq.PULL)
    try:
        port = pull.bind_to_random_port(f"tcp://{bind}")
    except zmq.ZMQError as exc:
        ctx.destroy(linger=0)
        return (f"cannot listen on {bind}: {exc} (run it on the node's host, or give "
                f"--bind an address of this machine)")
    peers = {"coord": coord}
    push: dict[str, zmq.Socket] = {}
    push["coord"] = ctx.socket(zmq.PUSH)
    monitor = None if with_parent else watch(push["coord"])
    push["coord"].connect(coord)
    state: dict = {}
    shard = None

    def out(to: str):
        if to not in push:
            push[to] = ctx.socket(zmq.PUSH)
            push[to].connect(peers[to])
        return push[to]

    def stop(why: str | None) -> str | None:
        ctx.destroy(linger=0)
        return why

    send(out("coord"), {"kind": HELLO, "worker": name, "spawned": with_parent,
                        "addr": f"tcp://{advertise or bind}:{port}"})
    parent = os.getppid()
    while True:
        if not pull.poll(1000):
            if with_parent and os.getppid() != parent:  # the coordinator is gone: so is this
                return stop("the coordinator's process ended")
            # the coordinator's stop may be on its way as its connection closes
            if monitor is not None and lost(monitor, state) and not pull.poll(500):
                return stop(f"the coordinator at {coord} went away")
            continue
        batch = [recv(pull)]
        while True:  # dynamic batching: everything that arrived while the last batch ran
            try:
                batch.append(recv(pull, flags=zmq.NOBLOCK))
            except zmq.Again:
                break
        for msg in batch:
            kind = msg["kind"]
            if kind == STOP:
                return stop(msg.get("why"))
            if kind == CONFIG:
                shard = Shard(ModelSpec.model_validate_json(msg["spec"]), msg["a"], msg["b"],
                              msg["seed"], msg["dtype"])
                send(out("coord"), {"kind": READY, "worker": name})
                continue
            if kind == FREE:
                shard.cache.pop(msg["key"], None)
                continue
            if kind == PEERS:
                peers.update(msg["peers"])
                send(out("coord"), {"kind": LINKED, "worker": name})
                continue
            t0 = time.perf_counter()
            y = shard.step(msg["key"], msg["x"], msg["at"])
            hop = msg["hop"] + 1
            send(out(msg["chain"][hop]), {**msg, "x": y, "at": shard.b, "hop": hop,
                                          "busy": msg.get("busy", 0.0)
                                          + time.perf_counter() - t0})


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new: int
    arrival: float = 0.0
    tokens: list[int] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    start: float = math.nan
    first: float = math.nan
    finish: float = math.nan
    rejected: str | None = None
    attempt: int = 0  # runs from the prompt (a worker on its chain died: run again)
    sink: queue.Queue | None = None  # new tokens as they come, then None (HTTP streaming)
    sent: int = 0  # tokens put in the sink
    entered: float = math.nan  # when the coordinator took it

    @property
    def key(self) -> tuple[int, int]:
        return (self.rid, self.attempt)


class LiveServer:
    """Workers for every node that holds layers, on this machine, and the coordinator."""

    def __init__(self, cluster, placement, flow, spec, *, seed: int = 0, dtype: str = "float32",
                 router: str = "iwrr", mean_output: float = 16.0, mode: str = "online",
                 start_timeout_s: float = 120.0):
        import torch
        import zmq

        from shoal.runtime.model import Stage
        from shoal.serving.routing import Router
        from shoal.serving.simulator import KV_SETTINGS, kv_capacity

        if cluster.layers != spec.num_layers:
            raise SpecError(f"the placement splits {cluster.layers} layers but {spec.name} has "
                            f"{spec.num_layers} blocks", field="--model", value=spec.name,
                            allowed=f"a model of {cluster.layers} blocks, or a serving file and "
                                    f"placement over {spec.num_layers} layers")
        self.cluster, self.pl, self.spec = cluster, placement, spec
        self.n = cluster.n
        self.names = cluster.names
        self.router = Router(router, cluster, placement, flow, seed)
        from shoal.serving.routing import KVCache

        layers = np.array([(r[1] - r[0]) if r else 0 for r in placement.ranges], dtype=float)
        hw, ratio = KV_SETTINGS[mode]
        self.kv = KVCache(kv_capacity(cluster, placement), layers, hw, ratio, mean_output)
        dt = getattr(torch, dtype)
        L = spec.num_layers
        self.embed = Stage(spec, 0, 1, seed=seed, dtype=dt).requires_grad_(False)
        self.head = Stage(spec, L + 1, L + 2, seed=seed, dtype=dt).requires_grad_(False)
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        here = "127.0.0.1"
        if cluster.coordinator_address is not None:  # workers on other hosts reach it there
            from shoal.serving.spec import split_address

            here, port = split_address(cluster.coordinator_address)
            try:
                self.pull.bind(f"tcp://{here}:{port}")
            except zmq.ZMQError as exc:
                self.ctx.destroy(linger=0)
                raise SpecError(f"cannot listen there: {exc}", field="coordinator.address",
                                value=cluster.coordinator_address,
                                allowed="an IP address of this machine and a free port") from None
        else:
            port = self.pull.bind_to_random_port(f"tcp://{here}")
        self.addr = {"coord": f"tcp://{here}:{port}"}
        hosts = cluster.hosts or (None,) * self.n
        self.ranges = {self.names[i]: r for i, r in enumerate(placement.ranges) if r is not None}
        self.remote = {nm: hosts[i] for i, nm in enumerate(self.names)
                       if hosts[i] is not None and nm in self.ranges}
        self.config = {"kind": CONFIG, "spec": spec.model_dump_json(), "seed": seed,
                       "dtype": dtype}
        # spawn, not fork: a forked child of a process whose torch thread pool has run can hang
        mctx = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        for name in self.ranges:
            if name not in self.remote:
                p = mctx.Process(target=spawned_worker, daemon=True,
                                 args=(name, self.addr["coord"], here))
                p.start()
                self.procs[name] = p
        self.push: dict = {}
        self.monitors: dict = {}  # remote worker -> (monitor socket, its state)
        self.dead: set[int] = set()
        self.wall_s = 0.0
        try:
            self._start(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> list[str]:
        """Every node that holds layers, here or on another host."""
        return list(self.ranges)

    def _start(self, timeout_s: float) -> None:
        """Hello (with its address) -> the model and range; ready; once all are, every
        worker's address -> linked. A worker for an unknown node, one that holds no layers or
        one already started is told to stop, with the reason."""
        deadline = time.perf_counter() + timeout_s
        for kind in (READY, LINKED):  # every worker listens; then every worker knows all
            done: set[str] = set()
            while done != set(self.ranges):
                if time.perf_counter() > deadline:
                    raise ShoalError(f"workers did not start within {timeout_s:g} s: " + ", ".join(
                        f"{n} (`shoal serve worker SERVING --node {n}` on {self.remote[n]})"
                        if n in self.remote and n not in self.addr else
                        f"{n} (said hello from {self.addr[n]} but is not {kind}: can this "
                        f"machine and the other workers reach that port?)"
                        if n in self.remote else n
                        for n in sorted(set(self.ranges) - done)))
                ended = [f"{n} (exit code {p.exitcode})" for n, p in self.procs.items()
                         if not p.is_alive()]
                if ended:
                    raise ShoalError(f"workers ended while starting: {', '.join(ended)}")
                msg = self._receive(1000)
                if msg is None:
                    continue
                name = msg.get("worker")
                if msg["kind"] == HELLO:
                    why = self._unwanted(msg)
                    if why is not None:
                        self._turn_away(msg, why)
                        continue
                    self.addr[name] = msg["addr"]
                    self._connect(name)
                    a, b = self.ranges[name]
                    self._send(name, self.config | {"a": a, "b": b})
                elif msg["kind"] == kind:
                    done.add(name)
            if kind == READY:
                for name in self.ranges:
                    self._send(name, {"kind": PEERS, "peers": self.addr})

    def _receive(self, timeout_ms: int) -> dict | None:
        """The next message within ``timeout_ms``, or None; a message that is not one of
        ours (a stray peer on the coordinator's port) is dropped."""
        if not self.pull.poll(timeout_ms):
            return None
        try:
            msg = recv(self.pull)
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        return msg if isinstance(msg, dict) and "kind" in msg else None

    def _unwanted(self, hello: dict) -> str | None:
        """Why the worker saying ``hello`` is not needed, or None."""
        name = hello.get("worker")
        if name not in self.names:
            return "is not a node of this serving file"
        if name not in self.ranges:
            return "holds no layers in this placement"
        if name in self.addr:
            return ("was lost and does not rejoin a running server"
                    if self.names.index(name) in self.dead else "already has a worker")
        if name in self.procs and not hello.get("spawned"):
            return "runs on the coordinator's machine in its serving file (no 'host')"
        return None

    def _turn_away(self, hello: dict, why: str) -> None:
        import zmq

        tmp = self.ctx.socket(zmq.PUSH)
        tmp.connect(hello["addr"])
        send(tmp, {"kind": STOP, "why": f"node {hello.get('worker')} {why}"}, flags=zmq.NOBLOCK)
        tmp.close(linger=1000)

    def _connect(self, name: str) -> None:
        """A socket to worker ``name``; one on another host is watched (its process ending, or
        its host going silent, drops the connection)."""
        import zmq

        sock = self.ctx.socket(zmq.PUSH)
        if name in self.remote:
            self.monitors[name] = (watch(sock), {})
        sock.connect(self.addr[name])
        self.push[name] = sock

    def _send(self, to: str, msg: dict) -> None:
        import zmq

        if to not in self.push:
            self._connect(to)
        if to not in self.remote:
            send(self.push[to], msg)
            return
        try:  # a worker elsewhere that stopped taking messages must not block the coordinator
            send(self.push[to], msg, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.monitors[to][1]["gone"] = True

    def _step(self, req: Request, tokens: list[int], offset: int) -> None:
        import torch

        with torch.no_grad():
            tok = torch.tensor([tokens], dtype=torch.long)
            e = self.embed.layers[0]
            x = (e.tok[tok] + e.pos[offset: offset + len(tokens)]).numpy()
        self._send(req.chain[0], {"kind": STEP, "key": req.key, "chain": req.chain, "hop": 0,
                                  "at": 0, "x": x})

    def _next_token(self, x: np.ndarray) -> int:
        import torch

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
        requests on it run again from the prompt on other chains; a request that no chain of
        live workers can serve, or that is not done within ``timeout_s`` of its arrival, is
        rejected with the reason. A request with a ``sink`` queue
        gets each new token as it comes, then None, or a ``Rejected``."""
        from shoal.serving.routing import route_chain

        requests = requests or []
        t0 = time.perf_counter()
        pending = sorted(requests, key=lambda r: r.arrival)
        waiting: list[Request] = []
        live: dict[tuple[int, int], Request] = {}
        index = {n: i for i, n in enumerate(self.names)}
        k = 0

        def reject(r: Request, why: str) -> None:
            r.rejected = why
            if r.sink is not None:
                r.sink.put(Rejected(why))

        def admit(now: float) -> None:
            while waiting:
                r = waiting[0]
                chain = route_chain(self.router, self.kv, self.n, len(r.prompt), self.dead)
                if chain is None:
                    return
                waiting.pop(0)
                r.nodes = chain[:-1]
                r.chain = [self.names[v] for v in r.nodes] + ["coord"]
                if math.isnan(r.start):
                    r.start = now
                live[r.key] = r
                self._step(r, r.prompt, 0)

        def check_workers() -> None:
            for name in self.ranges:
                if index[name] in self.dead or self._alive(name):
                    continue
                self.dead.add(index[name])
                for r in [r for r in live.values() if index[name] in r.nodes]:
                    del live[r.key]
                    self._free(r)
                    r.attempt += 1
                    r.tokens, r.first = [], math.nan
                    waiting.insert(0, r)

        def more() -> bool:
            return k < len(pending) or (inbox is not None and not (stop and stop.is_set()))

        while more() or waiting or live:
            now = time.perf_counter() - t0
            if stop is not None and stop.is_set():  # the server stops: nothing more is answered
                for r in waiting + list(live.values()):
                    if r.key in live:
                        self._free(r)
                    reject(r, "the server stopped")
                waiting.clear()
                live.clear()
                break
            for r in [r for r in waiting + list(live.values())
                      if now - (r.arrival if inbox is None else r.entered) > timeout_s]:
                live.pop(r.key, None)
                if r in waiting:
                    waiting.remove(r)
                else:
                    self._free(r)
                reject(r, f"not finished within {timeout_s:g} s")
            check_workers()
            while k < len(pending) and pending[k].arrival <= now:
                pending[k].entered = now
                waiting.append(pending[k])
                k += 1
            while inbox is not None:
                try:
                    r = inbox.get_nowait()
                except queue.Empty:
                    break
                r.arrival = r.entered = now
                requests.append(r)
                waiting.append(r)
            admit(now)
            if not live and waiting and k >= len(pending):
                for r in waiting:
                    reject(r, "no chain of live workers holds the model" if self.dead else
                           "no chain of workers has KV room for the prompt")
                waiting.clear()
                if inbox is None:
                    break
            wait_ms = 50 if k >= len(pending) else max(0, int((pending[k].arrival - now) * 1000))
            msg = self._receive(min(wait_ms, 50 if inbox is None else 10))
            if msg is None:
                continue
            if msg["kind"] == HELLO:  # a worker started again, or late: the run has its own
                self._turn_away(msg, self._unwanted(msg) or "joined after the run started")
                continue
            if msg["kind"] != STEP:
                continue
            r = live.get(msg["key"])
            if r is None:  # from a run that a dead worker cut short
                continue
            now = time.perf_counter() - t0
            tok = self._next_token(msg["x"])
            r.tokens.append(tok)
            if r.sink is not None and len(r.tokens) > r.sent:  # a re-run repeats its tokens
                r.sink.put(tok)
                r.sent += 1
            if len(r.tokens) == 1:
                r.first = now
            if len(r.tokens) >= r.max_new:
                r.finish = now
                del live[r.key]
                self._free(r)
                if r.sink is not None:
                    r.sink.put(None)
                admit(now)
            else:
                self.router.decode_step(np.array(self.router.edges_of(r.nodes + [self.n + 1]),
                                                 dtype=int))
                self._step(r, [tok], len(r.prompt) + len(r.tokens) - 1)
        self.wall_s = time.perf_counter() - t0
        return requests

    def _free(self, r: Request) -> None:
        """Drop request ``r``'s caches on the live workers of its chain, and its KV
        reservation."""
        for v in r.nodes:
            if v not in self.dead:
                self._send(self.names[v], {"kind": FREE, "key": r.key})
        self.kv.release(r.nodes, len(r.prompt))

    def _alive(self, name: str) -> bool:
        if name in self.procs:
            return self.procs[name].is_alive()
        return not lost(*self.monitors[name])

    def close(self) -> None:
        index = {n: i for i, n in enumerate(self.names)}
        for name in self.ranges:
            if name in self.addr and index[name] not in self.dead:  # queued, never blocks
                self._send(name, {"kind": STOP})
                if name in self.remote:  # let it reach a worker this process does not wait for
                    self.push[name].close(linger=2000)
        for p in self.procs.values():
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        self.ctx.destroy(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def workload(spec, n: int, *, rate: float | None = None, lengths: np.ndarray | None = None,
             max_new: int | None = None, seed: int = 0):
    """A ``Workload`` of ``n`` requests for ``spec``: lengths from ``lengths`` (rows of prompt
    and output tokens, cycled) or like the Azure conversation trace with prompts scaled to at
    most half the model's context; outputs cut to the context left (and ``max_new``); arrivals
    Poisson at ``rate`` per second, or all at once."""
    from shoal.serving.workload import Workload, synthetic_lengths

    rng = np.random.default_rng(seed)
    ctx = spec.max_seq_len
    if lengths is None:
        raw = synthetic_lengths(n, seed).astype(float)
        scale = (ctx / 2) / 2048  # synthetic prompts reach 2048 tokens
        lengths = np.maximum(1, np.round(raw * [scale, 1.0])).astype(int)
    rows = np.resize(np.asarray(lengths, dtype=np.int64), (n, 2))
    prompt = rows[:, 0].clip(1, ctx // 2)
    output = np.minimum(rows[:, 1].clip(1), ctx - prompt)
    if max_new:
        output = output.clip(max=max_new)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n)) if rate else np.zeros(n)
    return Workload(prompt, output, arrival,
                    f"{n} requests" + (f", Poisson {rate:g}/s" if rate else ", all at once"))


def requests_from(work, spec, seed: int = 0) -> list[Request]:
    """One live request per request of ``work`` (an online workload, or all arriving at once):
    random prompt tokens of its prompt length, its output length as ``max_new``. A request
    longer than the model's context is a SpecError."""
    from shoal.errors import SpecError

    rng = np.random.default_rng(seed)
    arrival = work.arrival_s if work.arrival_s is not None else np.zeros(work.n)
    out = []
    for i, (p, o, t) in enumerate(zip(work.prompt, work.output, arrival, strict=True)):
        if p + o > spec.max_seq_len:
            raise SpecError(f"request {i}: {p} prompt + {o} output tokens pass the model's "
                            "context", field=work.source, value=int(p + o),
                            allowed=f"at most {spec.max_seq_len} tokens ({spec.name})")
        out.append(Request(i, rng.integers(0, spec.vocab_size, int(p)).tolist(), int(o),
                           arrival=float(t)))
    return out


def summary(requests: list[Request], wall_s: float) -> dict:
    """The simulator's metrics (``serve simulate --json``) of a live run: decode throughput, prompt
    latency (arrival to first token) and decode latency per token, completed and rejected."""
    from shoal.serving.simulator import _histogram, _stats

    done = [r for r in requests if r.rejected is None and not math.isnan(r.finish)]
    first = np.array([r.first - r.arrival for r in requests if not math.isnan(r.first)])
    dec = np.array([(r.finish - r.first) / (len(r.tokens) - 1) for r in done
                    if len(r.tokens) > 1])
    decode_tokens = sum(len(r.tokens) for r in requests)  # every generated token, as simulated
    prompt_tokens = sum(len(r.prompt) for r in requests if not math.isnan(r.first))
    reasons: dict[str, int] = {}
    for r in requests:
        if r.rejected:
            reasons[r.rejected] = reasons.get(r.rejected, 0) + 1
    return {"mode": "live", "window_s": wall_s,
            "decode_throughput_tokens_per_s": decode_tokens / wall_s if wall_s > 0 else 0.0,
            "tokens_per_s": (decode_tokens + prompt_tokens) / wall_s if wall_s > 0 else 0.0,
            "prompt_latency_s": _stats(first), "decode_latency_s": _stats(dec),
            "requests": {"completed": len(done), "rejected": len(requests) - len(done),
                         "rejected_why": reasons},
            "latency_histogram": {"prompt": _histogram(first), "decode": _histogram(dec)}}


def reference_generate(spec, prompts: list[list[int]], max_new: int, seed: int = 0,
                       dtype: str = "float32") -> list[list[int]]:
    """Greedy decoding in one process, the whole sequence recomputed at every step."""
    import torch

    from shoal.runtime.model import Stage

    model = Stage(spec, 0, spec.num_layers + 2, seed=seed, dtype=getattr(torch, dtype))
    model.requires_grad_(False)
    out = []
    for p in prompts:
        seq = list(p)
        with torch.no_grad():
            for _ in range(max_new):
                logits = model(torch.tensor([seq], dtype=torch.long))
                seq.append(int(logits[0, -1].argmax()))
        out.append(seq[len(p):])
    return out
