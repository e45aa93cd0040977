"""Fit the ``sailor-testbed`` stack's kernel constants to Sailor's measured per-layer profiles.

One set of constants for every GPU and model (the GEMM and memory-bandwidth efficiencies, the
kernel launch cost and the optimizer's memory passes of the software Sailor measured with), with
the measured intra-node links of the machines the profiles were taken on (Sailor's network
files, as `shoal import sailor` reads them). Per-GPU efficiencies fit these profiles closer
(22% against 36% block forward + backward in sample) but distort the balance of GEMM and memory
work between GPUs that the transfer profile's cross-GPU correction relies on (GPT-Neo-2.7B on
GH200 from the OPT-350M profile: 21% against 7% time error), so one set is kept.
Targets, per (model, GPU, microbatch size, TP): a transformer block's forward and backward time
(median over the blocks), the head's forward + backward, and the whole model's optimizer update.
Residuals are log(predicted / measured).
Prints JSON: the constants, the error per target kind, and leave-one-GPU-out error (fit on the
other GPUs, predict this one) so the numbers measure prediction, not memorisation.

    python benchmarks/fit_analytic.py [--reference ../shared/reference]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_dir  # noqa: E402
from shoal import catalog  # noqa: E402
from shoal.catalog.stacks import stacks  # noqa: E402
from shoal.profiles.analytic import AnalyticProfile  # noqa: E402
from shoal.specs.model import ModelSpec  # noqa: E402
from shoal.specs.stack import KernelEfficiency  # noqa: E402

SEQ = 2048
# Sailor's shapes: OPT-350 and GPT-Neo-2.7 from its training configs; OPT-30 from the catalog.
# LLAMA-3-8 is left out: its profile has 35 layers where the model has 34 (32 blocks, embedding,
# head) and runs about 10x slower than its FLOPs allow on GH200, so its shape or sequence length
# is not the one we would model.
MODELS = {
    "OPT-350": dict(name="OPT-350", num_layers=24, hidden_size=1024, num_heads=16, vocab_size=50272,
                    dropout=0.1),
    "GPT-Neo-2.7": dict(name="GPT-Neo-2.7", num_layers=32, hidden_size=2560, num_heads=32,
                        vocab_size=128256, head_dim=80, dropout=0.1),
    "OPT-30": "OPT-30B",
}
SHARED = ("launch_s", "optimizer_passes", "memory", "gemm")  # (the link's share: every GPU
SHARED_SCALE = np.array([1e-5, 1.0, 1.0, 1.0])  # here has its measured intra-node curve)
BASE = stacks()["sailor-testbed"]


def stack_of(x: np.ndarray):
    """The sailor-testbed stack with these constants."""
    v = dict(zip(SHARED, x * SHARED_SCALE, strict=True))
    default = BASE.kernels["default"].model_dump() | {
        k: float(v[k]) for k in ("launch_s", "memory", "gemm")}
    return BASE.model_copy(update={"kernels": {"default": KernelEfficiency(**default)},
                                   "optimizer_passes": float(v["optimizer_passes"])})


def load_targets(ref: Path):
    rows = []
    for mname, spec in MODELS.items():
        model = catalog.models().get(spec) if isinstance(spec, str) else ModelSpec(**spec)
        for f in sorted((ref / "sailor" / "profiles" / mname).glob("*/profile.json")):
            gpu = catalog.gpus().canonical(f.parent.name)
            data = json.loads(f.read_text())
            for mbs, per_tp in data.items():
                for tp, layers in per_tp.items():
                    n = len(layers)
                    t = np.array([layers[str(i)] for i in range(n)])
                    blocks = t[1:1 + model.num_layers]
                    if (t < 0).any() or t[1:1 + model.num_layers, :2].min() <= 0 or t[:, 2].sum() <= 0:
                        continue
                    rows.append(dict(model=model, mname=mname, gpu=gpu, mbs=int(mbs), tp=int(tp),
                                     fwd=float(np.median(blocks[:, 0])),
                                     bwd=float(np.median(blocks[:, 1])),
                                     head=float(t[-1, 0] + t[-1, 1]),
                                     upd=float(t[:, 2].sum())))
    return rows


INTRA: dict = {}  # GPU -> measured intra-node link of the machines the profiles came from


def load_intra(ref: Path) -> dict:
    """Sailor's measured intra-node curves, as the importer turns them into network.intra_node."""
    from shoal.io.sailor import _link
    from shoal.profiles.network import _link as make_link
    from shoal.specs.network import LinkSpec

    f = ref / "sailor" / "network" / "network_coeffs_all_homo.json"
    data = json.loads(f.read_text()).get("intra", {})
    return {catalog.gpus().canonical(g): make_link(LinkSpec(**_link(per_n, f)), g)
            for g, per_n in data.items()}


