"""``shoal schema``: the JSON Schema or markdown reference of shoal's file formats."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from shoal.cli.choices import SchemaKind, choice_argument
from shoal.cli.common import handles_errors
from shoal.cli.helptext import examples


@handles_errors
@examples(
    "shoal schema scenario > scenario.schema.json",
    "shoal schema plan --markdown > plan-reference.md",
)
def schema(
    kind: Annotated[SchemaKind, choice_argument(
        SchemaKind, metavar="KIND", help="which file format: {choices}")] = SchemaKind.scenario,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print a markdown reference of every field instead")] = False,
) -> None:
    """Print the JSON Schema (or a markdown reference) of the scenario, training-plan or serving
    format.

    Prints on stdout and writes no file: redirect it to keep it."""
    from shoal.specs.reference import markdown_reference, roots

    if markdown:
        # nl=False: the text ends with its own newline, so the file equals markdown_reference()
        typer.echo(markdown_reference(kind.value), nl=False)
        return
    model = roots()[kind.value]
    typer.echo(json.dumps(model.model_json_schema(by_alias=True), indent=2))
