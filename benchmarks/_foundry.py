"""llm-foundry's published training runs as shoal measurements (``shoal.specs.measurements``).

Reads ``../shared/reference/llm-foundry/benchmarking-README.md`` (the tables of 216 measured MPT
runs) and the model shapes in ``models/mpt-*.yaml``, in place. Each run is FSDP data parallelism
on 8-GPU nodes (NVLink inside, RoCE 8 x 200 Gbps between nodes): FULL_SHARD is ZeRO-3,
SHARD_GRAD_OP ZeRO-2; amp_bf16 is bf16 autocast over fp32 weights (shoal's mixed-bf16), PURE bf16
keeps everything in bf16 (shoal's bf16), amp_fp8 runs fp8 matrix multiplies (mixed-fp8). MPT
blocks: LayerNorm, GELU MLP of 4 x width, no dropout, flash attention; the published parameter
counts include a learned position table of the sequence length.
"""

from __future__ import annotations

import re
from pathlib import Path

GPUS = {"a100_40gb": "A100-40GB", "a100_80gb": "A100-80GB", "h100_80gb": "H100-80GB"}
PRECISION = {"amp_bf16": "mixed-bf16", "bf16": "bf16", "amp_fp8": "mixed-fp8"}
ZERO = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}
INTER_NODE = "200Gbps"  # per GPU: 1600 Gbps RoCE per 8-GPU node


def shapes(folder: Path) -> dict[str, dict]:
    out = {}
    for f in sorted((folder / "models").glob("mpt-*.yaml")):
        text = f.read_text()

        def num(key: str, text=text, f=f) -> int:
            m = re.search(rf"^\s*{key}:\s*(\d+)", text, re.M)
            if m is None:
                raise ValueError(f"{f}: no {key}")
            return int(m.group(1))

        h = num("d_model")
        out[f.stem.removeprefix("mpt-")] = {
            "num_layers": num("n_layers"), "hidden_size": h, "num_heads": num("n_heads"),
            "ffn_hidden_size": num("expansion_ratio") * h, "vocab_size": num("vocab_size"),
            "mlp": "gelu", "norm": "layernorm", "position": "learned", "dropout": 0.0}
    return out


def runs(folder: Path, *, fp8: bool = False) -> list[dict]:
    """Every published run as a measurement row (fp8 runs only with ``fp8``)."""
    shape = shapes(folder)
    out = []
    for line in (folder / "benchmarking-README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 20 or not cells[1].isdigit():
            continue
        model, seq, n, gpu, mfu = cells[0], int(cells[1]), int(cells[2]), cells[3], float(cells[4])
        mbs, gbs = int(cells[7]), int(cells[9])
        precision = PRECISION[cells[14]]
        if precision == "mixed-fp8" and not fp8:
            continue
        ckpt = cells[17] == "True"
        out.append({
            "name": f"mpt-{model} {GPUS[gpu]} x{n} seq {seq} mbs {mbs}{' rc' if ckpt else ''}",
            "group": f"mpt-{model}", **shape[model], "max_seq_len": seq,
            "gpu": GPUS[gpu], "gpus": n, "gpus_per_node": 8, "global_batch": gbs,
            "microbatch": mbs, "seq_len": seq, "precision": precision, "optimizer": "adamw",
            "zero_stage": ZERO[cells[16]], "recompute": ckpt,
            "inter_node_bandwidth": INTER_NODE, "inter_node_latency": 5e-6,
            "tokens_per_s_per_gpu": float(cells[12]), "mfu": mfu / 100.0})
    return out
