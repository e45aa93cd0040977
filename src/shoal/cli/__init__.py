"""The command line (DESIGN §6): readable tables by default, the stable JSON contract with ``--json``.

Planning and estimating live elsewhere; each module here reads one group of commands' arguments,
calls the layers below and prints. Errors a person can act on (``ShoalError``) are printed without
a traceback: exit 2 for bad input, 3 when nothing is feasible.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from shoal.cli import (
    bubbles,
    calibrate,
    catalog,
    estimate,
    helptext,
    imports,
    meta,
    plan,
    profile,
    replay,
    report,
    schema,
    serve,
    train,
)
from shoal.cli.common import handles_errors
from shoal.cli.meta import version

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="""Plan LLM training and serving on mixed, scattered GPU pools.

    Every command prints tables, or one JSON object with --json (`shoal report` draws those);
    -o always names the file (or folder) that is the command's result. `shoal COMMAND --help`
    gives a command's options and examples.""",
                  epilog=helptext.examples_text(
                      "shoal plan examples/opt350m-two-zones.yaml",
                      "shoal estimate examples/het-a100-v100.yaml "
                      "--plan examples/het-a100-v100.plan.json",
                      "shoal serve plan examples/llama2-70b-mixed.serving.yaml -o placement.json",
                      "shoal catalog gpus"))


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"shoal {version()}")
        raise typer.Exit()


@app.callback()
def _root(show_version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="print shoal's version and exit")] = False) -> None:
    pass


app.add_typer(imports.import_app, name="import")
app.add_typer(catalog.catalog_app, name="catalog")
for command in (estimate.estimate, plan.plan, replay.replay, schema.schema, train.train,
                profile.profile):
    app.command()(command)
app.add_typer(serve.serve_app, name="serve")
imports.import_app.command("helix")(handles_errors(serve.import_helix_cmd))
app.command()(report.report)
app.command("bubbles")(bubbles.bubbles_cmd)
app.command("calibrate")(calibrate.calibrate_cmd)
helptext.finish(app)  # every command's help: its purpose, options and examples


def main() -> None:
    """The ``shoal`` command. A command-line usage error (an unknown option, a value out of
    range) exits 2 as the others do; under ``--json`` it is also printed as the one JSON object
    on stdout (``{"error": {"message", "exit_code"}}``), as every other error is."""
    meta.ARGV = sys.argv[1:]  # the command line a result's meta block names
    try:
        _run()
    finally:
        meta.ARGV = None


def _run() -> None:
    try:
        rv = app(standalone_mode=False)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except Exception as exc:
        if not all(hasattr(exc, a) for a in ("format_message", "exit_code", "show")):
            raise  # not a usage error (click's ClickException, whichever click typer uses)
        if "--json" in sys.argv[1:]:
            typer.echo(json.dumps({"error": {"message": exc.format_message(),
                                             "exit_code": exc.exit_code}}))
        try:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
        except Exception:  # typer without rich: click's plain message
            exc.show()
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
