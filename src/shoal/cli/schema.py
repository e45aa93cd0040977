"""``shoal schema``: the JSON Schema or markdown reference of shoal's file formats."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from shoal.cli.choices import SchemaKind
from shoal.cli.common import handles_errors


@handles_errors
def schema(
    kind: Annotated[SchemaKind, typer.Argument(help="which file format")] = SchemaKind.scenario,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print a markdown reference of every field instead")] = False,
) -> None:
    """Print the JSON Schema (or a markdown reference) of the scenario, training-plan or serving
    format."""
    from shoal.specs.reference import markdown_reference, roots

    if markdown:
        # nl=False: the text ends with its own newline, so the file equals markdown_reference()
        typer.echo(markdown_reference(kind.value), nl=False)
        return
    model = roots()[kind.value]
    typer.echo(json.dumps(model.model_json_schema(by_alias=True), indent=2))
