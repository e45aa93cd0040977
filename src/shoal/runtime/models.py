"""``--model``: a catalog name (random weights), a HuggingFace ``config.json`` (its architecture,
random weights) or a folder with ``config.json`` and ``*.safetensors`` (its weights too)."""

from __future__ import annotations

from pathlib import Path

from shoal import catalog
from shoal.runtime.arch import Arch
from shoal.runtime.hf.config import arch_from_hf


def resolve_model(text: str, field: str = "--model") -> Arch:
    """The Arch ``--model`` names (a SpecError naming the option or file otherwise)."""
    p = Path(text)
    if p.is_dir() or p.suffix == ".json" or p.is_file():
        return arch_from_hf(p)
    return Arch.from_spec(catalog.models().get(text, field=field, route=catalog.HF_ROUTE_OPTION))
