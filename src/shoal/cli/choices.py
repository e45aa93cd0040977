"""The values of the options that take one of a few names, made from the names the layers below
register (strategies, objectives, policies, schedules, file formats, placers, routers), never
copied by hand; and how the help lists them."""

from __future__ import annotations

import typing
from collections.abc import Iterable
from enum import StrEnum

import typer

from shoal.elastic.names import POLICIES
from shoal.serving import names as serving
from shoal.specs.names import FORMATS
from shoal.training.names import GEO_SCHEDULES, OBJECTIVES, STRATEGY_NAMES


def choices(name: str, values: Iterable[str]) -> type[StrEnum]:
    """An enum typer takes by its values, one member per value, in the order given."""
    return StrEnum(name, [(v.replace("-", "_"), v) for v in values])


def listed(kind: type[StrEnum], help: str) -> str:
    """``help`` with ``{choices}`` replaced by the names ``kind`` takes, comma-separated: in the
    help text a narrow terminal folds between names (typer's ``<a|b|c>`` value column folds
    inside one)."""
    return help.format(choices=", ".join(k.value for k in kind))


def choice_option(kind: type[StrEnum], *names: str, help: str, metavar: str = "NAME",
                  **kw: typing.Any) -> typing.Any:
    """A typer option taking one of ``kind``'s names, shown as ``NAME`` with the names in its
    help (``listed``)."""
    return typer.Option(*names, metavar=metavar, help=listed(kind, help), **kw)


def choice_argument(kind: type[StrEnum], *, help: str, metavar: str, **kw: typing.Any) -> typing.Any:
    """A typer argument taking one of ``kind``'s names, as ``choice_option``."""
    return typer.Argument(metavar=metavar, help=listed(kind, help), **kw)


Strategy = choices("Strategy", STRATEGY_NAMES)
Goal = choices("Goal", OBJECTIVES)
Policy = choices("Policy", (*POLICIES, "all"))  # all: every policy, compared
GeoSchedule = choices("GeoSchedule", GEO_SCHEDULES)
SchemaKind = choices("SchemaKind", FORMATS)
Placer = choices("Placer", serving.PLACERS)
Objective = choices("Objective", serving.OBJECTIVES)  # serve plan's (auto's), not plan's Goal
RouterName = choices("RouterName", serving.ROUTERS)
Mode = choices("Mode", serving.MODES)
