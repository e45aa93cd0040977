"""Links between GPUs: bandwidth as a function of message size, latency, egress prices.

A curve is stored as five numbers ``(a, b, c, lo, hi)``: with ``x = log2(n / 1e6)`` for a message of
``n`` bytes, bandwidth is ``(a*x^2 + b*x + c) * 1e9`` bytes/s, clamped to ``[lo, hi]``. A constant
bandwidth is ``(0, 0, bw/1e9, bw, bw)``. Fitted quadratics (Sailor's form) turn down past their
vertex and below zero for tiny messages; we hold the value at the vertex for larger messages (a
bigger message never moves slower); convex ones turn up below their vertex, where we hold the
vertex (a smaller message never moves faster); and we floor the curve at 2% of its maximum (about
the rate a latency-bound 32 kB message reaches on the measured GH200 and A100 links).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal import catalog
from shoal.errors import SpecError
from shoal.specs.network import CurveSpec, LinkSpec, NetworkSpec

FLOOR_FRACTION = 0.02


def curve_array(spec: CurveSpec) -> np.ndarray:
    if spec.kind == "constant":
        bw = float(spec.bandwidth)
        return np.array([0.0, 0.0, bw / 1e9, bw, bw])
    a, b, c = spec.coeffs
    hi = float(spec.max) if spec.max else _poly_max(a, b, c) * 1e9
    lo = float(spec.floor) if spec.floor else FLOOR_FRACTION * hi
    return np.array([a, b, c, lo, hi])


def _poly_max(a: float, b: float, c: float) -> float:
    if a < 0:
        xv = -b / (2 * a)
        return a * xv * xv + b * xv + c
    return a * 30 * 30 + b * 30 + c  # up to a 1 PB message: a convex fit has no maximum


def bandwidth(curve: np.ndarray, nbytes) -> np.ndarray:
    """Bytes/s for messages of ``nbytes`` (vectorised; ``curve`` may be (..., 5))."""
    a, b, c, lo, hi = (curve[..., i] for i in range(5))
    x = np.log2(np.maximum(np.asarray(nbytes, dtype=float), 1.0) / 1e6)
    with np.errstate(divide="ignore", invalid="ignore"):
        xv = -b / np.where(a != 0, 2 * a, 1.0)
    # concave fits turn down past their vertex: hold the vertex for larger messages; convex fits
    # turn up below theirs: hold the vertex for smaller messages
    x = np.where(a < 0, np.minimum(x, xv), np.where(a > 0, np.maximum(x, xv), x))
    bw = (a * x * x + b * x + c) * 1e9
    return np.clip(bw, lo, hi)


@dataclass(frozen=True)
class Link:
    """A resolved link: single-flow curve, aggregate curves for k concurrent flows, latency."""

    single: np.ndarray
    parallel: dict[int, np.ndarray]
    latency_s: float
    name: str

    def aggregate_curve(self, k: int) -> tuple[np.ndarray, float]:
        """(curve, divisor) for k concurrent flows from one node: a measured aggregate curve for k
        (divisor 1), else the single-flow curve, evaluated at total / k and multiplied by k
        (divisor k); ``transfer_time`` applies it."""
        if k in self.parallel:
            return self.parallel[k], 1.0
        return self.single, float(k)

    def transfer_time(self, total_bytes, k: int = 1):
        """Seconds to move ``total_bytes`` split over k concurrent flows from one node."""
        curve, div = self.aggregate_curve(k)
        if div == 1.0:
            bw = bandwidth(curve, total_bytes)
        else:
            bw = div * bandwidth(curve, np.asarray(total_bytes) / div)
        return self.latency_s + np.asarray(total_bytes) / bw


def _link(spec: LinkSpec, name: str) -> Link:
    return Link(
        single=curve_array(spec.single_curve()),
        parallel={int(k): curve_array(v) for k, v in spec.parallel.items()},
        latency_s=spec.latency_s(),
        name=name,
    )


class NetworkModel:
    """Resolves the link and the egress price between any two zones (and GPU types)."""

    def __init__(self, spec: NetworkSpec, zone_region: dict[str, str], region_geo: dict[str, str],
                 file: str | None = None, fallback=None):
        """``fallback``: where a link the scenario does not give comes from
        (``default_links.CatalogLinks``: the catalog's, by cloud, distance and GPU type); without
        one, such a link is an error."""
        self.spec = spec
        self.fallback = fallback
        self.zone_region = zone_region
        self.region_geo = region_geo
        self.file = file
        self._pairs: dict[tuple, Link] = {}
        for i, pl in enumerate(spec.links):
            for z in pl.zones:
                if z not in zone_region:
                    raise SpecError("zone not in the pool", file=file, field=f"network.links.{i}.zones",
                                    value=z, allowed=", ".join(sorted(zone_region)))
            gpus = None
            if pl.gpus:

                gpus = frozenset(catalog.gpus().canonical(g, field=f"network.links.{i}.gpus", file=file)
                                 for g in pl.gpus)
            key = (frozenset(pl.zones), gpus)
            self._pairs[key] = _link(pl, f"{pl.zones[0]}<->{pl.zones[1]}")
        self._defaults = {k: _link(v, k) for k, v in spec.defaults.items()}

        self.intra: dict[str, Link] = {
            catalog.gpus().canonical(g, field=f"network.intra_node.{g}", file=file): _link(v, g)
            for g, v in spec.intra_node.items()}
        for i, (a, b, _) in enumerate(spec.egress_usd_per_gb.pairs):
            for z in (a, b):
                if z not in zone_region:
                    raise SpecError("zone not in the pool", file=file,
                                    field=f"network.egress_usd_per_gb.pairs.{i}", value=z,
                                    allowed=", ".join(sorted(zone_region)))
        self._egress_pairs = {frozenset((a, b)): p for a, b, p in spec.egress_usd_per_gb.pairs}

    def link_class(self, za: str, zb: str) -> str:
        if za == zb:
            return "same_zone"
        if self.zone_region[za] == self.zone_region[zb]:
            return "same_region"
        return "cross_region"

    def link(self, za: str, zb: str, ga: str | None = None, gb: str | None = None) -> Link:
        zones = frozenset((za, zb))
        if ga and gb:
            hit = self._pairs.get((zones, frozenset((ga, gb))))
            if hit:
                return hit
        hit = self._pairs.get((zones, None))
        if hit:
            return hit
        cls = self.link_class(za, zb)
        if cls in self._defaults:
            return self._defaults[cls]
        if self.fallback is not None:
            return self.fallback.link(za, zb, ga, gb, cls)
        raise SpecError(
            f"no link between zones {za} and {zb}",
            file=self.file, field="network",
            allowed=f"a network.links entry with zones [{za}, {zb}] or network.defaults.{cls}",
        )

    def egress_usd_per_byte(self, za: str, zb: str) -> float:
        e = self.spec.egress_usd_per_gb
        p = self._egress_pairs.get(frozenset((za, zb)))
        if p is None:
            cls = self.link_class(za, zb)
            if cls == "cross_region":
                ga = self.region_geo.get(self.zone_region[za])
                gb = self.region_geo.get(self.zone_region[zb])
                unknown = (None, "unknown")  # build_problem tags regions of no known geo "unknown"
                p = e.cross_region if (ga == gb or ga in unknown or gb in unknown) else e.intercontinental
            else:
                p = getattr(e, cls)
        return p / 1e9
