"""The pool: regions -> zones -> GPUs available per type, GPUs per node, quotas, prices."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from shoal.specs._types import STRICT, NonNegInt, PositiveInt


class ZoneSpec(BaseModel):
    model_config = STRICT
    gpus: dict[str, NonNegInt] = Field(default_factory=dict,
                                       description="GPU type -> number available in this zone")


class RegionSpec(BaseModel):
    model_config = STRICT
    geo: str | None = Field(
        default=None, description="continent tag (us, eu, asia, ...) for egress prices; default: the "
                                  "catalog's tag for a known cloud region name, else unknown")
    zones: dict[str, ZoneSpec] = Field(
        min_length=1, description="zone name -> its GPUs; a zone name may appear in only one region")


class PoolSpec(BaseModel):
    model_config = STRICT
    regions: dict[str, RegionSpec] = Field(min_length=1, description="region name -> its zones")
    gpus_per_node: dict[str, PositiveInt] = Field(
        default_factory=dict, description="GPU type -> GPUs per node, which bounds tensor parallelism "
                                     "(default: catalog)"
    )
    quotas: dict[str, NonNegInt] = Field(
        default_factory=dict, description="GPU type -> most GPUs of that type usable in total, on top of "
                                     "per-zone availability"
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
