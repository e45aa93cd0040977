"""The estimator against every public measurement set shoal reads: one fidelity table.

    python benchmarks/fidelity.py [--reference DIR] [--skip-held-out]

Per set: the rows, the mean absolute time and memory errors in sample (the shipped constants)
and held out (constants fitted without the rows predicted: each run for Sailor's GH200 runs,
each model size for llm-foundry's, each GPU for Sailor's layer profiles; a set nothing was
fitted on is all held out), and for llm-foundry the MFU shoal reports next to the published
MFU and the runs predicted out of memory. Prints one JSON object.

Sets:
- Sailor's measured GH200 runs (``sailor-testbed`` stack): OPT-350M with its measured profile,
  GPT-Neo-2.7B from the OPT-350M profile (transfer), and both with the analytic profile only;
- Sailor's measured per-layer profiles (6 GPU types, 3 models): the analytic profile;
- llm-foundry's 209 BF16 FSDP runs (``fsdp`` stack), per GPU type;
- Llama-2-7B on 64 A100-80GB (FSDP, full activation recompute): the tokens/s per GPU the Llama 2
  paper's GPU-hours imply (184,320 A100-80GB hours for 2T tokens, Touvron et al. 2023, Table 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_analytic  # noqa: E402
import validate_sailor as vs  # noqa: E402
from _foundry import runs as foundry_runs  # noqa: E402
from _reference import reference_dir  # noqa: E402
from shoal.catalog.stacks import stacks  # noqa: E402
from shoal.estimate import calibrate as cal  # noqa: E402
from shoal.estimate import estimate  # noqa: E402
from shoal.problem import MemoryConstants, TimeConstants  # noqa: E402
from shoal.specs.measurements import MeasuredRun  # noqa: E402

LLAMA2_TOKENS_PER_GPU_S = 2e12 / (184_320 * 3600)  # 3,014


def _pct(x) -> float | None:
    return None if x is None else round(float(x), 2)


def sailor_sets(ref: Path, held_out: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        opt = vs.load_runs(ref, "OPT-350", "measured", work)
        neo = vs.load_runs(ref, "GPT-NEO", "transfer", work)
        opt_an = vs.load_runs(ref, "OPT-350", "analytic", work)
        neo_an = vs.load_runs(ref, "GPT-NEO", "analytic", work)
    tc, mc = TimeConstants.of(stacks()["sailor-testbed"]), MemoryConstants.of(
        stacks()["sailor-testbed"])
    out = []
    t, m = vs.predict(opt, tc, mc)
    ins = vs.summary(vs.errors(opt, t, m))
    row = {"set": "Sailor GH200 runs, OPT-350M, measured profile", "stack": "sailor-testbed",
           "rows": len(opt), "time_mape_pct": {"in_sample": ins["time_mape_pct"]},
           "memory_mape_pct": {"in_sample": ins["mem_mape_pct"]}}
    if held_out:
        t_loo, m_loo = [], []
        for i in range(len(opt)):
            train = opt[:i] + opt[i + 1:]
            tci = vs.fit_time(train, MemoryConstants())
            mci = vs.fit_memory(train, tci)
            ti, mi = vs.predict([opt[i]], tci, mci)
            t_loo.append(ti[0])
            m_loo.append(mi[0])
        loo = vs.summary(vs.errors(opt, t_loo, m_loo))
        row["time_mape_pct"]["held_out"] = loo["time_mape_pct"]
        row["memory_mape_pct"]["held_out"] = loo["mem_mape_pct"]
        row["held_out_by"] = "run (the time and memory constants fitted on the other 14)"
    out.append(row)
    for name, rs in (("Sailor GH200 runs, GPT-Neo-2.7B from the OPT-350M profile", neo),
                     ("Sailor GH200 runs, OPT-350M, analytic profile only", opt_an),
                     ("Sailor GH200 runs, GPT-Neo-2.7B, analytic profile only", neo_an)):
        t, m = vs.predict(rs, tc, mc)
        s = vs.summary(vs.errors(rs, t, m))
        out.append({"set": name, "stack": "sailor-testbed", "rows": len(rs),
                    "time_mape_pct": {"held_out": s["time_mape_pct"]},
                    "memory_mape_pct": {"held_out": s["mem_mape_pct"]},
                    "held_out_by": "set (no GPT-Neo run and no analytic-profile run is fitted on)"
                    if "analytic" in name or "GPT" in name else "set"})
    return out


def layer_profiles(ref: Path, held_out: bool) -> dict:
    rows = fit_analytic.load_targets(ref)
    fit_analytic.INTRA.update(fit_analytic.load_intra(ref))
    x = fit_analytic.fit(rows)
    r = fit_analytic.residuals(x, rows).reshape(-1, 4)
    fb = fit_analytic.block_error(r, rows)
    row = {"set": "Sailor's per-layer profiles (block forward + backward)",
           "stack": "sailor-testbed", "rows": len(rows),
           "time_mape_pct": {"in_sample": round(fit_analytic.mape(fb), 2)},
           "memory_mape_pct": None}
    if held_out:
        errs = []
        for gpu in sorted({q["gpu"] for q in rows}):
            train = [q for q in rows if q["gpu"] != gpu]
            test = [q for q in rows if q["gpu"] == gpu]
            rg = fit_analytic.residuals(fit_analytic.fit(train), test).reshape(-1, 4)
            errs += list(np.abs(np.exp(fit_analytic.block_error(rg, test)) - 1))
        row["time_mape_pct"]["held_out"] = round(float(np.mean(errs)) * 100, 2)
        row["held_out_by"] = "GPU type"
    return row


def foundry_sets(ref: Path, held_out: bool) -> list[dict]:
    runs = [MeasuredRun.model_validate(r) for r in foundry_runs(ref / "llm-foundry")]
    stack = stacks()["fsdp"]
    rows = cal.rows_for(runs, stack)
    ins = cal.errors(rows, stack)
    loo = cal.leave_group_out(rows, stack) if held_out else None
    mfu = []
    for r in rows:
        e = estimate(r.problem, r.plan)
        mfu.append(100.0 * e.mfu)
    out = []
    for gpu in ("A100-40GB", "A100-80GB", "H100-80GB"):
        idx = [i for i, r in enumerate(runs) if r.gpu == gpu]
        t_in = [abs(ins[i]["time_error_pct"]) for i in idx]
        diff = [mfu[i] - 100.0 * runs[i].mfu for i in idx]
        row = {"set": f"llm-foundry FSDP runs, {gpu}", "stack": "fsdp", "rows": len(idx),
               "time_mape_pct": {"in_sample": _pct(np.mean(t_in))},
               "memory_mape_pct": None,
               "predicted_oom": sum(ins[i]["predicted_oom"] for i in idx),
               "mfu_points": {"median_abs_difference": _pct(np.median(np.abs(diff))),
                              "median_shoal": _pct(np.median([mfu[i] for i in idx])),
                              "median_published": _pct(np.median([100 * runs[i].mfu
                                                                  for i in idx]))}}
        if loo is not None:
            row["time_mape_pct"]["held_out"] = _pct(np.mean(
                [abs(loo[i]["time_error_pct"]) for i in idx]))
            row["held_out_by"] = "model size (constants fitted on the other sizes' runs)"
        out.append(row)
    return out


def llama2() -> dict:
    """Llama-2-7B, 64 A100-80GB (8 nodes), FSDP (ZeRO-3), full activation recompute, sequence
    4096, 4M-token batches (the paper's), bf16."""
    got = {}
    for mbs in (1, 2, 4):
        run = MeasuredRun(model="LLaMA-2-7B", gpu="A100-80GB", gpus=64, global_batch=1024,
                          microbatch=mbs, seq_len=4096, precision="mixed-bf16", zero_stage=3,
                          recompute=True, inter_node_bandwidth="200Gbps",
                          tokens_per_s_per_gpu=LLAMA2_TOKENS_PER_GPU_S)
        row = cal.rows_for([run], stacks()["fsdp"])[0]
        e = estimate(row.problem, row.plan)
        got[mbs] = e.tokens_per_s / 64
    return {"set": "Llama-2-7B, 64 A100-80GB, FSDP, recompute", "stack": "fsdp",
            "published_tokens_per_s_per_gpu": round(LLAMA2_TOKENS_PER_GPU_S),
            "shoal_tokens_per_s_per_gpu": {f"mbs {k}": round(v) for k, v in got.items()},
            "error_pct": {f"mbs {k}": _pct(100 * (v / LLAMA2_TOKENS_PER_GPU_S - 1))
                          for k, v in got.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=None)
    ap.add_argument("--skip-held-out", action="store_true",
                    help="only the shipped constants (no refits)")
    args = ap.parse_args()
    ref = args.reference or reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    t0 = time.perf_counter()
    held = not args.skip_held_out
    sets = sailor_sets(ref, held) + [layer_profiles(ref, held)] + foundry_sets(ref, held)
    print(json.dumps({"sets": sets, "llama2": llama2(),
                      "seconds": round(time.perf_counter() - t0, 1)}, indent=1))


if __name__ == "__main__":
    main()
