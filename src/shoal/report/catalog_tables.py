"""The readable tables of ``shoal catalog`` (GPUs, models, software stacks) and of ``shoal
calibrate`` (a stack fitted to measured runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.report.tables import Table
from shoal.units import fmt_bytes

if TYPE_CHECKING:
    from shoal.catalog import GPU
    from shoal.specs.stack import StackSpec


def gpus_table(entries: list[GPU]) -> Table:
    t = Table("GPUs (dense peak FLOP/s, bf16 or else fp16; $/h on demand, '-' where no public "
              "price; SMs, TF32/FP8 peaks, node network and sources: --json)",
              ["name", "memory", "16-bit\nTFLOPS", "fp32\nTFLOPS", "mem\nGB/s", "intra-node\nGB/s",
               "GPUs/\nnode", "$/h"], left=("name",), whole=("name",))
    for g in entries:
        t.add_row(
            g.name, fmt_bytes(g.memory_bytes),
            f"{g.flops_16 / 1e12:.1f}" + ("" if g.bf16 else " fp16"), f"{g.flops_32 / 1e12:.1f}",
            f"{g.mem_bw_Bps / 1e9:.0f}", f"{g.intra_node_bw_Bps / 1e9:.0f}", str(g.gpus_per_node),
            "-" if g.price_usd_per_h is None else f"{g.price_usd_per_h:.2f}",
        )
    return t


def models_table(rows: list[dict]) -> Table:
    """``shoal catalog models --json``'s rows."""
    t = Table("Models (layers = transformer blocks; experts: routed experts per block and per "
              "token; params: the estimator's, the output projection counted apart from the "
              "embedding; checkpoint: a tied embedding counted once, as model cards count)",
              ["name", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "experts",
               "params (B)", "checkpoint (B)"],
              left=("name",), whole=("name",))
    for r in rows:
        experts = (f"{r['num_experts']}, top {r['experts_per_token']}"
                   if r.get("experts_per_token") else "-")
        t.add_row(r["name"], str(r["num_layers"]), str(r["hidden_size"]), str(r["num_heads"]),
                  str(r["num_kv_heads"]), str(r["ffn_hidden_size"]), str(r["vocab_size"]), experts,
                  f"{r['params_billions']:,.2f}", f"{r['checkpoint_params_billions']:,.2f}")
    return t


def stacks_table(stacks: dict[str, StackSpec], default: str) -> Table:
    t = Table(f"Software stacks (default: {default}; kernels as shares of the datasheet "
              "peaks, by GPU architecture)",
              ["stack", "kernels", "gemm", "attn fwd", "attn bwd", "memory", "attention",
               "overlap"], left=("stack", "kernels", "attention"), whole=("stack",))
    for name, spec in stacks.items():
        for i, key in enumerate(spec.kernels):
            eff = spec.kernel_efficiency(key, key)
            t.add_row(name if i == 0 else "", key, *(f"{eff[f]:.2f}" for f in (
                "gemm", "attention_fwd", "attention_bwd", "memory")),
                spec.attention if i == 0 else "",
                f"{spec.timing.grad_reduce_overlap:g}" if i == 0 else "")
    return t


# --------------------------------------------------------------------------------------- calibrate


def kernels_table(result: dict) -> Table:
    """The fitted kernel efficiencies of ``shoal calibrate --json``'s result."""
    t = Table(f"Stack {result['stack']}: kernel efficiencies (share of the datasheet peak)",
              ["kernels", "gemm", "attention fwd", "attention bwd", "memory", "launch"],
              left=("kernels",), whole=("kernels",))
    for k, v in result["kernels"].items():
        t.add_row(k, *(f"{v[f]:.3f}" if f in v else "—" for f in
                       ("gemm", "attention_fwd", "attention_bwd", "memory")),
                  f"{v['launch_s'] * 1e6:.1f} us" if "launch_s" in v else "—")
    return t


def runs_table(result: dict) -> Table:
    """Each measured run's step time against the fitted stack's, in sample and left out."""
    rows = Table("Runs: step time, measured and predicted", ["run", "measured", "predicted",
                                                              "error", "left out"],
                 left=("run",))
    for r in result["runs"]:
        if r["measured_step_s"] is None:
            continue
        held = r["held_out_error_pct"]
        rows.add_row(r["run"], f"{r['measured_step_s']:.3f} s", f"{r['predicted_step_s']:.3f} s",
                     f"{r['time_error_pct']:+.1f}%", f"{held:+.1f}%" if held is not None else "—")
    return rows


def fit_line(result: dict) -> str:
    ins, loo = result["in_sample"], result["leave_group_out"]
    line = f"mean error {ins['time_mape_pct']:.1f}% in sample"
    if loo:
        line += f", {loo['time_mape_pct']:.1f}% with each group left out"
    return line