def predict(rows, stack):
    out = []
    gpus = catalog.gpus().entries
    profs = {}
    for r in rows:
        key = r["mname"]
        if key not in profs:
            profs[key] = AnalyticProfile(r["model"], SEQ, gpus, stack, intra_node=INTRA)
        t = profs[key]._compute(gpus[r["gpu"]], r["tp"], r["mbs"])
        L = r["model"].num_layers
        out.append((t[1, 0], t[1, 1], t[L + 1, 0] + t[L + 1, 1], t[:, 2].sum()))
    return np.array(out)


def residuals(x, rows):
    p = predict(rows, stack_of(x))
    m = np.array([(r["fwd"], r["bwd"], r["head"], r["upd"]) for r in rows])
    res = np.log(np.maximum(p, 1e-9) / m)
    # Sailor's GPT-Neo head entry is far below its logits' FLOPs (the projection is not timed
    # there), so heads are fitted only where the file's head time is at least one block's.
    use_head = np.array([r["head"] >= r["fwd"] + r["bwd"] for r in rows])
    res[:, 2] = np.where(use_head, res[:, 2], 0.0)
    return res.ravel()


def fit(rows):
    x0 = np.array([1.5, 2.0, 0.4, 0.3])
    lo = [0.0, 1.0, 0.02, 0.02]
    hi = [100.0, 30.0, 1.0, 1.0]
    res = least_squares(residuals, x0, args=(rows,), bounds=(lo, hi), loss="soft_l1",
                        diff_step=1e-3)
    return res.x


def block_error(r, rows) -> np.ndarray:
    """Log error of each target's block forward + backward, from ``residuals`` rows (n, 4)."""
    fwd = np.array([q["fwd"] for q in rows])
    bwd = np.array([q["bwd"] for q in rows])
    return np.log((np.exp(r[:, 0]) * fwd + np.exp(r[:, 1]) * bwd) / (fwd + bwd))


def mape(r):
    return float(np.mean(np.abs(np.exp(r) - 1)) * 100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=None)
    args = ap.parse_args()
    ref = args.reference or reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    rows = load_targets(ref)
    INTRA.update(load_intra(ref))
    x = fit(rows)
    r = residuals(x, rows).reshape(-1, 4)
    stack = stack_of(x)
    consts = {"optimizer_passes": stack.optimizer_passes,
              "kernels": {k: v.model_dump(exclude_none=True) for k, v in stack.kernels.items()}}
    kinds = ["block_fwd", "block_bwd", "head", "update"]
    per_kind = {k: round(mape(r[:, i]), 1) for i, k in enumerate(kinds)}
    per_block_fb = block_error(r, rows)
    logo = {}
    for gpu in sorted({q["gpu"] for q in rows}):
        train = [q for q in rows if q["gpu"] != gpu]
        test = [q for q in rows if q["gpu"] == gpu]
        xg = fit(train)
        rg = residuals(xg, test).reshape(-1, 4)
        fb = block_error(rg, test)
        logo[gpu] = {"n": len(test), "block_fwd_bwd_mape_pct": round(mape(fb), 1)}
    print(json.dumps({"constants": consts, "n_targets": len(rows),
                      "in_sample_mape_pct": per_kind | {"block_fwd_plus_bwd": round(mape(per_block_fb), 1)},
                      "leave_one_gpu_out": logo}, indent=1))


if __name__ == "__main__":
    main()
