"""Built-in software stacks (``shoal/catalog/stacks/*.yaml``) and stack files users write with
``shoal calibrate``: where ``job.stack`` is looked up."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from shoal.errors import SpecError, close_match
from shoal.files import read_document
from shoal.specs.scenario import validated
from shoal.specs.stack import StackSpec

DEFAULT_STACK = "megatron"


@cache
def stacks() -> dict[str, StackSpec]:
    """Name -> the built-in stack of that name."""
    out: dict[str, StackSpec] = {}
    folder = resources.files("shoal.catalog").joinpath("stacks")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        spec = StackSpec.model_validate(yaml.safe_load(entry.read_text()))
        if spec.name in out:
            raise ValueError(f"catalog stacks: {spec.name!r} defined twice")
        out[spec.name] = spec
    for name, spec in out.items():
        if spec.kernels_from is not None:
            out[name] = spec.with_kernels_of(out[spec.kernels_from])
    return out


def resolve_stack(ref: str, *, base: Path | None = None, file: str | None = None,
                  field: str = "job.stack") -> StackSpec:
    """A built-in stack by name, or a stack file (``shoal/stack@1``, path relative to
    ``base``); a SpecError naming the field otherwise."""
    known = stacks()
    if ref in known:
        return known[ref]
    p = Path(ref)
    if not p.is_absolute() and base is not None:
        p = base / p
    if p.suffix.lower() in (".yaml", ".yml", ".json") or p.exists():

        try:
            spec = validated(StackSpec, read_document(p), str(p))
        except SpecError as exc:
            raise exc.located(file=exc.file or file) from None
        if spec.kernels_from is not None:
            if spec.kernels_from not in known:
                raise SpecError("unknown stack", file=str(p), field="kernels_from",
                                value=spec.kernels_from, allowed=", ".join(sorted(known)))
            spec = spec.with_kernels_of(known[spec.kernels_from])
        return spec
    raise SpecError("unknown stack", file=file, field=field, value=ref,
                    allowed="a built-in stack (" + ", ".join(sorted(known)) + ") or the path "
                            "of a stack file `shoal calibrate` wrote",
                    suggestion=close_match(ref, known))
