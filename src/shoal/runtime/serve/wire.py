"""The messages between a live server's coordinator and its workers, and the transport they
travel on (ZeroMQ, pyzmq).

Every worker binds a PULL socket and pushes its output to the next hop of the request's chain
(another worker, or the coordinator). A message is a JSON header and, when it carries hidden
states, their raw bytes in a second frame (no pickle: a worker may listen on a network). Anyone
who reaches a port can send anything, so every message is checked against its kind's fields
before it is used (``decode``); one that is not a message of this protocol is a ``BadMessage``.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from shoal.files import finite_float, json_depth

STOP, STEP, FREE, PEERS = "stop", "step", "free", "peers"
HELLO, CONFIG, READY, LINKED = "hello", "config", "ready", "linked"
PING, PONG = "ping", "pong"


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
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    return sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)


def lost(monitor, state: dict) -> bool:
    """Whether the peer ``monitor`` watches was connected and has gone (``state`` remembers
    both between calls; gone stays gone)."""
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
