"""A live server's worker: one process per node that holds layers, started by the coordinator
(``LiveServer``) on its machine or by ``shoal serve worker`` on the node's host.

It says hello to the coordinator with its address and gets its layers; it takes every message
that arrived while it ran its previous batch (dynamic batching) and runs each request's step
with that request's cache, then forwards the hidden states to the next hop of the request's
chain. A request whose chain enters a worker past the start of its range (partial inference)
runs only the blocks from there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import torch
import zmq
from pydantic import ValidationError

from shoal.runtime.serve.shard import Shard
from shoal.runtime.serve.wire import (
    CONFIG,
    FREE,
    HELLO,
    LINKED,
    PEERS,
    PING,
    PONG,
    READY,
    STEP,
    STOP,
    BadMessage,
    decode,
    frame_limit,
    lost,
    send,
    watch,
)
from shoal.specs.model import ModelSpec


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
        if self.shard is not None:
            raise BadMessage("config: a second configuration")
        try:
            spec = ModelSpec.model_validate_json(msg["spec"])
        except ValidationError:
            raise BadMessage("config: not a model spec") from None
        if not msg["a"] < msg["b"] <= spec.num_layers:
            raise BadMessage("config: a range outside the model")
        self.shard = Shard(spec, msg["a"], msg["b"], msg["seed"], msg["dtype"])

