"""The scenario file: one YAML or JSON document describing a training problem."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from shoal.errors import SpecError, close_match
from shoal.files import read_document
from shoal.specs._types import STRICT
from shoal.specs.cluster import PoolSpec, PriceSpec
from shoal.specs.fields import field_name, nested_models
from shoal.specs.job import Constraints, JobSpec, ObjectiveSpec
from shoal.specs.model import ModelSpec
from shoal.specs.network import NetworkSpec
from shoal.specs.switching import SwitchingSpec

SCENARIO_SCHEMA = "shoal/scenario@1"


class HFModelRef(BaseModel):
    model_config = STRICT
    hf_config: str = Field(description="path to a HuggingFace config.json (relative to this file)")


class ProfilesSpec(BaseModel):
    model_config = STRICT
    compute: str = Field(
        default="analytic",
        description="'analytic', or a path to a shoal profile JSON of this model "
                    "(see `shoal import sailor`)",
    )
    transfer_from: str | None = Field(
        default=None,
        description="path to a shoal profile JSON of another model (it must record model_spec): "
                    "GPUs this model was not measured on are predicted from it",
    )


class Scenario(BaseModel):
    model_config = STRICT
    schema_: Literal["shoal/scenario@1"] = Field(default=SCENARIO_SCHEMA, alias="schema",
                                                 description="format version")
    name: str | None = Field(default=None, description="a label for reports")
    model: str | HFModelRef | ModelSpec = Field(
        description="catalog name, {hf_config: path}, or the architecture fields"
    )
    job: JobSpec = Field(description="batch, sequence, optimizer, precision and what plans may use")
    pool: PoolSpec = Field(description="the GPUs available: regions -> zones -> GPU counts")
    network: NetworkSpec = Field(default_factory=NetworkSpec,
                                 description="links between and inside nodes, egress prices")
    prices: PriceSpec = Field(default_factory=PriceSpec,
                              description="USD per GPU-hour; default: the catalog's prices")
    profiles: ProfilesSpec = Field(default_factory=ProfilesSpec,
                                   description="where per-layer compute times come from")
    objective: ObjectiveSpec = Field(
        default_factory=ObjectiveSpec,
        description="what planners optimize: a goal name, or {goal: name}")
    constraints: Constraints = Field(default_factory=Constraints,
                                     description="bounds a plan must meet (planners only)")
    switching: SwitchingSpec = Field(default_factory=SwitchingSpec,
                                     description="what a change of plan costs (`shoal replay`)")


def _model_class_names() -> set[str]:
    """Names of pydantic models: what pydantic puts in an error path for a union branch."""
    names: set[str] = set()
    todo = [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            names.add(sub.__name__)
            todo.append(sub)
    return names


def _field_path(loc) -> list[str]:
    """A pydantic error location as the file's dotted path: pydantic reports validators and
    union branches in it (e.g. 'function-after[...]', 'str', 'ModelSpec'): drop type names, but
    only those: user keys such as GPU names ('A100-40GB') also start with a capital letter."""
    path = [str(x) for x in loc
            if not str(x).startswith(("function-", "tagged-union", "literal[", "constrained-"))]
    return [x for x in path if x not in _model_class_names()
            and x not in ("str", "int", "float", "bool")]


def spec_error_from_validation(exc: ValidationError, file: str | None,
                               cls: type[BaseModel] | None = None) -> SpecError:
    """Turn pydantic's most telling error into a SpecError with a dotted field path (``cls``:
    the model validated, whose top-level names a misspelt key is matched against)."""
    errors = exc.errors()
    # a file of another kind (its schema) first, then a key the format does not have (a
    # misspelt name also leaves its field missing, which says less); of a value that may also
    # be a keyword ("auto" or a time), what is wrong with it as a value
    err = min(errors, key=lambda e: (tuple(e["loc"]) != ("schema",),
                                     e["type"] != "extra_forbidden", e["type"] == "literal_error"))
    loc = _field_path(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "finite_number":
        msg = "must be a finite number (not infinity or NaN)"
    # the keywords the field also takes ("auto"), said with the value's own error
    keywords = [e for e in errors if e is not err and e["type"] == "literal_error"
                and _field_path(e["loc"]) == loc]
    if keywords:
        msg += ", or " + " or ".join(str(e.get("ctx", {}).get("expected", "?")) for e in keywords)
        errors = [e for e in errors if e not in keywords]
    got = err.get("input")
    if tuple(err["loc"]) == ("schema",) and isinstance(got, str) and got.startswith("shoal/"):
        msg = f"a {got} document, where a {err.get('ctx', {}).get('expected', '?')} one goes"
    suggestion = None
    if err["type"] == "extra_forbidden":
        # the field of the same table the file leaves out, or any of the table's own
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing"
                   and tuple(e["loc"][:-1]) == tuple(err["loc"][:-1])]
        own = _fields_at(cls, err["loc"][:-1]) if cls is not None else []
        suggestion = close_match(str(err["loc"][-1]), missing) or close_match(
            str(err["loc"][-1]), own)
    more = len(errors) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return SpecError(msg, file=file, field=".".join(loc) or None, value=err.get("input")
                     if not isinstance(err.get("input"), dict) else None, suggestion=suggestion)


def _fields_at(cls: type[BaseModel], loc) -> list[str]:
    """The keys (aliases first) of the table at ``loc`` inside ``cls``'s documents: the path
    goes through model fields, list items (an index) and mapping values (a key), as the field
    reference walks them (``fields.nested_models``); [] where it leads to no model."""

    model, keys = cls, list(loc)
    while keys:
        key = keys.pop(0)
        field = next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)
        inner = [] if field is None else nested_models(field.annotation, "", str(key))
        if not inner:
            return []
        sub_path, model = inner[0]
        steps = sub_path.count("[]") + sub_path.count(".<")  # an index or a key each
        if len(keys) < steps:
            return []
        del keys[:steps]
    return [field_name(n, f) for n, f in model.model_fields.items()]


def validated(cls: type[BaseModel], data: dict, file: str | None = None):
    """``cls`` validated from ``data``; pydantic's first error as a SpecError naming the file."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, file, cls) from None


def parse_scenario(data: dict, *, file: str | None = None) -> Scenario:
    return validated(Scenario, data, file)


def load_scenario(path: str | Path) -> Scenario:
    return parse_scenario(read_document(path), file=str(path))
