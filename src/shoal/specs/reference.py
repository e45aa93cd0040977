"""The markdown reference of every field of shoal's input formats, generated from the pydantic models.

``shoal schema KIND --markdown`` prints it and docs/reference/KIND.md holds its output; a test
checks the two are equal, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect
import json
import types
from typing import Annotated, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, WithJsonSchema
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from shoal.specs.fields import field_name, nested_models
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import Scenario
from shoal.specs.serving import ServingSpec

TITLES = {"scenario": "The scenario format", "plan": "The training-plan format",
          "serving": "The serving file"}

def roots() -> dict[str, type[BaseModel]]:
    """The model at the top of each input format."""
    return {"scenario": Scenario, "plan": TrainingPlan, "serving": ServingSpec}


def model_paths(root: type[BaseModel]) -> dict[type[BaseModel], list[str]]:
    """Every model reachable from ``root`` -> the field paths it appears at ('' is the root), in
    the order a reader meets them (depth first, fields in declaration order)."""
    found: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel], path: str, above: frozenset) -> None:
        found.setdefault(model, []).append(path)
        for name, field in model.model_fields.items():
            fpath = f"{path}.{field_name(name, field)}" if path else field_name(name, field)
            for sub_path, sub in nested_models(field.annotation, fpath, name):
                if sub not in above:  # a model containing itself would recurse forever
                    visit(sub, sub_path, above | {sub})

    visit(root, "", frozenset({root}))
    return found


def _constraints(meta) -> list:
    """annotated-types constraints in ``meta``, with those inside a ``Field(...)`` unpacked."""
    out = []
    for m in meta:
        out.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    return out


def _scalar(base: str, meta) -> str:
    """'int > 0', 'float > 0, <= 1', 'time > 0 (e.g. "50ms")'. A field may add a bound to its
    type's (Seconds plus gt=0): pydantic checks both, so the tightest one is shown."""
    lower, upper, example = [], [], ""
    for m in _constraints(meta):
        if isinstance(m, at.Gt | at.Ge):
            strict = isinstance(m, at.Gt)
            lower.append((m.gt if strict else m.ge, strict))
        elif isinstance(m, at.Lt | at.Le):
            strict = isinstance(m, at.Lt)
            upper.append((m.lt if strict else m.le, not strict))
        elif isinstance(m, WithJsonSchema) and m.json_schema:
            # A unit type (_types.py): its schema's description starts with the quantity's name.
            base = m.json_schema["description"].split(":")[0].split(",")[0]
            example = f' (e.g. "{m.json_schema["examples"][0]}")'
    bounds = []
    if lower:
        v, strict = max(lower)
        bounds.append(f"{'>' if strict else '>='} {v}")
    if upper:
        v, loose = min(upper)
        bounds.append(f"{'<=' if loose else '<'} {v}")
    return f"{base} {', '.join(bounds)}{example}" if bounds else f"{base}{example}"


def _min_len(meta) -> str:
    n = next((m.min_length for m in _constraints(meta) if isinstance(m, at.MinLen)), 0)
    return f", at least {n}" if n else ""


def type_text(tp, meta=()) -> str:
    """A readable type: 'int > 0', 'list of "1f1b" | "gpipe"', 'map of str to RegionSpec'."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return type_text(args[0], (*args[1:], *meta))
    if origin in (Union, types.UnionType):
        # None is left out: an optional field shows 'none' as its default.
        return " | ".join(type_text(a, meta) for a in args if a is not type(None))
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}{_min_len(meta)}"
    if origin is tuple:
        return f"[{', '.join(type_text(a) for a in args)}]"
    if origin is dict:
        return f"map of {type_text(args[0])} to {type_text(args[1])}{_min_len(meta)}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.__name__
    return _scalar(getattr(tp, "__name__", str(tp)), meta)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "`{}`"  # a section left out is the section with every field at its default
    return f"`{json.dumps(to_jsonable_python(value))}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")  # one line, and '|' would end the cell


def _section(model: type[BaseModel], paths: list[str]) -> str:
    lines = [f"## `{paths[0]}`" if paths[0] else "## top level", ""]
    doc = inspect.cleandoc(model.__doc__ or "")
    about = " ".join(" ".join(p.split()) for p in doc.split("\n\n") if p.strip())
    lines += [f"`{model.__name__}`{'. ' + about if about else ''}", ""]
    if len(paths) > 1:
        lines += ["Also at " + ", ".join(f"`{p}`" for p in paths[1:]) + ".", ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        cells = [f"`{field_name(name, field)}`", type_text(field.annotation, field.metadata),
                 default_text(field), field.description or ""]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_reference(kind: str) -> str:
    """The reference of input format ``kind`` ('scenario', 'plan' or 'serving') as markdown."""
    paths = model_paths(roots()[kind])
    head = (f"# {TITLES[kind]}: every field\n\n"
            f"Generated from the code by `shoal schema {kind} --markdown`; do not edit it by hand.\n\n"
            "A size, time or bandwidth is a number in bytes, seconds or bytes/s, or a string with "
            "a unit ([units](../scenario.md#units)). Each table is one section of the file, named "
            "by its path from the top: `<...>` stands for a key you choose, `[]` for each entry "
            "of a list.\n")
    return "\n".join([head, *(_section(m, p) for m, p in paths.items())])
