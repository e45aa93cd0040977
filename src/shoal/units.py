"""The one parser from human units to SI base units (DESIGN §4).

Bytes, seconds, FLOP/s, bytes/s. Bits are never mixed with bytes silently: ``Gbps`` and ``Gbit/s``
are bits per second and are divided by 8; ``GB/s`` and ``GBps`` are bytes per second.
"""

from __future__ import annotations

import functools
import math
import re

from shoal.errors import shown

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_NUM = r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"


class UnitError(ValueError):
    """A value that is not a number with an allowed unit."""


def _split(text: object, kind: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {kind}, got a boolean")
    if isinstance(text, int | float):
        value, unit = float(text), ""
    elif not isinstance(text, str):
        raise UnitError(f"expected a {kind} such as {_EXAMPLES[kind]}, got {type(text).__name__}")
    else:
        m = re.fullmatch(_NUM + r"([A-Za-z/%]*)\s*", text)
        if not m:
            raise UnitError(f"cannot read {shown(text)} as a {kind}; write it like {_EXAMPLES[kind]}")
        value, unit = float(m.group(1)), m.group(2)
    if not math.isfinite(value):
        raise UnitError(f"{shown(text)} is not a finite {kind}")
    return value, unit


_EXAMPLES = {
    "size": "'40GB', '80GiB', '512MB' or a number of bytes",
    "time": "'50ms', '2.5s', '10us', '3h', '3d' or a number of seconds",
    "bandwidth": "'10Gbps' (bits), '25GB/s' (bytes) or a number of bytes/s",
    "flops": "'312TFLOPS' or a number of FLOP/s",
}


def _prefix(unit: str, tail: str) -> float | None:
    if not unit.endswith(tail):
        return None
    p = unit[: len(unit) - len(tail)]
    if p in _BIN:
        return _BIN[p]
    if p in _DEC:
        return _DEC[p]
    return None


def _finite(fn):
    """``fn``'s result, or a UnitError when the prefix took a finite number past the largest
    float ('1e308TB')."""
    @functools.wraps(fn)
    def parse(text: object) -> float:
        x = fn(text)
        if not math.isfinite(x):
            raise UnitError(f"{shown(text)} is too large a number")
        return x

    return parse


@_finite
def parse_bytes(text: object) -> float:
    """'40GB' -> 40e9, '80GiB' -> 80 * 2**30, '1.5TB' -> 1.5e12; a bare number is bytes."""
    value, unit = _split(text, "size")
    if unit in ("", "B"):
        return value
    for tail in ("B", "b"):
        f = _prefix(unit, tail)
        if f is not None:
            if tail == "b":
                raise UnitError(f"{shown(text)} is in bits; sizes are written in bytes (B)")
            return value * f
    raise UnitError(f"unknown size unit in {shown(text)}; write it like {_EXAMPLES['size']}")


@_finite
def parse_seconds(text: object) -> float:
    value, unit = _split(text, "time")
    scale = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0,
             "d": 86400.0}
    if unit not in scale:
        raise UnitError(f"unknown time unit in {shown(text)}; write it like {_EXAMPLES['time']}")
    return value * scale[unit]


@_finite
def parse_bandwidth(text: object) -> float:
    """Bytes per second. 'Gbps'/'Gbit/s' are bits; 'GB/s'/'GBps' are bytes."""
    value, unit = _split(text, "bandwidth")
    if unit in ("", "B/s", "Bps"):
        return value
    for tail, per_byte in (("bps", 1 / 8), ("bit/s", 1 / 8), ("B/s", 1.0), ("Bps", 1.0)):
        f = _prefix(unit, tail)
        if f is not None:
            return value * f * per_byte
    raise UnitError(f"unknown bandwidth unit in {shown(text)}; write it like {_EXAMPLES['bandwidth']}")


@_finite
def parse_flops(text: object) -> float:
    value, unit = _split(text, "flops")
    if unit in ("", "FLOPS", "FLOP/s"):
        return value
    for tail in ("FLOPS", "FLOP/s"):
        f = _prefix(unit, tail)
        if f is not None and not unit.startswith(tuple(_BIN)):
            return value * f
    raise UnitError(f"unknown FLOP/s unit in {shown(text)}; write it like {_EXAMPLES['flops']}")


def fmt_bytes(n: float) -> str:
    """Bytes in binary units, as memory is sold and shown by the GPU tools (an 80 GB GPU is
    80 GiB): TiB, GiB, MiB, KiB."""
    for unit, f in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(t: float) -> str:
    if t >= 2 * 86400:
        return f"{t / 86400:.2f} d"
    if t >= 2 * 3600:
        return f"{t / 3600:.2f} h"
    if t >= 600:
        return f"{t / 60:.1f} min"
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_per_usd(x: float | None) -> str:
    """A quantity per USD (tokens per USD, say); "—" for none (nothing was paid: free GPUs)."""
    return "—" if x is None else f"{x:,.0f}"
