"""The model as a live server runs it: a worker's range of transformer blocks, with a KV cache
per request, and the one-process greedy decoding a placement's output must equal.

Weights are those of ``shoal.runtime.model`` for the model spec and seed, so the blocks a
placement spreads over its workers are exactly those of a one-process run of the same model.
"""

from __future__ import annotations

import numpy as np
import torch

from shoal.runtime.model import KVCache, Stage
from shoal.runtime.serve.wire import DTYPES


class Shard:
    """Blocks ``[a, b)`` of the model (block indices, not the layer list) with one KV cache per
    request: the runtime's blocks (``shoal.runtime.model.Block``), which decode with a cache."""

    def __init__(self, spec, a: int, b: int, seed: int = 0, dtype_name: str = "float32"):
        self.a, self.b = a, b
        self.spec, self.dtype = spec, np.dtype(DTYPES[dtype_name])
        self.stage = Stage(spec, a + 1, b + 1, seed=seed, dtype=getattr(torch, dtype_name))
        self.stage.requires_grad_(False)
        self.cache: dict[int, list] = {}

    def step(self, rid, x: np.ndarray, at: int) -> np.ndarray:
        """Run the blocks from ``at`` (where the hidden state ``x`` stands) to the end of the
        range, with and into the request's cache."""
        cache = self.cache.setdefault(rid, [KVCache() for _ in range(self.b - self.a)])
        h = torch.from_numpy(x)
        with torch.no_grad():
            for i in range(max(at, self.a), self.b):
                h = self.stage.layers[i - self.a](h, cache[i - self.a])
        return h.numpy()


def reference_generate(spec, prompts: list[list[int]], max_new: int, seed: int = 0,
                       dtype: str = "float32") -> list[list[int]]:
    """Greedy decoding in one process, the whole sequence recomputed at every step."""
    model = Stage(spec, 0, spec.num_layers + 2, seed=seed, dtype=getattr(torch, dtype))
    model.requires_grad_(False)
    out = []
    for p in prompts:
        seq = list(p)
        with torch.no_grad():
            for _ in range(max_new):
                logits = model(torch.tensor([seq], dtype=torch.long))
                seq.append(int(logits[0, -1].argmax()))
        out.append(seq[len(p):])
    return out
