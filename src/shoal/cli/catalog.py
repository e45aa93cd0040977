"""``shoal catalog``: the built-in GPUs, models and software stacks."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from shoal.cli.common import emit_json, handles_errors, show
from shoal.cli.helptext import examples, examples_text
from shoal.report.catalog_tables import gpus_table, models_table, stacks_table

catalog_app = typer.Typer(
    no_args_is_help=True,
    help="""The built-in GPUs, models and software stacks.

    Names a scenario uses (its model, the pool's GPU types, job.stack) come from here. Each
    command prints a table (or, with --json, one JSON object) and writes no file.""",
    epilog=examples_text("shoal catalog gpus", "shoal catalog models --json"))


@catalog_app.command("gpus")
@handles_errors
@examples("shoal catalog gpus", "shoal catalog gpus --json")
def catalog_gpus(
    as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False,
) -> None:
    """GPU types: memory, peak FLOP/s, bandwidths, node size and price."""
    from shoal import catalog

    entries = list(catalog.gpus().entries.values())
    if as_json:
        sources, notes = catalog.gpu_sources(), catalog.gpu_notes()
        emit_json({"gpus": [{**asdict(g), "source": sources.get(g.name, {}),
                             "notes": notes.get(g.name)} for g in entries]})
        return
    show(gpus_table(entries))


@catalog_app.command("models")
@handles_errors
@examples("shoal catalog models", "shoal catalog models --json")
def catalog_models(
    as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False,
) -> None:
    """Model architectures: layers, widths, vocabulary and parameter count."""
    from shoal import catalog
    from shoal.profiles.layers import checkpoint_params, layer_sizes

    rows = []
    for m in catalog.models().entries.values():
        params = float(layer_sizes(m, 2048).params.sum())
        rows.append({"name": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                     "num_heads": m.num_heads, "num_kv_heads": m.kv_heads, "ffn_hidden_size": m.ffn,
                     "vocab_size": m.vocab_size, "num_experts": m.num_experts,
                     "experts_per_token": m.experts_per_token if m.moe else None,
                     "tied_embeddings": m.tied_embeddings, "params_billions": params / 1e9,
                     "checkpoint_params_billions": checkpoint_params(m) / 1e9})
    if as_json:
        emit_json({"models": rows})
        return
    show(models_table(rows))


@catalog_app.command("stacks")
@handles_errors
@examples("shoal catalog stacks", "shoal catalog stacks --json")
def catalog_stacks(
    as_json: Annotated[bool, typer.Option("--json", help="print the stacks as JSON")] = False,
) -> None:
    """Software stacks a scenario's job.stack names: kernels, overlap and memory layout."""
    from shoal.catalog.stacks import DEFAULT_STACK, stacks

    if as_json:
        docs = [s.model_dump(mode="json", by_alias=True, exclude_none=True)
                for s in stacks().values()]
        emit_json({"default": DEFAULT_STACK, "stacks": docs})
        return
    show(stacks_table(stacks(), DEFAULT_STACK))
