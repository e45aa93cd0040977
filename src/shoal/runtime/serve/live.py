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

import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import re
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from shoal.errors import ShoalError, SpecError
from shoal.files import finite_float, json_depth

STOP, STEP, FREE, PEERS = "stop", "step", "free", "peers"
HELLO, CONFIG, READY, LINKED = "hello", "config", "ready", "linked"
PING, PONG = "ping", "pong"


@dataclass(frozen=True)
class Rejected:
    """Put in a request's sink when it is rejected."""

    reason: str


class Shard:
    """Blocks ``[a, b)`` of the model (block indices, not the layer list) with one KV cache per
    request: the runtime's blocks (``shoal.runtime.model.Block``), which decode with a cache."""

    def __init__(self, spec, a: int, b: int, seed: int = 0, dtype_name: str = "float32"):
        import torch

        from shoal.runtime.model import KVCache, Stage

        self.a, self.b = a, b
        self.new_cache = KVCache
        self.spec, self.dtype = spec, np.dtype(DTYPES[dtype_name])
        self.stage = Stage(spec, a + 1, b + 1, seed=seed, dtype=getattr(torch, dtype_name))
        self.stage.requires_grad_(False)
        self.cache: dict[int, list] = {}

    def step(self, rid, x: np.ndarray, at: int) -> np.ndarray:
        """Run the blocks from ``at`` (where the hidden state ``x`` stands) to the end of the
        range, with and into the request's cache."""
        import torch

        cache = self.cache.setdefault(rid, [self.new_cache() for _ in range(self.b - self.a)])
        h = torch.from_numpy(x)
        with torch.no_grad():
            for i in range(max(at, self.a), self.b):
                h = self.stage.layers[i - self.a](h, cache[i - self.a])
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


class BadMessage(ValueError):
    """Frames that are not a message of this protocol, or one that makes no sense where it
    arrived: dropped and counted, never acted on."""


# Anyone who reaches a port can send anything: every message is checked against its kind's
# fields before it is used. Names and counts are bounded so that no header, however crafted,
# costs more than its own bytes.
MAX_HEADER_BYTES = 1 << 20
MAX_DEPTH = 8  # a header nests two levels (peers, key); json.loads recurses per level
DTYPES = {"float32": "<f4", "float64": "<f8"}
_ADDRESS = re.compile(r"tcp://[A-Za-z0-9.\-]{1,253}:([0-9]{1,5})")


def _name(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 256


def _count(v) -> bool:
    return type(v) is int and 0 <= v < 2**62


def _address(v) -> bool:
    m = _ADDRESS.fullmatch(v) if isinstance(v, str) else None
    return m is not None and 0 < int(m.group(1)) < 65536


def _key(v) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_count(x) for x in v)


def _chain(v) -> bool:
    return isinstance(v, list) and 0 < len(v) <= 4096 and all(_name(x) for x in v)


def _peers(v) -> bool:
    return isinstance(v, dict) and len(v) <= 4096 and all(
        _name(k) and _address(a) for k, a in v.items())


