"""Read a HuggingFace ``config.json`` into a ModelSpec: the reader lives in ``shoal.specs.hf`` (a
spec, read by the layers below ``io`` too); this name stays for the callers that import it here."""

from shoal.specs.hf import ROTARY_FAMILIES, model_from_hf_config

__all__ = ["ROTARY_FAMILIES", "model_from_hf_config"]
