"""The values of the options that take one of a few names, made from the names the layers below
register (strategies, objectives, policies, schedules, file formats, placers, routers), never
copied by hand."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from shoal.elastic.names import POLICIES
from shoal.serving import names as serving
from shoal.specs.names import FORMATS
from shoal.training.names import GEO_SCHEDULES, OBJECTIVES, STRATEGY_NAMES


def choices(name: str, values: Iterable[str]) -> type[StrEnum]:
    """An enum typer offers as ``[a|b|c]``, one member per value, in the order given."""
    return StrEnum(name, [(v.replace("-", "_"), v) for v in values])


Strategy = choices("Strategy", STRATEGY_NAMES)
Goal = choices("Goal", OBJECTIVES)
Policy = choices("Policy", (*POLICIES, "all"))  # all: every policy, compared
GeoSchedule = choices("GeoSchedule", GEO_SCHEDULES)
SchemaKind = choices("SchemaKind", FORMATS)
Placer = choices("Placer", serving.PLACERS)
Objective = choices("Objective", serving.OBJECTIVES)  # serve plan's (auto's), not plan's Goal
RouterName = choices("RouterName", serving.ROUTERS)
Mode = choices("Mode", serving.MODES)
