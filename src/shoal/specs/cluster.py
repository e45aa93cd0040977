"""The pool: regions -> zones -> GPUs available per type, GPUs per node, quotas, prices."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from shoal.specs._types import STRICT, NonNegInt, PositiveInt


class ZoneSpec(BaseModel):
    model_config = STRICT
    gpus: dict[str, NonNegInt] = Field(default_factory=dict, description="GPU type -> count")


class RegionSpec(BaseModel):
    model_config = STRICT
    geo: str | None = Field(default=None, description="continent tag (us, eu, asia) for egress")
    zones: dict[str, ZoneSpec] = Field(min_length=1, description="at least one zone")


class PoolSpec(BaseModel):
    model_config = STRICT
    regions: dict[str, RegionSpec] = Field(min_length=1, description="at least one region")
    gpus_per_node: dict[str, PositiveInt] = Field(
        default_factory=dict, description="GPU type -> GPUs per node (default: catalog)"
    )
    quotas: dict[str, NonNegInt] = Field(
        default_factory=dict, description="GPU type -> most GPUs of that type usable in total"
    )


class PriceSpec(BaseModel):
    model_config = STRICT
    gpu_usd_per_h: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="GPU type -> USD per GPU-hour (default: catalog)"
    )
    zone_gpu_usd_per_h: dict[str, dict[str, Annotated[float, Field(ge=0)]]] = Field(
        default_factory=dict, description="zone -> GPU type -> USD per GPU-hour (wins)"
    )

    @field_validator("gpu_usd_per_h")
    @classmethod
    def _nonneg(cls, v):
        for k, p in v.items():
            if p < 0:
                raise ValueError(f"price of {k} must be >= 0, got {p}")
        return v
