"""The coordinator's side of its workers: starting them (on this machine, or waiting for those
on the hosts the serving file names), their addresses and the sockets to them, the messages to
and from them, and finding a dead one, starting it again and linking it back in.

A worker says hello with its address and gets the model and its layer range; it says ready;
once every worker is ready, every worker gets every worker's address and says linked. A worker
started again goes through the same steps on its own, in an address round of its own: it is
routed to once every live worker and it know its new address.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import secrets
import time

import zmq

from shoal.errors import ShoalError, SpecError
from shoal.runtime.serve.wire import (
    CONFIG,
    HELLO,
    LINKED,
    PEERS,
    PONG,
    READY,
    STOP,
    BadMessage,
    frame_limit,
    lost,
    recv,
    send,
    watch,
)
from shoal.runtime.serve.worker import spawned_worker
from shoal.specs.serving import split_address


class WorkerPool:
    """The workers of every node that holds layers in ``placement``: those without a ``host``
    started here as processes, the others awaited from their hosts, all started and linked
    within ``start_timeout_s`` (else a ShoalError, with every process started here stopped).

    Every message is checked (``decode``); one that is malformed or makes no sense where it
    arrives is dropped and counted in ``dropped`` (by reason), never fatal. A worker this
    machine started that dies (its process ends, or its queue fills because it takes nothing)
    is started again, up to ``restarts`` times per node; a worker on another host that is lost
    stays out (it does not rejoin a running server). ``dead`` holds the indices of the nodes
    whose worker is out of routing."""

    def __init__(self, cluster, placement, spec, *, seed: int, dtype: str,
                 start_timeout_s: float, restarts: int):
        self.n = cluster.n
        self.names = cluster.names
        self.index = {nm: i for i, nm in enumerate(self.names)}
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.MAXMSGSIZE, frame_limit(spec))
        self.here, port = self._bind(cluster.coordinator_address)
        self.addr = {"coord": f"tcp://{self.here}:{port}"}
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
        self._tended = 0.0  # when the health snapshot was renewed (0: at the next turn)
        for name in self.ranges:
            if name not in self.remote:
                self._spawn(name)
        try:
            self._start(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _bind(self, address: str | None) -> tuple[str, int]:
        """Listen on the serving file's coordinator ``address`` (workers on other hosts reach
        it there), or on a free port of this machine's loopback."""
        here = "127.0.0.1"
        if address is None:
            return here, self.pull.bind_to_random_port(f"tcp://{here}")
        here, port = split_address(address)
        try:
            self.pull.bind(f"tcp://{here}:{port}")
        except zmq.ZMQError as exc:
            self.ctx.destroy(linger=0)
            raise SpecError(f"cannot listen there: {exc}", field="coordinator.address",
                            value=address,
                            allowed="an IP address of this machine and a free port") from None
        return here, port

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

    def _control(self, msg: dict) -> None:
        """Act on a message from a worker about itself (not a request's step): a hello, ready,
        linked or pong. A BadMessage for one that makes no sense here: of a kind only workers
        take, or from no worker of ours."""
        kind = msg["kind"]
        if kind == HELLO:  # a worker started again, or one not needed (told why)
            self._hello(msg)
            return
        if kind in (READY, LINKED, PONG) and msg["worker"] not in self.addr:
            raise BadMessage(f"{kind} from no worker of this server")
        if kind == READY:
            if msg["worker"] in self.starting:
                self._link(msg["worker"])
            return
        if kind == LINKED:
            if msg["round"] in self.rounds:
                self.rounds[msg["round"]][1].discard(msg["worker"])
                self._settle()
            return
        if kind == PONG:
            self.seen[msg["worker"]] = time.perf_counter()
            self.worker_dropped[msg["worker"]] = msg["dropped"]
            return
        raise BadMessage(f"{kind} is not for the coordinator")

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
        tmp = self.ctx.socket(zmq.PUSH)
        with contextlib.suppress(zmq.Again, zmq.ZMQError):  # an address it cannot reach
            tmp.connect(hello["addr"])
            send(tmp, {"kind": STOP, "why": f"node {hello['worker']} {why}"}, flags=zmq.NOBLOCK)
        tmp.close(linger=1000)

    def _connect(self, name: str) -> None:
        """A socket to worker ``name``; one on another host is watched (its process ending, or
        its host going silent, drops the connection)."""
        sock = self.ctx.socket(zmq.PUSH)
        if name in self.remote:
            self.monitors[name] = (watch(sock), {})
        sock.connect(self.addr[name])
        self.push[name] = sock

    def _send(self, to: str, msg: dict) -> None:
        """Queue a message for worker ``to``; never blocks. A worker whose queue is full takes
        no messages (hung, or dead and not yet seen to be): one on another host is taken as
        lost, one this machine started is killed (and started again)."""
        if to not in self.push:
            self._connect(to)
        try:
            send(self.push[to], msg, flags=zmq.NOBLOCK)
        except zmq.Again:
            if to in self.remote:
                self.monitors[to][1]["gone"] = True
            else:
                self.procs[to].kill()

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
