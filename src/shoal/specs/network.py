"""Network: bandwidth as a function of message size, latency, egress prices."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from shoal.specs._types import STRICT, BytesPerSecond, PositiveInt, Seconds


class CurveSpec(BaseModel):
    """Bandwidth for a message of n bytes.

    ``constant``: ``bandwidth`` for every size. ``poly-log2``: with ``x = log2(n / 1e6)``,
    ``a*x^2 + b*x + c`` GB/s (Sailor's fitted form), clamped to ``[floor, max]``.
    """

    model_config = STRICT
    kind: Literal["constant", "poly-log2"] = Field(
        default="constant", description="constant: one bandwidth for every message size; "
                                        "poly-log2: Sailor's fitted quadratic in log2(size)")
    bandwidth: BytesPerSecond | None = Field(
        default=None, description="the bandwidth of a constant curve (needed by it)")
    coeffs: tuple[float, float, float] | None = Field(
        default=None, description="[a, b, c] of a poly-log2 curve (needed by it): `a*x^2 + b*x + c` "
                                  "GB/s with `x = log2(bytes / 1e6)`")
    max: BytesPerSecond | None = Field(
        default=None, description="cap of a poly-log2 curve; default: its value at the vertex")
    floor: BytesPerSecond | None = Field(
        default=None, description="floor of a poly-log2 curve; default: 2% of max")

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "constant" and self.bandwidth is None:
            raise ValueError("a constant curve needs 'bandwidth'")
        if self.kind == "poly-log2" and self.coeffs is None:
            raise ValueError("a poly-log2 curve needs 'coeffs' [a, b, c]")
        return self


# One TCP connection over a WAN is window-limited: Atlas (seed 003) Table 1 measures 1220, 600, 396
# and 293 Mbit/s at 10, 20, 30 and 40 ms one-way latency, a bandwidth x latency product (the
# window) of 12,200 to 11,720 Mbit/s x ms. We interpolate the window linearly in latency between
# the measured points and hold the end values outside them: bandwidth = window / latency.
WAN_TABLE1 = ((0.010, 1220e6), (0.020, 600e6), (0.030, 396e6), (0.040, 293e6))  # s, bit/s


def wan_window_bits(latency_s: float) -> float:
    pts = [(lat, bw * lat) for lat, bw in WAN_TABLE1]
    if latency_s <= pts[0][0]:
        return pts[0][1]
    for (l0, w0), (l1, w1) in zip(pts, pts[1:]):
        if latency_s <= l1:
            return w0 + (w1 - w0) * (latency_s - l0) / (l1 - l0)
    return pts[-1][1]

# Many connections add up until the provider's per-node-pair limit: 5 Gbit/s on Azure and AWS
# whatever the distance (Atlas Fig. 5 and §4.1).
WAN_PAIR_CAP_BPS = 5e9 / 8


class WanSpec(BaseModel):
    """A wide-area link between datacenters: each TCP connection gets window / latency, several
    connections add up to the per-node-pair cap (Atlas §4.1)."""

    model_config = STRICT
    latency: Seconds = Field(description="one-way latency")
    connections: PositiveInt | Literal["auto"] = Field(
        default="auto",
        description="TCP connections per node pair; 'auto' opens enough to reach pair_cap "
                    "(PyTorch's default is 1)")
    per_connection: BytesPerSecond | None = Field(
        default=None,
        description="measured bandwidth of one connection; default: window / latency, the "
                    "window from Atlas Table 1 (about 12,000 Mbit/s x ms)")
    pair_cap: BytesPerSecond = Field(default=WAN_PAIR_CAP_BPS,
                                     description="aggregate limit per node pair (default 5Gbps)")

    @model_validator(mode="after")
    def _check(self):
        if self.per_connection is None and self.latency <= 0:
            raise ValueError("a WAN link needs a latency > 0 (or 'per_connection')")
        return self

    def one_connection(self) -> float:
        """Bytes/s of a single TCP connection."""
        if self.per_connection is not None:
            return float(self.per_connection)
        return min(self.pair_cap, wan_window_bits(self.latency) / self.latency / 8)

    def n_connections(self) -> int:
        if self.connections == "auto":
            return max(1, math.ceil(self.pair_cap / self.one_connection() - 1e-9))
        return int(self.connections)

    def bandwidth(self) -> float:
        """Bytes/s one node pair moves with its connections."""
        return min(float(self.pair_cap), self.n_connections() * self.one_connection())


class LinkSpec(BaseModel):
    """One link: a single GPU-to-GPU flow between nodes, optionally per GPU type pair.

    ``parallel`` gives the aggregate curve when k GPUs of one node send at once (k -> curve);
    without it, k flows get k times the single-flow bandwidth. ``wan`` describes a wide-area link
    instead of a bandwidth: its bandwidth follows from latency and connections, and its latency is
    the link's.
    """

    model_config = STRICT
    bandwidth: BytesPerSecond | None = Field(
        default=None, description="constant bandwidth of one GPU-to-GPU flow (a shorthand for a "
                                  "constant curve); give one of bandwidth, curve and wan")
    curve: CurveSpec | None = Field(
        default=None, description="bandwidth of one flow as a function of the message size")
    parallel: dict[PositiveInt, CurveSpec] = Field(
        default_factory=dict, description="k -> aggregate curve when k GPUs of one node send at "
                                          "once; without k, k flows get k times one flow's")
    latency: Seconds = Field(default=0.0, description="per-message latency")
    wan: WanSpec | None = Field(
        default=None, description="a wide-area link between datacenters, instead of bandwidth or "
                                  "curve; its latency is the link's")

    @model_validator(mode="after")
    def _check(self):
        n = sum(x is not None for x in (self.bandwidth, self.curve, self.wan))
        if n == 0:
            raise ValueError("a link needs 'bandwidth', 'curve' or 'wan'")
        if n > 1:
            raise ValueError("give only one of 'bandwidth', 'curve' and 'wan'")
        if self.wan is not None and self.latency and self.latency != self.wan.latency:
            raise ValueError("a WAN link's latency is 'wan.latency'; do not also give 'latency'")
        return self

    def single_curve(self) -> CurveSpec:
        if self.wan is not None:
            return CurveSpec(kind="constant", bandwidth=self.wan.bandwidth())
        return self.curve or CurveSpec(kind="constant", bandwidth=self.bandwidth)

    def latency_s(self) -> float:
        return float(self.wan.latency if self.wan is not None else self.latency)


class PairLink(LinkSpec):
    zones: tuple[str, str] = Field(description="the two zones it joins (either order; twice the "
                                               "same zone for links inside a zone)")
    gpus: tuple[str, str] | None = Field(default=None,
                                         description="only for these GPU types (either order)")


class EgressSpec(BaseModel):
    model_config = STRICT
    same_zone: float = Field(default=0.0, ge=0, description="USD per GB sent inside one zone")
    same_region: float = Field(default=0.01, ge=0,
                               description="USD per GB between two zones of one region")
    cross_region: float = Field(default=0.02, ge=0, description="USD per GB between two regions "
                                "with the same geo (or either unknown)")
    intercontinental: float = Field(default=0.05, ge=0, description="USD per GB between two "
                                    "regions whose geo tags differ")
    pairs: list[tuple[str, str, Annotated[float, Field(ge=0)]]] = Field(
        default_factory=list, description="[zone_a, zone_b, USD per GB] for one zone pair (either order), "
                                         "over the class prices"
    )


LinkClass = Literal["same_zone", "same_region", "cross_region"]


class NetworkSpec(BaseModel):
    model_config = STRICT
    defaults: dict[LinkClass, LinkSpec] = Field(
        default_factory=dict, description="link per class: same_zone, same_region, cross_region; "
                                          "a class not given: the catalog's link for the cloud, "
                                          "the zones' distance and the GPU types"
    )
    links: list[PairLink] = Field(
        default_factory=list,
        description="links per zone pair, optionally per GPU-type pair; they win over defaults")
    # a pair of zones neither gives a link for takes the catalog's (clouds.yaml ``network``)
    intra_node: dict[str, LinkSpec] = Field(
        default_factory=dict,
        description="GPU type -> link inside a node (TP traffic); default: catalog",
    )
    egress_usd_per_gb: EgressSpec = Field(
        default_factory=EgressSpec, description="USD per GB a plan sends from one zone to another")
    cloud: str | None = Field(
        default=None, description="the cloud (gcp, azure, ...) whose catalog links stand in for "
                                  "links not given between zones the catalog does not list "
                                  "(a catalog zone is in its own cloud)")
