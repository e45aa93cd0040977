"""The generated field reference (docs/reference/*.md) matches the code, and every field says what it
is."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from shoal.cli import app
from shoal.specs.reference import markdown_reference, model_paths, roots

ROOT = Path(__file__).resolve().parents[1]
KINDS = ["scenario", "plan", "serving"]


@pytest.mark.parametrize("kind", KINDS)
def test_committed_reference_is_current(kind):
    path = ROOT / "docs" / "reference" / f"{kind}.md"
    committed = path.read_text() if path.exists() else ""
    assert committed == markdown_reference(kind), (
        f"docs/reference/{kind}.md is out of date with the code; regenerate it with "
        f"`shoal schema {kind} --markdown > docs/reference/{kind}.md`")


def test_every_field_has_a_description():
    missing = sorted({f"{model.__module__}.{model.__name__}.{name}"
                      for root in roots().values() for model in model_paths(root)
                      for name, field in model.model_fields.items()
                      if not (field.description or "").strip()})
    assert not missing, "fields without Field(description=...): " + ", ".join(missing)


def test_reference_covers_nested_models():
    text = markdown_reference("scenario")
    for heading in ("## top level", "## `pool.regions.<region>.zones.<zone>`",
                    "## `network.defaults.<class>.wan`", "## `constraints.deadline`"):
        assert heading in text
    assert text.count("## `model`") == 2  # the two mapping forms of `model`
    assert ("| `schedule` | list of \"1f1b\" \\| \"gpipe\" \\| \"zorse\" | `[\"1f1b\", \"gpipe\"]` |"
            in text)
    assert "| `checkpoint_interval` | \"auto\" \\| time > 0 (e.g. \"50ms\") | `\"auto\"` |" in text
    assert "| `global_batch` | int > 0 | required |" in text
    assert "## `stages[].replicas[]`" in markdown_reference("plan")


@pytest.mark.parametrize("kind", KINDS)
def test_schema_markdown_option(kind):
    res = CliRunner().invoke(app, ["schema", kind, "--markdown"])
    assert res.exit_code == 0, res.output
    assert res.stdout == markdown_reference(kind)
