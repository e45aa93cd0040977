"""``shoal train``: run a plan on torch.distributed through torchrun; with ``--elastic``, the
workers switch plans without restarting when workers leave or join."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import _progress, emit_json, handles_errors, needs_torch, output_option, show
from shoal.cli.helptext import examples
from shoal.cli.meta import model_doc
from shoal.errors import SpecError
from shoal.report.runtime_tables import elastic_event_line, elastic_table, step_line, trained_table


@handles_errors
@examples(
    "shoal train examples/tiny-cpu.plan.json --model tiny --steps 20",
    "shoal train examples/tiny-cpu.plan.json --model tiny --steps 20 --checkpoint-dir ckpt/ "
        "--save-hf tiny-trained/",
    "shoal train examples/tiny-cpu.plan.json --model tiny --steps 40 --elastic",
)
def train(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="training plan (JSON or YAML)")],
    model: Annotated[str, typer.Option(
        "--model", help="catalog model (e.g. tiny), a HuggingFace config.json, or a folder with "
                        "config.json and *.safetensors (its weights)")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="iterations to run")],
    seq: Annotated[int | None, typer.Option(
        "--seq", min=1, help="sequence length in tokens (default: the model's, at most 128)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of weights and data")] = 0,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    data: Annotated[Path | None, typer.Option(
        "--data", help="token ids (flat uint16/uint32 binary) or text (parquet, arrow, JSONL); "
                       "default: random tokens")] = None,
    data_dtype: Annotated[str | None, typer.Option(
        "--data-dtype", help="uint16 or uint32 (default: the sidecar FILE.json's)")] = None,
    shuffle: Annotated[str, typer.Option(
        "--shuffle", metavar="on|off", help="on: random windows by (seed, step); off: consecutive")] = "on",
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="tokenizer.json for text --data")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="text --data's column")] = "text",
    device: Annotated[str | None, typer.Option(
        "--device", help="cuda (NCCL) or cpu (gloo) (default: cuda when available)")] = None,
    precision: Annotated[str, typer.Option(
        "--precision", help="fp32, or autocast bf16 or fp16 (weights in --dtype)")] = "fp32",
    save_hf: Annotated[Path | None, output_option(
        "--save-hf", help="write the trained model here as a HuggingFace folder")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option(
        "--checkpoint-dir",
        help="write checkpoints here: after the last step, and every --checkpoint-every steps")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="start from the newest checkpoint in --checkpoint-dir (any plan)")] = False,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="machines taking part")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="this machine's index")] = 0,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        "--rdzv-endpoint", help="host:port of the rendezvous (several machines)")] = None,
    elastic: Annotated[bool, typer.Option(
        "--elastic", help="kill-free reconfiguration when workers leave or join (this machine)")] = False,
    checkpoint_every: Annotated[int | None, typer.Option(
        "--checkpoint-every", min=1,
        help="a checkpoint every K steps (elastic: asynchronous); default: elastic 2, else "
             "after the last step only")] = None,
    keep: Annotated[int | None, typer.Option(
        "--keep", min=1, help="the newest K checkpoints are kept (default: elastic 2, else all)")] = None,
    fault_at: Annotated[int | None, typer.Option(
        "--fault-at", min=1, help="elastic demo: kill the last worker after this step")] = None,
    join_at: Annotated[int | None, typer.Option(
        "--join-at", min=1, help="elastic demo: add a worker after this step")] = None,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="elastic: a `shoal profile` file for the planner's estimates")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
) -> None:
    """Run a plan on torch.distributed through torchrun (gloo on CPU, NCCL on GPUs).

    With --elastic, the workers switch plans without restarting when workers leave or join.
    Writes the model only with --save-hf, checkpoints only with --checkpoint-dir. Needs PyTorch."""
    needs_torch("shoal train")
    from shoal.runtime import launch as rl
    from shoal.specs.plan import load_plan

    p = load_plan(plan_file)
    opts = rl.TrainOptions(
        model, steps, seq, seed, dtype, rl.DataOptions(
            str(data) if data else None, data_dtype, _on_off(shuffle, "--shuffle"),
            str(tokenizer) if tokenizer else None, text_column),
        device, precision, save_hf, rl.Launch(nnodes, node_rank, rdzv_endpoint, checkpoint_dir,
                                              resume, checkpoint_every, keep),
        elastic, fault_at, join_at, profile)
    with tempfile.TemporaryDirectory() as scratch:
        kind, *what = rl.prepare(p, str(plan_file), opts, Path(scratch))
        if kind == "node":
            _run_node(what, node_rank)
            return
        if kind == "elastic":
            _train_elastic(p, what[1], what[0], as_json)
            return
        doc = rl.train(what[0], opts.launch, None if as_json else _print_step)
    if as_json:
        emit_json(doc, **_run_meta(what[0], model))
        return
    _print_trained(doc, save_hf)


def _run_meta(run, model: str) -> dict:
    """The meta block's model and job of a run (``shoal.runtime.launch.Run``)."""
    return {"model": model_doc(run.arch.spec, model),
            "job": {"global_batch": run.plan.global_batch, "seq_len": run.seq,
                    "precision": run.precision}}


def _on_off(value: str, option: str) -> bool:
    if value not in ("on", "off"):
        raise SpecError("on or off", field=option, value=value, allowed="on, off")
    return value == "on"


def _run_node(what: list, node_rank: int) -> None:
    """``--elastic`` on another machine than the first: its workers, until they end."""
    from shoal.runtime.elastic_worker import run_node

    ok = run_node(*what)
    _progress().print(f"node {node_rank}: {ok} of {what[1]} workers ended")


def _print_step(d: dict) -> None:
    _progress().print(step_line(d), soft_wrap=True)


def _print_trained(doc: dict, save_hf: Path | None) -> None:
    show(trained_table(doc))
    if save_hf is not None:
        show(f"model written to {save_hf} (HuggingFace format)")


def _train_elastic(p, arch, run, as_json: bool) -> None:
    """``--elastic`` on the first machine: the controller (``shoal.runtime.elastic``)."""
    from shoal.runtime.elastic import train_elastic

    con = _progress()

    def on_event(kind: str, d: dict) -> None:
        # each step and each reconfiguration as it happens (not under --json), a line each
        con.print(elastic_event_line(kind, d), soft_wrap=True)

    if as_json:
        doc = train_elastic(p, arch, run)
    else:
        with con.status(f"training {run.steps} steps on {run.world} elastic workers"):
            doc = train_elastic(p, arch, run, on_event)
    if as_json:
        emit_json(doc, model=model_doc(arch.spec),
                  job={"global_batch": p.global_batch, "seq_len": run.seq, "precision": "fp32"})
        return
    show(elastic_table(doc), f"final loss {doc['final_loss']:.5f}")
