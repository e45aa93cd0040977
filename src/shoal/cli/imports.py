"""``shoal import``: other tools' files into shoal's formats (``sailor`` here; ``helix`` with the
serving commands)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from shoal.cli.common import _err, emit_json, handles_errors, show
from shoal.cli.helptext import examples, examples_text
from shoal.errors import SpecError
from shoal.files import check_folder
from shoal.report.tables import written_table

import_app = typer.Typer(
    no_args_is_help=True,
    help="""Convert other tools' files into shoal's formats.

    Each command reads the other tool's files as they are and writes shoal's into the folder -o
    names (docs/import-sailor.md, docs/serving.md).""",
    epilog=examples_text(
        "shoal import sailor --training-config training_config_opt_350.json --network network/ "
        "--trace gpu_trace.csv -o out/",
        "shoal import helix --cluster single24.ini --machines machine_profiles.ini "
        "--capacity node_capacity.json -o out/"))


@import_app.command("sailor")
@handles_errors
@examples(
    "shoal import sailor --training-config training_config_opt_350.json --network network/ "
        "--trace gpu_trace.csv --step 0 -o out/",
    "shoal import sailor --training-config training_config_opt_350.json --profiles profiles/OPT-350 "
        "--plan plan_config.json -o out/",
)
def import_sailor_cmd(
    training_config: Annotated[Path, typer.Option("--training-config", help="Sailor training_config_*.json")],
    out_dir: Annotated[Path, typer.Option(
        "--out", "-o", metavar="DIR",
        help="the folder to write scenario.yaml (and profile.json, plan.json) into; made if "
             "missing")],
    cluster_config: Annotated[Path | None, typer.Option(
        "--cluster-config", help="Sailor cluster config (GPUs per node)")] = None,
    profiles: Annotated[Path | None, typer.Option(
        "--profiles", help="directory of <GPU>/profile.json measured profiles")] = None,
    profiles_training_config: Annotated[Path | None, typer.Option(
        "--profiles-training-config",
        help="training config of the model the --profiles were measured on, when it is another "
             "model: they are then imported as transfer profiles")] = None,
    transfer_profiles: Annotated[Path | None, typer.Option(
        "--transfer-profiles",
        help="directory of <GPU>/profile.json measured on another model, used to predict GPUs "
             "the --profiles lack")] = None,
    transfer_training_config: Annotated[Path | None, typer.Option(
        "--transfer-training-config",
        help="training config of the model the --transfer-profiles were measured on")] = None,
    network: Annotated[Path | None, typer.Option(
        "--network", help="directory of Sailor's fitted network curves")] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="availability trace CSV")] = None,
    step: Annotated[int | None, typer.Option(
        "--step", help="row of the trace to use as the pool (0-based; default 0, the first)")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="Sailor plan_config_*.json")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """Write a shoal scenario (and profile, plan) from Sailor's files.

    -o names the folder that gets scenario.yaml, profile.json with --profiles,
    transfer_profile.json with --transfer-profiles and plan.json with --plan; the pool comes from
    --plan or a --trace row. Prints what was written (or, with --json, one JSON object)."""
    from shoal.io.sailor import SailorFiles, import_sailor

    check_folder(out_dir, "--out")
    if step is not None and trace is None:
        raise SpecError("--step needs --trace", field="--step", value=step)
    if profiles_training_config is not None:  # the --profiles are of another model
        if profiles is None or transfer_profiles is not None:
            raise SpecError("--profiles-training-config goes with --profiles and without "
                            "--transfer-profiles (or use --transfer-profiles with "
                            "--transfer-training-config)", field="--profiles-training-config")
        profiles, transfer_profiles = None, profiles
        transfer_training_config = profiles_training_config
    written = import_sailor(SailorFiles(
        training_config=training_config, cluster_config=cluster_config, profiles=profiles,
        network=network, trace=trace, step=step, plan=plan,
        transfer_profiles=transfer_profiles, transfer_training_config=transfer_training_config,
    ), out_dir)
    if network is None:
        _err().print(Text("note: no --network given, so the scenario has no links; add a network "
                          "section (e.g. network.defaults.same_zone) before estimating with it"),
                     soft_wrap=True)
    if as_json:
        emit_json({"written": {k: str(v) for k, v in written.items()}})
        return
    show(written_table(written))