def _seconds(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v >= 0


def _why(v) -> bool:
    return v is None or (isinstance(v, str) and len(v) <= 4096)


def _text(v) -> bool:
    return isinstance(v, str)


# kind -> (required fields, optional fields, carries hidden states x)
FIELDS: dict[str, tuple[dict, dict, bool]] = {
    STOP: ({}, {"why": _why}, False),
    HELLO: ({"worker": _name, "addr": _address, "spawned": lambda v: isinstance(v, bool)},
            {"token": _name}, False),
    CONFIG: ({"spec": _text, "a": _count, "b": _count, "seed": _count,
              "dtype": lambda v: v in DTYPES}, {}, False),
    READY: ({"worker": _name}, {}, False),
    PEERS: ({"peers": _peers, "round": _count}, {}, False),
    LINKED: ({"worker": _name, "round": _count}, {}, False),
    STEP: ({"key": _key, "chain": _chain, "hop": _count, "at": _count}, {"busy": _seconds},
           True),
    FREE: ({"key": _key}, {}, False),
    PING: ({}, {}, False),
    PONG: ({"worker": _name, "dropped": _count}, {}, False),
}


def decode(frames: list[bytes]) -> dict:
    """The message ``send`` sent, from its frames (``key`` as a tuple, ``x`` as an array), or a
    BadMessage saying what is wrong: not one JSON object of a known kind, a field missing or of
    the wrong type, or hidden states whose announced dtype and shape do not match their bytes.
    Fields the kind does not have are dropped."""
    if not 1 <= len(frames) <= 2:
        raise BadMessage(f"{len(frames)} frames")
    head = bytes(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise BadMessage(f"a header of {len(head):,} bytes")
    if json_depth(head, MAX_DEPTH) > MAX_DEPTH:
        raise BadMessage("a header nested too deeply")
    try:
        raw = json.loads(head, parse_float=finite_float)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a number past a float's range
        raise BadMessage("not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str) \
            or raw["kind"] not in FIELDS:
        raise BadMessage("not a message of a known kind")
    kind = raw["kind"]
    need, may, with_x = FIELDS[kind]
    msg = {"kind": kind}
    for key, ok in (need | may).items():
        if key not in raw:
            if key in need:
                raise BadMessage(f"{kind}: no '{key}'")
            continue
        if not ok(raw[key]):
            raise BadMessage(f"{kind}: a bad '{key}'")
        msg[key] = raw[key]
    if "key" in msg:
        msg["key"] = tuple(msg["key"])
    if with_x:
        if len(frames) != 2:
            raise BadMessage(f"{kind}: no hidden states")
        msg["x"] = _array(raw.get("x"), frames[1])
    elif len(frames) != 1:
        raise BadMessage(f"{kind}: a frame too many")
    return msg


def _array(spec, data) -> np.ndarray:
    """Hidden states (1, positions, hidden) of a dtype ``send`` uses, from an announced [dtype,
    shape] and the bytes that must match it exactly."""
    if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in DTYPES.values()
            and isinstance(spec[1], list) and len(spec[1]) == 3
            and all(type(d) is int and 0 < d < 2**31 for d in spec[1]) and spec[1][0] == 1):
        raise BadMessage("step: hidden states announced as something else than "
                         "[float32 or float64, [1, positions, hidden]]")
    dt = np.dtype(spec[0])
    shape = tuple(spec[1])
    if len(data) != math.prod(shape) * dt.itemsize:
        raise BadMessage(f"step: {len(data):,} bytes for hidden states of shape {shape} "
                         f"({dt.name})")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()


def recv(sock, flags: int = 0) -> dict:
    """The next message on ``sock`` (``decode``), or a BadMessage."""
    return decode(sock.recv_multipart(flags))


def frame_limit(spec) -> int:
    """The most bytes one message of a run of ``spec`` carries (a whole context of hidden
    states in float64, and a header): ZeroMQ drops a peer that sends more, before it is read."""
    return spec.max_seq_len * spec.hidden_size * 8 + MAX_HEADER_BYTES


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


def spawned_worker(name: str, coord: str, bind: str, token: str | None = None) -> None:
    """``worker_main`` in a process ``LiveServer`` started: Ctrl-C in the terminal is the
    coordinator's to act on (it stops its workers, and a worker ends with it), so the worker
    ignores it rather than print a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker_main(name, coord, bind, token=token)


def worker_main(name: str, coord: str, bind: str = "127.0.0.1", advertise: str | None = None,
                with_parent: bool = True, token: str | None = None) -> str | None:
    """A worker process for node ``name``: receive steps, run them in batches of whatever has
    arrived, forward. Returns why it stopped (None: told to by the coordinator).

    It binds a port of its own on ``bind`` (a port picked for it beforehand can be taken by
    another process before it binds) and says hello to the coordinator at ``coord`` with the
    address others reach it at (``advertise``, default ``bind``) and the ``token`` its parent
    gave it (a worker ``shoal serve run`` started); the coordinator answers with the model and
    its layer range, and, once every worker is ready, with every worker's address (again
    whenever a worker is replaced). It ends with its parent process (``with_parent``, a worker
    ``shoal serve run`` started) or when the coordinator's connection drops (a worker on another
    host). A message that is malformed, or makes no sense here, is dropped and counted (the
    count goes back with every answer to the coordinator's ping), never fatal."""
    import torch
    import zmq

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
    w = _Worker(name, ctx, coord)
    monitor = None if with_parent else watch(w.push["coord"])
    w.push["coord"].connect(coord)
    state: dict = {}
    hello = {"kind": HELLO, "worker": name, "spawned": with_parent,
             "addr": f"tcp://{advertise or bind}:{port}"}
    w.send("coord", hello | ({"token": token} if token else {}))
    parent = os.getppid()
    while not w.stopped:
        if not pull.poll(1000):
            if with_parent and os.getppid() != parent:  # the coordinator is gone: so is this
                w.stop("the coordinator's process ended")
            # the coordinator's stop may be on its way as its connection closes
            elif monitor is not None and lost(monitor, state) and not pull.poll(500):
                w.stop(f"the coordinator at {coord} went away")
            continue
        batch = []
        while True:  # dynamic batching: everything that arrived while the last batch ran
            try:
                batch.append(pull.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        for frames in batch:
            try:
                w.handle(decode(frames))
            except Exception:  # whatever a message does, the worker goes on
                w.dropped += 1
            if w.stopped:
                break
        if w.shard is not None and not w.limited:  # new connections, once the model is known
            pull.setsockopt(zmq.MAXMSGSIZE, frame_limit(w.shard.spec))
            w.limited = True
    ctx.destroy(linger=0)
    return w.why


class _Worker:
    """A worker's state between messages: its shard, the addresses of the others and a socket
    to each it has sent to, and how many messages it dropped."""

    def __init__(self, name: str, ctx, coord: str):
        import zmq

        self.name, self.ctx = name, ctx
        self.peers = {"coord": coord}
        self.push = {"coord": ctx.socket(zmq.PUSH)}
        self.shard: Shard | None = None
        self.dropped = 0
        self.stopped, self.why = False, None
        self.limited = False

    def stop(self, why: str | None) -> None:
        self.stopped, self.why = True, why

    def send(self, to: str, msg: dict) -> None:
        import zmq

        if to not in self.push:
            sock = self.ctx.socket(zmq.PUSH)
            try:
                sock.connect(self.peers[to])
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise BadMessage(f"cannot reach {to}: {exc}") from None
            self.push[to] = sock
        # a peer that takes nothing (its queue full: dead or stuck) must not stop this worker;
        # the message is lost, and the coordinator runs its request again or times it out
        with contextlib.suppress(zmq.Again):
            send(self.push[to], msg, zmq.NOBLOCK)

    def handle(self, msg: dict) -> None:
        """Act on one message (a stop: ``stopped``, and ``why``). A BadMessage for one that
        makes no sense here (a second configuration, a step before the first or for other hidden
        states than the shard's, a chain leading nowhere this worker knows)."""
        kind = msg["kind"]
        if kind == STOP:
            self.stop(msg.get("why"))
            return
        if kind == PING:
            self.send("coord", {"kind": PONG, "worker": self.name, "dropped": self.dropped})
            return
        if kind == CONFIG:
            self.configure(msg)
            self.send("coord", {"kind": READY, "worker": self.name})
            return
        if kind == PEERS:
            for to, addr in msg["peers"].items():
                if to in self.push and self.peers.get(to) != addr:  # a replaced worker
                    self.push.pop(to).close(linger=0)
            self.peers.update(msg["peers"])
            self.send("coord", {"kind": LINKED, "worker": self.name, "round": msg["round"]})
            return
        if self.shard is None:
            raise BadMessage(f"{kind} before the configuration")
        if kind == FREE:
            self.shard.cache.pop(msg["key"], None)
            return
        if kind != STEP:
            raise BadMessage(f"{kind} is not for a worker")
        hop = msg["hop"] + 1
        if hop >= len(msg["chain"]) or msg["chain"][hop] not in self.peers:
            raise BadMessage("step: its chain leads nowhere this worker knows")
        x = msg["x"]
        if x.dtype != self.shard.dtype or x.shape[2] != self.shard.spec.hidden_size:
            raise BadMessage(f"step: hidden states {x.dtype.name} of width {x.shape[2]}")
        t0 = time.perf_counter()
        try:
            y = self.shard.step(msg["key"], x, msg["at"])
        except RuntimeError as exc:  # torch: positions that do not fit the request's cache
            raise BadMessage(f"step: {exc}") from None
        self.send(msg["chain"][hop], {**msg, "x": y, "at": self.shard.b, "hop": hop,
                                      "busy": msg.get("busy", 0.0) + time.perf_counter() - t0})

    def configure(self, msg: dict) -> None:
        from pydantic import ValidationError

        from shoal.specs.model import ModelSpec

        if self.shard is not None:
            raise BadMessage("config: a second configuration")
        try:
            spec = ModelSpec.model_validate_json(msg["spec"])
        except ValidationError:
            raise BadMessage("config: not a model spec") from None
        if not msg["a"] < msg["b"] <= spec.num_layers:
            raise BadMessage("config: a range outside the model")
        self.shard = Shard(spec, msg["a"], msg["b"], msg["seed"], msg["dtype"])


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

    def __init__(self, cluster, placement, flow, spec, *, seed: int = 0, dtype: str = "float32",
                 router: str = "iwrr", mean_output: float = 16.0, mode: str = "online",
                 start_timeout_s: float = 120.0, restarts: int = 3):
        import torch
        import zmq

        from shoal.runtime.model import Stage
        from shoal.serving.perf import kv_capacity
        from shoal.serving.routing import KVCache, Router
        from shoal.serving.simulator import KV_SETTINGS

        if cluster.layers != spec.num_layers:
            raise SpecError(f"the placement splits {cluster.layers} layers but {spec.name} has "
                            f"{spec.num_layers} blocks", field="--model", value=spec.name,
                            allowed=f"a model of {cluster.layers} blocks, or a serving file and "
                                    f"placement over {spec.num_layers} layers")
        self.cluster, self.pl, self.spec = cluster, placement, spec
        self.n = cluster.n
        self.names = cluster.names
        self.index = {nm: i for i, nm in enumerate(self.names)}
        self.router = Router(router, cluster, placement, flow, seed, mean_output=mean_output)
        layers = np.array([(r[1] - r[0]) if r else 0 for r in placement.ranges], dtype=float)
        hw, ratio = KV_SETTINGS[mode]
        self.kv = KVCache(kv_capacity(cluster, placement), layers, hw, ratio, mean_output)
        dt = getattr(torch, dtype)
        self.dtype = np.dtype(DTYPES[dtype])
        L = spec.num_layers
        self.embed = Stage(spec, 0, 1, seed=seed, dtype=dt).requires_grad_(False)
        self.head = Stage(spec, L + 1, L + 2, seed=seed, dtype=dt).requires_grad_(False)
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.MAXMSGSIZE, frame_limit(spec))
        here = "127.0.0.1"
        if cluster.coordinator_address is not None:  # workers on other hosts reach it there
            from shoal.specs.serving import split_address

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
        self.here = here
        self.addr = {"coord": f"tcp://{here}:{port}"}
        hosts = cluster.hosts or (None,) * self.n
        self.ranges = {self.names[i]: r for i, r in enumerate(placement.ranges) if r is not None}
        self.remote = {nm: hosts[i] for i, nm in enumerate(self.names)
                       if hosts[i] is not None and nm in self.ranges}
        self.config = {"kind": CONFIG, "spec": spec.model_dump_json(), "seed": seed,
                       "dtype": dtype}
        # spawn, not fork: a forked child of a process whose torch thread pool has run can hang
        self.mctx = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.tokens: dict[str, str] = {}  # what a worker this process started says in its hello
        self.push: dict = {}
        self.monitors: dict = {}  # remote worker -> (monitor socket, its state)
        self.dead: set[int] = set()
        self.awaited = set(self.ranges)  # workers whose hello is expected
        self.max_restarts = restarts
        self.restarts = dict.fromkeys(self.ranges, 0)
        self.starting: dict[str, float] = {}  # worker started again -> deadline to be linked
        self.rounds: dict[int, tuple[str, set[str]]] = {}  # address round -> (new worker,
        self.round = 0                                      # workers yet to say linked)
        self.start_timeout_s = start_timeout_s
        self.seen: dict[str, float] = {}  # worker -> when it last answered a ping
        self.worker_dropped: dict[str, int] = {}  # worker -> messages it dropped (its pong)
        self.dropped: dict[str, int] = {}  # why -> messages the coordinator dropped
        self.health: dict = {}
        self._tended = self._pinged = 0.0
        self.wall_s = 0.0
        for name in self.ranges:
            if name not in self.remote:
                self._spawn(name)
        try:
            self._start(start_timeout_s)
        except BaseException:
            self.close()
            raise
        self._snapshot(0, 0)

    @property
    def workers(self) -> list[str]:
        """Every node that holds layers, here or on another host."""
        return list(self.ranges)

    def _spawn(self, name: str) -> None:
        self.tokens[name] = secrets.token_hex(8)
        p = self.mctx.Process(target=spawned_worker, daemon=True,
                              args=(name, self.addr["coord"], self.here, self.tokens[name]))
        p.start()
        self.procs[name] = p

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
                if msg["kind"] == HELLO:
                    self._hello(msg)
                elif msg["kind"] == kind and msg["worker"] in self.addr:
                    done.add(msg["worker"])
            if kind == READY:
                for name in self.ranges:
                    self._send(name, {"kind": PEERS, "peers": self.addr, "round": 0})
        self.awaited.clear()

    def _receive(self, timeout_ms: int) -> dict | None:
        """The next message within ``timeout_ms``, or None; frames that are not a message of
        ours (from a stray or hostile peer on the coordinator's port) are dropped and
        counted."""
        import zmq

        if not self.pull.poll(timeout_ms):
            return None
        try:
            return recv(self.pull, zmq.NOBLOCK)
        except zmq.Again:
            return None
        except BadMessage as exc:
            self._drop(str(exc))
            return None

    def _drop(self, why: str) -> None:
        if why not in self.dropped and len(self.dropped) >= 32:  # reasons stay a short list
            why = "other"
        self.dropped[why] = self.dropped.get(why, 0) + 1
        self._tended = 0.0  # health shows it at the next turn

    def _hello(self, msg: dict) -> None:
        """A worker says hello: it gets its layers, or is told why it is not needed."""
        why = self._unwanted(msg)
        if why is not None:
            self._turn_away(msg, why)
            return
        name = msg["worker"]
        self.awaited.discard(name)
        self.addr[name] = msg["addr"]
        self._connect(name)
        a, b = self.ranges[name]
        self._send(name, self.config | {"a": a, "b": b})

    def _unwanted(self, hello: dict) -> str | None:
        """Why the worker saying ``hello`` is not needed, or None."""
        name = hello["worker"]
        if name not in self.names:
            return "is not a node of this serving file"
        if name not in self.ranges:
            return "holds no layers in this placement"
        if name in self.procs and hello.get("token") != self.tokens[name]:
            return ("already has a worker" if hello["spawned"] else
                    "runs on the coordinator's machine in its serving file (no 'host')")
        if name in self.addr:
            return ("was lost and does not rejoin a running server"
                    if self.index[name] in self.dead else "already has a worker")
        if name not in self.awaited:
            return "joined after the run started"
        return None

    def _turn_away(self, hello: dict, why: str) -> None:
        import zmq

        tmp = self.ctx.socket(zmq.PUSH)
        with contextlib.suppress(zmq.Again, zmq.ZMQError):  # an address it cannot reach
            tmp.connect(hello["addr"])
            send(tmp, {"kind": STOP, "why": f"node {hello['worker']} {why}"}, flags=zmq.NOBLOCK)
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
        """Queue a message for worker ``to``; never blocks. A worker whose queue is full takes
        no messages (hung, or dead and not yet seen to be): one on another host is taken as
        lost, one this machine started is killed (and started again)."""
        import zmq

        if to not in self.push:
            self._connect(to)
        try:
            send(self.push[to], msg, flags=zmq.NOBLOCK)
        except zmq.Again:
            if to in self.remote:
                self.monitors[to][1]["gone"] = True
            else:
                self.procs[to].kill()

    def _step(self, req: Request, tokens: list[int], offset: int) -> None:
        import torch

        with torch.no_grad():
            tok = torch.tensor([tokens], dtype=torch.long)
            x = self.embed.layers[0](tok, start=offset).numpy()
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
        requests on it run again from the prompt on other chains (a worker started again is
        routed to once it is linked); a request that no chain of live workers can serve (and
        no worker is being started again), or that is not done within ``timeout_s`` of its
        arrival, is rejected with the reason. A request with a ``sink`` queue gets each new
        token as it comes, then None, or a ``Rejected``."""
        from shoal.serving.routing import route_chain

        requests = requests or []
        t0 = time.perf_counter()
        pending = sorted(requests, key=lambda r: r.arrival)
        waiting: list[Request] = []
        live: dict[tuple[int, int], Request] = {}
        k = 0

        def reject(r: Request, why: str) -> None:
            r.rejected = why
            if r.sink is not None:
                r.sink.put(Rejected(why))

        def admit(now: float) -> None:
            while waiting:
                r = waiting[0]
                chain = route_chain(self.router, self.kv, self.n, len(r.prompt),
                                    self.dead)
                if chain is None:
                    return
                waiting.pop(0)
                r.nodes = chain[:-1]
                r.chain = [self.names[v] for v in r.nodes] + ["coord"]
                if math.isnan(r.start):
                    r.start = now
                live[r.key] = r
                self._step(r, r.prompt, 0)

        def again(name: str) -> None:
            """The requests on worker ``name``, which died, wait to run from the prompt."""
            for r in [r for r in live.values() if self.index[name] in r.nodes]:
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
            for name in self._check_workers():
                again(name)
            self._tend(len(waiting), len(live))
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
            if not live and waiting and k >= len(pending) and not self.starting:
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
            try:
                r = self._handle(msg, live)
            except BadMessage as exc:
                self._drop(str(exc))
                continue
            except Exception as exc:  # no message may stop the loop
                self._drop(f"could not be handled: {type(exc).__name__}")
                continue
            if r is None:
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
        self._snapshot(0, 0)
        return requests

    def _handle(self, msg: dict, live: dict) -> Request | None:
        """Act on a message from a worker; the request whose next token it carries, if it is
        one. A BadMessage for one that makes no sense here: of a kind only workers take, from
        no worker of ours, or a step's hidden states of another shape or chain than its
        request's."""
        kind = msg["kind"]
        if kind == HELLO:  # a worker started again, or one not needed (told why)
            self._hello(msg)
            return None
        if kind in (READY, LINKED, PONG) and msg["worker"] not in self.addr:
            raise BadMessage(f"{kind} from no worker of this server")
        if kind == READY:
            if msg["worker"] in self.starting:
                self._link(msg["worker"])
            return None
        if kind == LINKED:
            if msg["round"] in self.rounds:
                self.rounds[msg["round"]][1].discard(msg["worker"])
                self._settle()
            return None
        if kind == PONG:
            self.seen[msg["worker"]] = time.perf_counter()
            self.worker_dropped[msg["worker"]] = msg["dropped"]
            return None
        if kind != STEP:
            raise BadMessage(f"{kind} is not for the coordinator")
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

    def _check_workers(self) -> list[str]:
        """Workers found dead since the last call (each taken out of routing and started
        again if this machine started it); a worker started again that ended, or was not
        linked within the start timeout, is killed and started again."""
        now = time.perf_counter()
        gone = []
        for name in self.ranges:
            if name in self.starting:
                p = self.procs[name]
                if p.is_alive() and now < self.starting[name]:
                    continue
                p.kill()
                self.starting.pop(name)
                self._unlink(name)
                self._restart(name)
                continue
            if self.index[name] in self.dead or self._alive(name):
                continue
            self.dead.add(self.index[name])
            self._tended = 0.0
            gone.append(name)
            self._unlink(name)
            self._restart(name)
        return gone

    def _restart(self, name: str) -> None:
        """Start worker ``name`` again, if this machine started it and it has restarts left;
        it stays out of routing until ``_settle`` finds it linked."""
        if name not in self.procs or self.restarts[name] >= self.max_restarts:
            return
        self.restarts[name] += 1
        old = self.push.pop(name, None)
        if old is not None:
            old.close(linger=0)
        self.addr.pop(name, None)
        self.seen.pop(name, None)
        self.awaited.add(name)
        self._spawn(name)
        self.starting[name] = time.perf_counter() + self.start_timeout_s

    def _link(self, name: str) -> None:
        """Worker ``name``, started again, has its layers: every live worker and it get the
        addresses (its new one) and say linked."""
        self.round += 1
        # every worker that holds an address: live ones, and others started again (one not
        # yet linked must learn this address too)
        told = {n for n in self.ranges if n in self.addr
                and (self.index[n] not in self.dead or n in self.starting)}
        self.rounds[self.round] = (name, told)
        for n in told:
            self._send(n, {"kind": PEERS, "peers": self.addr, "round": self.round})

    def _unlink(self, name: str) -> None:
        """Worker ``name`` died: no address round waits for it, and one for it is void."""
        self.rounds = {k: (new, told - {name}) for k, (new, told) in self.rounds.items()
                       if new != name}
        self._settle()

    def _settle(self) -> None:
        """Route to each worker started again whose round every worker has linked."""
        for k, (name, told) in list(self.rounds.items()):
            if not told:
                del self.rounds[k]
                if self.starting.pop(name, None) is not None:
                    self.dead.discard(self.index[name])
                    self.seen[name] = time.perf_counter()
                    self._tended = 0.0

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
        from shoal.serving.routing import reachable

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

    def _alive(self, name: str) -> bool:
        if name in self.procs:
            return self.procs[name].is_alive()
        return not lost(*self.monitors[name])

    def close(self) -> None:
        for name in self.ranges:
            if name in self.addr and (self.index[name] not in self.dead
                                      or name in self.starting):  # queued, never blocks
                self._send(name, {"kind": STOP})
                if name in self.remote:  # let it reach a worker this process does not wait for
                    self.push[name].close(linger=2000)
        for name, p in self.procs.items():
            if name not in self.addr:  # started (again), not yet configured: nothing to stop
                p.kill()
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
