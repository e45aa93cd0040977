"""Walking a format's fields: the names a file uses and the models nested in a field's type."""

from __future__ import annotations

import types
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

# The placeholder a dict key takes in a field path (pool.regions.<region>); other dicts get <key>.
KEY_NAMES = {"regions": "region", "zones": "zone", "machines": "machine", "defaults": "class",
             "intra_node": "gpu", "parallel": "k"}



def field_name(name: str, field: FieldInfo) -> str:
    return field.alias or name  # what the file says: 'schema', not 'schema_'


def nested_models(tp, path: str, name: str) -> list[tuple[str, type[BaseModel]]]:
    """(path, model) for each model inside the annotation ``tp`` of field ``name`` at ``path``."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return nested_models(args[0], path, name)
    if origin is dict:
        return nested_models(args[1], f"{path}.<{KEY_NAMES.get(name, 'key')}>", name)
    if origin in (list, tuple):
        return [x for a in args if a is not Ellipsis for x in nested_models(a, path + "[]", name)]
    if origin in (Union, types.UnionType):
        return [x for a in args for x in nested_models(a, path, name)]
    if origin is None and isinstance(tp, type) and issubclass(tp, BaseModel):
        return [(path, tp)]
    return []
