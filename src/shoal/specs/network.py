"""Network: bandwidth as a function of message size, latency, egress prices."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from shoal.specs._types import STRICT, BytesPerSecond, PositiveInt, Seconds


class CurveSpec(BaseModel):
    """Bandwidth for a message of n bytes.

    ``constant``: ``bandwidth`` for every size. ``poly-log2``: with ``x = log2(n / 1e6)``,
    ``a*x^2 + b*x + c`` GB/s (Sailor's fitted form), clamped to ``[floor, max]``.
    """

    model_config = STRICT
    kind: Literal["constant", "poly-log2"] = "constant"
    bandwidth: BytesPerSecond | None = None
    coeffs: tuple[float, float, float] | None = None
    max: BytesPerSecond | None = None
    floor: BytesPerSecond | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "constant" and self.bandwidth is None:
            raise ValueError("a constant curve needs 'bandwidth'")
        if self.kind == "poly-log2" and self.coeffs is None:
            raise ValueError("a poly-log2 curve needs 'coeffs' [a, b, c]")
        return self


class LinkSpec(BaseModel):
    """One link: a single GPU-to-GPU flow between nodes, optionally per GPU type pair.

    ``parallel`` gives the aggregate curve when k GPUs of one node send at once (k -> curve);
    without it, k flows get k times the single-flow bandwidth.
    """

    model_config = STRICT
    bandwidth: BytesPerSecond | None = None
    curve: CurveSpec | None = None
    parallel: dict[PositiveInt, CurveSpec] = Field(default_factory=dict)
    latency: Seconds = 0.0

    @model_validator(mode="after")
    def _check(self):
        if self.bandwidth is None and self.curve is None:
            raise ValueError("a link needs 'bandwidth' or 'curve'")
        return self

    def single_curve(self) -> CurveSpec:
        return self.curve or CurveSpec(kind="constant", bandwidth=self.bandwidth)


class PairLink(LinkSpec):
    zones: tuple[str, str]
    gpus: tuple[str, str] | None = Field(default=None, description="only for these GPU types")


class EgressSpec(BaseModel):
    model_config = STRICT
    same_zone: float = Field(default=0.0, ge=0)
    same_region: float = Field(default=0.01, ge=0)
    cross_region: float = Field(default=0.02, ge=0)
    intercontinental: float = Field(default=0.05, ge=0)
    pairs: list[tuple[str, str, Annotated[float, Field(ge=0)]]] = Field(
        default_factory=list, description="[zone_a, zone_b, USD/GB] overrides"
    )


LinkClass = Literal["same_zone", "same_region", "cross_region"]


class NetworkSpec(BaseModel):
    model_config = STRICT
    defaults: dict[LinkClass, LinkSpec] = Field(
        default_factory=dict, description="link per class: same_zone, same_region, cross_region"
    )
    links: list[PairLink] = Field(default_factory=list, description="per zone-pair overrides")
    intra_node: dict[str, LinkSpec] = Field(
        default_factory=dict,
        description="GPU type -> link inside a node (TP traffic); default: catalog",
    )
    egress_usd_per_gb: EgressSpec = Field(default_factory=EgressSpec)
