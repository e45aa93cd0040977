"""Pydantic field types that read human units (DESIGN §4) into SI base units."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema

from shoal import units


def _wrap(fn):
    def parse(v):
        try:
            return fn(v)
        except units.UnitError as exc:
            raise ValueError(str(exc)) from None

    return parse


def _unit_schema(example: str, desc: str) -> WithJsonSchema:
    return WithJsonSchema(
        {"anyOf": [{"type": "number"}, {"type": "string"}], "description": desc, "examples": [example]}
    )


Bytes = Annotated[
    float, BeforeValidator(_wrap(units.parse_bytes)), Field(ge=0),
    _unit_schema("40GB", "size: bytes, or a string with B/kB/MB/GB/TB or KiB/MiB/GiB/TiB"),
]
Seconds = Annotated[
    float, BeforeValidator(_wrap(units.parse_seconds)), Field(ge=0),
    _unit_schema("50ms", "time: seconds, or a string with ns/us/ms/s/min/h/d"),
]
BytesPerSecond = Annotated[
    float, BeforeValidator(_wrap(units.parse_bandwidth)), Field(gt=0),
    _unit_schema("10Gbps", "bandwidth: bytes/s, or a string: Gbps/Mbps (bits) or GB/s, MB/s (bytes)"),
]
FlopsPerSecond = Annotated[
    float, BeforeValidator(_wrap(units.parse_flops)), Field(gt=0),
    _unit_schema("312TFLOPS", "FLOP/s, or a string with GFLOPS/TFLOPS/PFLOPS"),
]


def _whole(v):
    """A count as written: true/false and text are refused (pydantic would read them as 1/0 and
    as the number they spell)."""
    if isinstance(v, bool | str):
        raise ValueError(f"expected a whole number, not {'true or false' if isinstance(v, bool) else 'text'}")
    return v


def _flag(v):
    """A yes/no as written: true or false only (pydantic would also read 'yes', 1, 'off')."""
    if not isinstance(v, bool | np.bool_):
        raise ValueError("expected true or false")
    return bool(v)


PositiveInt = Annotated[int, BeforeValidator(_whole), Field(gt=0)]
NonNegInt = Annotated[int, BeforeValidator(_whole), Field(ge=0)]
Flag = Annotated[bool, BeforeValidator(_flag)]

# allow_inf_nan: YAML reads .inf and .nan as numbers, and an infinite price or bandwidth would
# pass every bound (ge=0) and then turn sums into inf and nan far from the file
STRICT = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


def one_or_list(schema: dict) -> None:
    """JSON Schema of a list field that also takes one value (its validator makes the list):
    a field's ``json_schema_extra``."""
    array = {k: schema.pop(k) for k in ("type", "items") if k in schema}
    schema["anyOf"] = [array["items"], array]
